"""Decoding image files fast: timm's transforms keep their steps, with a faster first step (a reduced JPEG
decode, torch's uint8 resize) and a fused to-tensor/normalize."""
from __future__ import annotations

import functools
import logging
import random
import struct
import zlib
from collections.abc import Sequence

import numpy as np
import torch
import torchvision.transforms.functional as TF
import torchvision.transforms.v2.functional as F2
from PIL import Image
from timm.data.transforms import MaybeToTensor, RandomResizedCropAndInterpolation
from torchvision import transforms
from torchvision.transforms import InterpolationMode

try:  # optional: libjpeg-turbo (bundled in its wheel) decoding straight into a numpy array, DCT-scaled
    import simplejpeg
except ImportError:
    simplejpeg = None

logger = logging.getLogger("runner")

# Errors that mean "this file cannot be decoded"; anything else is a bug and propagates.
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error,
                 Image.DecompressionBombError)

# A JPEG is decoded reduced only down to twice the size the resize needs (as PIL's thumbnail does): reducing
# further loses detail (libjpeg's scaled decode upsamples chroma coarsely), measured in docs/PERFORMANCE.md
DRAFT_GAP = 2.0
# torch's antialiased uint8 resize matches PIL's within one level for these; it pays for its two copies
# (PIL -> tensor -> PIL) only on large regions, so smaller ones stay with PIL's resize (crossover measured)
TORCH_RESIZE_MIN_PIXELS = 300 * 300
TENSOR_INTERP = {InterpolationMode.BILINEAR, InterpolationMode.BICUBIC, InterpolationMode.NEAREST,
                 InterpolationMode.NEAREST_EXACT}
# simplejpeg decodes a 640x427 photo about twice as fast as PIL's decode plus its copy to numpy, but on small
# JPEGs (224x224 digits) its per-call cost and the copy back into PIL cancel that (docs/PERFORMANCE.md)
JPEG_LIB_MIN_PIXELS = 300 * 300
# (file's mode, wanted mode) -> simplejpeg's colorspace; other JPEGs (CMYK, YCCK, RGB to L) go through PIL
JPEG_COLORSPACE = {("RGB", "RGB"): "RGB", ("L", "RGB"): "RGB", ("L", "L"): "GRAY"}


def to_mode(img: Image.Image, mode: str = "RGB") -> Image.Image:
    """Decode `img` and convert it to `mode` only when it is not already in it (a convert always copies)."""
    if img.mode == mode:
        img.load()
        return img
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit or float grayscale: scale to 8 bits
        arr = np.asarray(img, dtype=np.float32)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        img = Image.fromarray(np.clip(arr * (255.0 / top), 0, 255).astype(np.uint8), "L")
    elif img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # PIL asks for this step for palette images with transparency
    return img.convert(mode)


def dct_factor(max_factor: float) -> int:
    """The largest DCT scale-down (8, 4, 2 or 1) that keeps DRAFT_GAP times the size a `max_factor` resize needs."""
    return next(s for s in (8, 4, 2, 1) if s <= max(max_factor / DRAFT_GAP, 1.0))


