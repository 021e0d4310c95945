"""tools/predict.py: a model trained on exported digits JPEGs names the right digit, for images of any mode."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from runner.config import get_default_config
from runner.data import write_class_map
from tests.data.fixtures import export_digits_jpegs

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """MODEL:
  NAME: resnet10t
DATA:
  NAME: folder
  ROOT: {root}
  IMG_SIZE: 16
  BATCH_SIZE: 64
  NUM_WORKERS: 1
AUG:
  SCALE: [0.5, 1.0]
  HFLIP: 0.0
  COLOR_JITTER: 0.0
TRAIN:
  EPOCHS: 3
  LR: 0.1
  WARMUP_EPOCHS: 0.3
EVAL:
  PERIOD: 3
LOG:
  TENSORBOARD: False
"""


def run_tool(tool: str, *args: str) -> subprocess.CompletedProcess:
    """Run tools/<tool> in a fresh interpreter."""
    return subprocess.run([sys.executable, str(ROOT / "tools" / tool), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(config file, best checkpoint, data root) of a resnet10t trained 3 epochs on the digits exported as
    32 px JPEGs, read at 16 px (the digits are 8x8 at heart)."""
    base = tmp_path_factory.mktemp("predict")
    data = export_digits_jpegs(base / "data", size=32)
    cfg = base / "digits_folder.yaml"
    cfg.write_text(CONFIG.format(root=data))
    out = base / "run"
    res = run_tool("train.py", "--cfg", str(cfg), "OUTPUT_DIR", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["val/top1"] > 90
    return cfg, out / "checkpoints" / "best.pth", data


def test_predict_names_the_right_digit(trained, tmp_path: Path):
    cfg, ckpt, data = trained
    images = [sorted((data / "val" / str(d)).glob("*.jpg"))[0] for d in range(10)]
    seven = np.asarray(Image.open(images[7]).convert("L"))
    gray = tmp_path / "seven_gray_big.png"
    Image.fromarray(seven).resize((97, 61)).save(gray)  # another size, aspect ratio and mode
    rgba = tmp_path / "seven_rgba.png"
    Image.open(images[7]).convert("RGBA").save(rgba)
    res = run_tool("predict.py", "--cfg", str(cfg), "MODEL.CHECKPOINT", str(ckpt), *map(str, images),
                   str(gray), str(rgba), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    preds = json.loads(res.stdout)["predictions"]
    assert [p["image"] for p in preds] == [*map(str, images), str(gray), str(rgba)]
    for p in preds:
        probs = [t["prob"] for t in p["top"]]
        assert len(p["top"]) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-4
    top1 = [p["top"][0]["class"] for p in preds]
    assert sum(t == str(d) for d, t in enumerate(top1[:10])) >= 9, top1
    assert top1[11] == "7", preds[11]


def test_predict_table_and_bad_input(trained, tmp_path: Path):
    cfg, ckpt, data = trained
    image = sorted((data / "val" / "3").glob("*.jpg"))[0]
    res = run_tool("predict.py", "--cfg", str(cfg), "MODEL.CHECKPOINT", str(ckpt), str(image), "--topk", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == str(image) and len(lines) == 4 and lines[1].split()[:2] == ["1.", "3"]
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    bad = run_tool("predict.py", "--cfg", str(cfg), "MODEL.CHECKPOINT", str(ckpt), str(text))
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "notes.jpg" in bad.stderr
    # several images, two bad: one line for each bad one, and the good ones are still predicted
    missing = tmp_path / "missing.png"
    mixed = run_tool("predict.py", "--cfg", str(cfg), "MODEL.CHECKPOINT", str(ckpt), str(image), str(text),
                     str(missing), str(image), "--json")
    assert mixed.returncode == 2, mixed.stderr[-3000:]
    errors = mixed.stderr.strip().splitlines()
    assert len(errors) == 2 and "notes.jpg" in errors[0] and "missing.png does not exist" in errors[1], errors
    out = json.loads(mixed.stdout)
    assert [p["image"] for p in out["predictions"]] == [str(image), str(image)]
    assert out["predictions"][0]["top"][0]["class"] == "3"
    assert [e["image"] for e in out["errors"]] == [str(text), str(missing)]


def _predict_module():
    """tools/predict.py imported as a module (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("predict_tool", ROOT / "tools" / "predict.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_class_names_fall_back_in_order(tmp_path: Path):
    names_of = _predict_module().class_names
    cfg = get_default_config()
    cfg.DATA.NAME, cfg.DATA.ROOT = "folder", str(tmp_path / "data")
    ckpt = tmp_path / "run" / "checkpoints" / "last.pth"
    ckpt.parent.mkdir(parents=True)
    assert names_of({"class_names": ["a", "b"]}, cfg, str(ckpt), 2) == ["a", "b"]
    assert names_of({}, cfg, str(ckpt), 2) == ["0", "1"]  # nothing else known: indices
    for c in ("zebra", "ant", ".hidden"):
        (tmp_path / "data" / "train" / c).mkdir(parents=True)
    assert names_of({}, cfg, str(ckpt), 2) == ["ant", "zebra"]
    write_class_map(tmp_path / "run", ["cat", "dog"])
    assert names_of({}, cfg, str(ckpt), 2) == ["cat", "dog"]
    assert names_of({"class_names": ["x", "y", "z"]}, cfg, str(ckpt), 2) == ["cat", "dog"]  # wrong count
    # more outputs than the run's classes (MODEL.NUM_CLASSES above the folders): names, then indices
    assert names_of({"class_names": ["a", "b"]}, cfg, str(ckpt), 4) == ["a", "b", "2", "3"]


def test_split_images_from_overrides():
    mod = _predict_module()
    from runner.config import build_parser

    parser = build_parser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--topk", type=int, default=5)
    rest, images = mod.split_images(["--cfg", "c.yaml", "MODEL.CHECKPOINT", "w.pth", "a.jpg", "--topk", "3",
                                     "DATA.IMG_SIZE", "64", "b c.png", "--json"], parser)
    assert rest == ["--cfg", "c.yaml", "MODEL.CHECKPOINT", "w.pth", "--topk", "3", "DATA.IMG_SIZE", "64",
                    "--json"]
    assert images == ["a.jpg", "b c.png"]
