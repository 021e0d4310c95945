"""The train transform's flips and colour jitter on the crop's uint8 tensor (runner/data/folder/decode.py): timm's
pixels and timm's random draws, and PIL where a step has no such twin. Real images: scikit-learn's sample photos,
a grayscale JPEG made from one; real timm and torchvision transforms."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from timm.data import create_transform
from torchvision import transforms

from runner.config import get_default_config
from runner.data.folder import build_transform, open_image, speed_up, timm_transform
from runner.data.folder.decode import FastColorJitter, FastRandomResizedCrop
from tests.utils import merge_pairs

DRAWS = 60  # seeded draws per image


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    """The two 640x427 sample photos and a grayscale JPEG of one."""
    photos = {Path(p).stem: Path(p) for p in load_sample_images().filenames}
    gray = tmp_path_factory.mktemp("tail") / "gray.jpg"
    Image.open(photos["flower"]).convert("L").save(gray, quality=90)
    return photos | {"gray": gray}


def cfg_for(size: int, **overrides):
    """A frozen default config (folder data, `size` px) with dotted-key overrides."""
    cfg = get_default_config()
    cfg.DATA.NAME, cfg.DATA.IMG_SIZE = "folder", size
    merge_pairs(cfg, [x for key, value in overrides.items() for x in (key.replace("__", "."), value)])
    cfg.freeze()
    return cfg


def seeded(seed: int, fn, *args):
    """fn(*args) with python's and torch's generators seeded (timm's crop draws from one, flips and jitter the
    other)."""
    random.seed(seed)
    torch.manual_seed(seed)
    return fn(*args)


@pytest.mark.parametrize("name", ["china", "flower", "gray"])
def test_jitter_on_the_tensor_gives_pils_pixels(images: dict[str, Path], name: str):
    """Every order and factor of a 0.4 jitter (and brightness or contrast alone): the PIL jitter's levels except a
    rare one (the contrast mean rounds once, not per pixel), on RGB and grayscale."""
    img = Image.open(images[name]).resize((160, 120))
    for base in (transforms.ColorJitter(0.4, 0.4, 0.4), transforms.ColorJitter(0.6), transforms.ColorJitter(0, 0.6)):
        fast, differ, worst = FastColorJitter(base), 0, 0
        for k in range(DRAWS):
            ref = np.asarray(seeded(k, base, img), np.int16)
            t = torch.from_numpy(np.asarray(img).copy()).reshape(img.height, img.width, -1).permute(2, 0, 1)
            got = seeded(k, fast, t).permute(1, 2, 0).squeeze(-1).numpy().astype(np.int16)
            assert got.shape == ref.shape
            differ += int((got != ref).sum())
            worst = max(worst, int(np.abs(got - ref).max()))
        assert differ <= 1e-4 * ref.size * DRAWS and worst <= 4, (base, differ, worst)


@pytest.mark.parametrize("size,name", [(224, "china"), (128, "flower"), (224, "gray"), (32, "china")])
def test_default_train_transform_is_timms_within_a_level(images: dict[str, Path], size: int, name: str):
    """Ours (crop, flip, jitter on the tensor) against timm's own transform on the PIL image and against our PIL
    steps (tensors=False), with the same seeds: the same output but for a fraction of a level on average, and the
    same draws (generators equal afterwards). At 32 px both of ours decode the photo reduced, timm's does not."""
    chans = 1 if name == "gray" else 3
    cfg = cfg_for(size, MODEL__IN_CHANS=chans, DATA__MEAN=[0.5] * chans, DATA__STD=[0.5] * chans)
    ours, timm = build_transform(cfg, True), timm_transform(cfg, True)
    assert [type(s).__name__ for s in ours.transforms] == [
        "FastRandomResizedCrop", "RandomHorizontalFlip", "FastColorJitter", "ToNormalizedTensor"]
    pil_steps = speed_up(timm, "L" if name == "gray" else "RGB", tensors=False)
    path, mode = str(images[name]), "L" if name == "gray" else "RGB"
    refs = {"ours, PIL steps": lambda: pil_steps(open_image(path))}
    if size > 32:
        refs["timm"] = lambda: timm(Image.open(path).convert(mode))
    for ref_name, ref_fn in refs.items():
        diffs = []
        for k in range(DRAWS // 2):
            ref = seeded(k, ref_fn)
            state = (random.getstate(), torch.get_rng_state())
            got = seeded(k, ours, open_image(path))
            assert random.getstate() == state[0] and torch.equal(torch.get_rng_state(), state[1])
            assert got.shape == ref.shape == (chans, size, size) and got.dtype == torch.float32
            diffs.append((got - ref).abs() * 0.5 * 255)
        levels = torch.stack(diffs)
        assert float(levels.mean()) < 0.1 and float(levels.max()) <= 6, (ref_name, levels.mean(), levels.max())


def test_pil_only_steps_keep_the_pil_path(images: dict[str, Path]):
    """RandAugment, a hue jitter or a step we do not know keep timm's PIL steps after a crop that gives PIL."""
    cfg = cfg_for(64, AUG__AUTO_AUGMENT="rand-m9-mstd0.5-inc1")
    with_hue = create_transform(64, is_training=True, color_jitter=(0.4, 0.4, 0.4, 0.1))
    gray = transforms.Compose([*timm_transform(cfg_for(64), True).transforms[:1], transforms.RandomGrayscale(0.5),
                               *timm_transform(cfg_for(64), True).transforms[1:]])
    for t in (build_transform(cfg, True), speed_up(with_hue), speed_up(gray)):
        first = t.transforms[0]
        assert isinstance(first, FastRandomResizedCrop) and not first.as_tensor
        assert not any(isinstance(s, FastColorJitter) for s in t.transforms)
        assert seeded(0, t, open_image(str(images["china"]))).shape == (3, 64, 64)


def test_tensor_tail_can_be_turned_off(images: dict[str, Path]):
    """speed_up(tensors=False) (the benchmark's column before this step) keeps timm's PIL flip and jitter."""
    t = speed_up(timm_transform(cfg_for(64), True), tensors=False)
    assert [type(s).__name__ for s in t.transforms] == [
        "FastRandomResizedCrop", "RandomHorizontalFlip", "ColorJitter", "ToNormalizedTensor"]
    assert not t.transforms[0].as_tensor
    assert seeded(0, t, open_image(str(images["china"]))).shape == (3, 64, 64)