def draft(img: Image.Image, mode: str, max_factor: float) -> tuple[Image.Image, int]:
    """Decode `img` in `mode`; a JPEG at the largest DCT scale-down (1/2, 1/4, 1/8) not above `max_factor`.

    Returns the decoded image and the scale-down factor used (1 for other formats or when nothing fits).
    """
    factor = dct_factor(max_factor)
    if factor > 1 and img.format == "JPEG":
        img.draft(mode, (img.width // factor, img.height // factor))  # libjpeg then picks exactly `factor`
    else:
        factor = 1
    return to_mode(img, mode), factor


def jpeg_array(img: Image.Image, mode: str, max_factor: float) -> tuple[np.ndarray, int] | None:
    """The JPEG `img` decoded by simplejpeg into an HxWxC uint8 array at draft()'s DCT scale-down (same pixels),
    and that factor; None when simplejpeg is missing, the file is no RGB/L JPEG, is small, or simplejpeg rejects it."""
    colorspace = JPEG_COLORSPACE.get((img.mode, mode))
    if simplejpeg is None or img.format != "JPEG" or colorspace is None or img.width * img.height < JPEG_LIB_MIN_PIXELS:
        return None
    s = dct_factor(max_factor)
    img.fp.seek(0)
    data = img.fp.read()
    try:  # min sizes and min_factor together allow exactly 1/s: the size libjpeg gives draft() (ceil(side / s))
        arr = simplejpeg.decode_jpeg(data, colorspace, min_height=-(-img.height // s),
                                     min_width=-(-img.width // s), min_factor=s)
    except ValueError:  # simplejpeg is strict (a truncated file): PIL decides, leniently or with its own error
        return None
    img.close()  # the file is read: release it now, as PIL's load() does
    return arr, s


def chw_uint8(img: Image.Image | np.ndarray) -> torch.Tensor:
    """A decoded PIL image (or HxW(xC) uint8 array) as a uint8 CHW tensor in channels-last memory (what torch's
    fast resize wants)."""
    arr = img if isinstance(img, np.ndarray) else np.array(img, dtype=np.uint8)
    return torch.from_numpy(arr[:, :, None] if arr.ndim == 2 else arr).permute(2, 0, 1)


def to_pil(t: torch.Tensor, mode: str) -> Image.Image:
    """A uint8 CHW tensor back to a PIL image, for timm's PIL-only steps (flip, color jitter, RandAugment)."""
    arr = t.permute(1, 2, 0).contiguous().numpy()
    return Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode)


class FastRandomResizedCrop(RandomResizedCropAndInterpolation):
    """timm's random resized crop, with the crop picked on the JPEG header, the JPEG decoded at the
    smallest DCT scale that keeps the crop at least as large as the output, and torch resizing the uint8."""

    def __init__(self, base: RandomResizedCropAndInterpolation, mode: str = "RGB",
                 tensor_resize: bool = True, jpeg_lib: bool = True, as_tensor: bool = False):
        self.size, self.scale, self.ratio = base.size, base.scale, base.ratio
        self.interpolation, self.mode, self.tensor_resize = base.interpolation, mode, tensor_resize
        self.jpeg_lib = jpeg_lib  # decode JPEGs with simplejpeg when it is installed (False: PIL only)
        self.as_tensor = as_tensor  # give a uint8 CHW tensor (the steps after it take tensors), not a PIL image

    def __call__(self, img: Image.Image) -> Image.Image | torch.Tensor:
        """Crop and resize `img` (opened, not yet decoded) to self.size: a PIL image, or with as_tensor a uint8 CHW
        tensor."""
        top, left, h, w = self.get_params(img, self.scale, self.ratio)
        out_h, out_w = self.size
        interp = self.interpolation
        if isinstance(interp, (tuple, list)):
            interp = random.choice(interp)
        max_factor = min(w / out_w, h / out_h)
        decoded = jpeg_array(img, self.mode, max_factor) if self.jpeg_lib else None
        pixels, s = decoded if decoded is not None else draft(img, self.mode, max_factor)
        if self.use_torch(interp, w * h, s, isinstance(pixels, np.ndarray)):
            y0, x0 = top // s, left // s
            crop = chw_uint8(pixels)[:, y0:max(y0 + 1, (top + h) // s), x0:max(x0 + 1, (left + w) // s)]
            out = F2.resize(crop, [out_h, out_w], interp, antialias=True)
            return out if self.as_tensor else to_pil(out, self.mode)
        out = self.pil_resize(pixels, s, (top, left, h, w), interp)
        return chw_uint8(out) if self.as_tensor else out

    def use_torch(self, interp: InterpolationMode, pixels: int, s: int, array: bool) -> bool:
        """Whether torch resizes this crop (`pixels` in the full image, decoded at 1/s into a numpy `array` or a
        PIL image) rather than PIL."""
        if not (self.tensor_resize and interp in TENSOR_INTERP):
            return False  # torch has no antialiased Lanczos, box or Hamming: PIL resizes those
        # a tensor out needs no copy back to PIL, and an array no copy out of it; at full scale the crop's box is
        # whole pixels, as torch's slicing takes it (PIL keeps a reduced decode's fractional box exactly)
        return (self.as_tensor and array and s == 1) or pixels >= TORCH_RESIZE_MIN_PIXELS * s * s

    def pil_resize(self, pixels: Image.Image | np.ndarray, s: int, crop: tuple[int, int, int, int],
                   interp: InterpolationMode) -> Image.Image:
        """PIL's resize of the crop (top, left, h, w in full-size pixels) of `pixels`, decoded at 1/s."""
        top, left, h, w = crop
        size, resample = (self.size[1], self.size[0]), TF.pil_modes_mapping[interp]
        if isinstance(pixels, Image.Image):
            return pixels.resize(size, resample, box=(left / s, top / s, (left + w) / s, (top + h) / s))
        # an array: copy only the rows and columns the (fractional) box touches, not the whole image
        y0, x0 = int(top / s), int(left / s)
        y1, x1 = -(-(top + h) // s), -(-(left + w) // s)
        sub = np.ascontiguousarray(pixels[y0:y1, x0:x1, 0] if self.mode == "L" else pixels[y0:y1, x0:x1])
        box = (left / s - x0, top / s - y0, (left + w) / s - x0, (top + h) / s - y0)
        return Image.fromarray(sub, self.mode).resize(size, resample, box=box)


class FastResize:
    """Replaces the eval Resize: decodes a JPEG at the smallest DCT scale that keeps it at least the
    target size, then resizes with torch on uint8; gives a uint8 CHW tensor (CenterCrop and
    ToNormalizedTensor take it)."""

    def __init__(self, base: transforms.Resize, mode: str = "RGB", tensor_resize: bool = True):
        self.size, self.max_size, self.interpolation = base.size, base.max_size, base.interpolation
        self.mode, self.tensor_resize = mode, tensor_resize
        self.min_wh = (self.size, self.size) if isinstance(self.size, int) else (self.size[-1], self.size[0])

    def __call__(self, img: Image.Image) -> torch.Tensor | Image.Image:
        """Decode (reduced when possible) and resize `img`, opened but not yet decoded."""
        img, _ = draft(img, self.mode, min(img.width / self.min_wh[0], img.height / self.min_wh[1]))
        use_torch = self.interpolation in TENSOR_INTERP and img.width * img.height >= TORCH_RESIZE_MIN_PIXELS
        if not (self.tensor_resize and use_torch):
            return TF.resize(img, self.size, self.interpolation, self.max_size)
        size = [self.size] if isinstance(self.size, int) else list(self.size)
        return F2.resize(chw_uint8(img), size, self.interpolation, self.max_size, antialias=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, interpolation={self.interpolation.value})"


class DecodeMode:
    """First step when nothing faster applies: decode and convert to `mode` only if needed."""

    def __init__(self, mode: str = "RGB"):
        self.mode = mode

    def __call__(self, img: Image.Image) -> Image.Image:
        """Decode `img` in self.mode."""
        return to_mode(img, self.mode)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mode={self.mode})"


class FastColorJitter:
    """torchvision's ColorJitter without hue (timm's default train jitter) on a uint8 CHW tensor, in one float pass:
    the same draws and order, and PIL's arithmetic (grayscale weights, rounded contrast mean, each step clipped
    and truncated to a level), so it gives timm's PIL pixels but for a rare level. Returns float levels 0-255."""

    def __init__(self, base: transforms.ColorJitter):
        self.base = base
        self.gray_weights = torch.tensor([[0.299, 0.587, 0.114]])

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """Jitter the uint8 CHW tensor `t` (1 or 3 channels)."""
        b = self.base
        order, brightness, contrast, saturation, _ = b.get_params(b.brightness, b.contrast, b.saturation, None)
        x = t.to(torch.float32, memory_format=torch.contiguous_format)
        for k in order.tolist():
            if k == 0 and brightness is not None:
                x.mul_(brightness).clamp_(max=255.0).floor_()
            elif k == 1 and contrast is not None:
                mean = float(torch.floor(self.gray(x).mean() + 0.5))
                x.sub_(mean).mul_(contrast).add_(mean).clamp_(0.0, 255.0).floor_()
            elif k == 2 and saturation is not None and x.shape[0] == 3:  # PIL's saturation leaves L unchanged
                g = self.gray(x)
                x.sub_(g).mul_(saturation).add_(g).clamp_(0.0, 255.0).floor_()
        return x

    def gray(self, x: torch.Tensor) -> torch.Tensor:
        """PIL's convert("L") of the float levels `x`: 1xHxW, rounded to levels."""
        if x.shape[0] == 1:
            return x
        return (self.gray_weights @ x.view(3, -1)).view(1, *x.shape[1:]).add_(0.5).floor_()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base!r})"


class ToNormalizedTensor:
    """MaybeToTensor + Normalize in one pass: uint8 image (or a CHW tensor of levels) -> float CHW
    (x / 255 - mean) / std."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        self.mean = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1) * 255.0
        self.inv_std = 1.0 / (torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1) * 255.0)

    def __call__(self, pic: Image.Image | torch.Tensor) -> torch.Tensor:
        """The normalized float tensor of a PIL image or a CHW tensor of levels (uint8, or FastColorJitter's float)."""
        t = pic if isinstance(pic, torch.Tensor) else chw_uint8(pic)
        return t.float().contiguous().sub_(self.mean).mul_(self.inv_std)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def jpeg_lib_note(available: bool) -> str | None:
    """The line saying the train crops decode JPEGs with PIL because simplejpeg is missing (None if it is not)."""
    if available:
        return None
    return ("simplejpeg is not installed: training crops decode JPEGs with PIL (slower on large photos; "
            "pip install simplejpeg)")


@functools.cache
def log_jpeg_lib_note() -> None:
    """Log jpeg_lib_note once per process (the first train transform built), not once per split or rebuild."""
    note = jpeg_lib_note(simplejpeg is not None)
    if note:
        logger.info("%s", note)


def tensor_tail(steps: list) -> list | None:
    """The steps between the first and ToNormalizedTensor, ColorJitter made FastColorJitter, when each takes a
    uint8 CHW tensor with the same draws as timm's PIL step (flips, jitter without hue); None otherwise."""
    tail = []
    for step in steps[1:]:
        if isinstance(step, ToNormalizedTensor):
            return tail
        if type(step) in (transforms.RandomHorizontalFlip, transforms.RandomVerticalFlip):
            tail.append(step)
        elif type(step) is transforms.ColorJitter and step.hue is None:
            tail.append(FastColorJitter(step))
        else:
            return None  # a PIL-only step (RandAugment, AutoAugment, ...) or one whose tensor result differs
    return None


def speed_up(transform: transforms.Compose, mode: str = "RGB", reduced_decode: bool = True,
             fused_tensor: bool = True, tensor_resize: bool = True, jpeg_lib: bool = True,
             tensors: bool = True) -> transforms.Compose:
    """timm's transform, same steps and sizes, for images opened with open_image: decoding and converting
    only as needed, a reduced JPEG decode (simplejpeg's when installed and jpeg_lib), torch's uint8 resize, a
    fused to-tensor/normalize, and with `tensors` the train crop's flips and jitter on its uint8 tensor instead
    of PIL images (each can be turned off, for the benchmark)."""
    steps = list(transform.transforms)
    first = steps[0]
    if reduced_decode and type(first) is RandomResizedCropAndInterpolation:
        steps[0] = FastRandomResizedCrop(first, mode, tensor_resize, jpeg_lib)
        if jpeg_lib:
            log_jpeg_lib_note()
    elif reduced_decode and isinstance(first, transforms.Resize):
        steps[0] = FastResize(first, mode, tensor_resize)
    else:
        steps.insert(0, DecodeMode(mode))
    for i in range(len(steps) - 1):
        pair = steps[i:i + 2]
        if fused_tensor and isinstance(pair[0], MaybeToTensor) and isinstance(pair[1], transforms.Normalize):
            steps[i:i + 2] = [ToNormalizedTensor(pair[1].mean, pair[1].std)]
            break
    tail = tensor_tail(steps) if tensors and tensor_resize and isinstance(steps[0], FastRandomResizedCrop) else None
    if tail is not None:
        steps[0].as_tensor = True
        steps[1:1 + len(tail)] = tail
    return transforms.Compose(steps)


def open_image(path: str) -> Image.Image:
    """Open an image lazily (header only), so the transform can choose a reduced-size decode."""
    return Image.open(path)
