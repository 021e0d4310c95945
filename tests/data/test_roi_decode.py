"""The train crop's simplejpeg decode (runner/data/folder/decode.py): the same pixels and the same random draws as
the PIL decode it replaces, and PIL when simplejpeg is not used. Real images: scikit-learn's sample photos, a
grayscale, a progressive and a CMYK JPEG, a PNG."""
from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from timm.data.transforms import RandomResizedCropAndInterpolation

from runner.data.folder.decode import FastRandomResizedCrop, jpeg_array, jpeg_lib_note, open_image

CROPS = 40  # random crops per image and size


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    """The two 640x427 sample photos, and grayscale, progressive, CMYK JPEGs and a PNG made from one of them."""
    root = tmp_path_factory.mktemp("roi")
    photos = {Path(p).stem: Path(p) for p in load_sample_images().filenames}
    flower = Image.open(photos["flower"]).convert("RGB")
    made = {"gray": root / "gray.jpg", "progressive": root / "progressive.jpg", "cmyk": root / "cmyk.jpg",
            "png": root / "flower.png"}
    flower.convert("L").save(made["gray"], quality=90)
    flower.save(made["progressive"], quality=90, progressive=True)
    flower.convert("CMYK").save(made["cmyk"], quality=90)
    flower.resize((320, 213)).save(made["png"])
    return photos | made


def crop(size: int, interp: str = "bilinear") -> RandomResizedCropAndInterpolation:
    """timm's train crop at `size` (scale 0.08-1, ratio 3/4-4/3), as timm's create_transform builds it."""
    return RandomResizedCropAndInterpolation(size, interpolation=interp)


@pytest.mark.parametrize("name", ["china", "flower", "gray", "progressive", "cmyk", "png"])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_fast_decode_matches_pil_decode(images: dict[str, Path], name: str, mode: str):
    """Same size, within 2 levels (mean) of the PIL path, for many random crops at several sizes."""
    pytest.importorskip("simplejpeg")
    for size, interp in ((224, "bilinear"), (128, "bicubic"), (32, "bilinear")):
        fast = FastRandomResizedCrop(crop(size, interp), mode)
        pil = FastRandomResizedCrop(crop(size, interp), mode, jpeg_lib=False)
        for k in range(CROPS):
            random.seed(k)
            a = fast(open_image(str(images[name])))
            random.seed(k)
            b = pil(open_image(str(images[name])))
            assert a.size == b.size == (size, size) and a.mode == b.mode == mode
            diff = np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).mean()
            assert diff <= 2.0, (name, size, k, diff)


def test_photos_take_the_fast_path(images: dict[str, Path]):
    """A large RGB or grayscale JPEG decodes through simplejpeg at draft's size; CMYK, PNG and small JPEGs are left
    to PIL."""
    pytest.importorskip("simplejpeg")
    for name in ("china", "gray", "progressive"):
        arr, s = jpeg_array(open_image(str(images[name])), "RGB", 4.0)
        assert s == 2 and arr.shape[:2] == (214, 320), name  # 427x640 at 1/2: libjpeg's ceil(side / 2)
    for name in ("cmyk", "png"):
        assert jpeg_array(open_image(str(images[name])), "RGB", 4.0) is None, name
    buf = io.BytesIO()
    Image.open(images["china"]).resize((224, 224)).save(buf, "JPEG")
    assert jpeg_array(Image.open(buf), "RGB", 4.0) is None  # small: PIL is as fast


def test_random_draws_are_unchanged(images: dict[str, Path]):
    """Same crops from the same seed as timm's transform, and the same number of draws (the generators' states
    afterwards are equal), with or without simplejpeg: exact resume replays the same samples."""
    for size in (224, 32):
        base = crop(size, "random")  # bilinear or bicubic, drawn after the crop: one more draw to keep in step
        paths = [str(images[n]) for n in ("china", "flower", "gray", "cmyk", "png")] * 4
        states = []
        for t in (base, FastRandomResizedCrop(base), FastRandomResizedCrop(base, jpeg_lib=False)):
            random.seed(7)
            torch.manual_seed(7)
            for p in paths:
                t(Image.open(p).convert("RGB") if t is base else open_image(p))
            states.append((random.getstate(), torch.get_rng_state()))
        for state in states[1:]:
            assert state[0] == states[0][0] and torch.equal(state[1], states[0][1]), size


def test_crop_box_follows_the_header(images: dict[str, Path]):
    """The crop is drawn on the header's size, so both paths crop the same region: a flat-coloured JPEG whose
    left and right halves differ gives the same mean colour either way."""
    arr = np.zeros((300, 400, 3), np.uint8)
    arr[:, 200:] = (250, 30, 30)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=95)
    for k in range(CROPS):
        got = []
        for jpeg_lib in (True, False):
            random.seed(k)
            got.append(np.asarray(FastRandomResizedCrop(crop(64), jpeg_lib=jpeg_lib)(Image.open(io.BytesIO(
                buf.getvalue()))), np.float32).mean())
        assert abs(got[0] - got[1]) < 2.0, k


def test_without_simplejpeg_pil_decodes_and_one_line_says_so(images: dict[str, Path]):
    """jpeg_lib=False (as when simplejpeg is not installed) decodes with PIL: the image is loaded by PIL (its
    tile list consumed); the start-up note names the fallback and the fix, and is silent when installed."""
    img = open_image(str(images["china"]))
    random.seed(0)
    out = FastRandomResizedCrop(crop(224), jpeg_lib=False)(img)
    assert out.size == (224, 224) and img.tile == []
    note = jpeg_lib_note(False)
    assert note and "simplejpeg" in note and "PIL" in note and "\n" not in note
    assert jpeg_lib_note(True) is None


def test_truncated_jpeg_is_still_a_decode_error(tmp_path: Path, images: dict[str, Path]):
    """simplejpeg rejects a truncated file; PIL then decides, with the error the dataset skips (OSError)."""
    data = images["china"].read_bytes()
    p = tmp_path / "cut.jpg"
    p.write_bytes(data[: len(data) // 2])
    random.seed(0)
    with pytest.raises(OSError):
        FastRandomResizedCrop(crop(224))(open_image(str(p)))
