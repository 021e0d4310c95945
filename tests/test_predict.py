"""tools/predict.py: a model trained on exported digits JPEGs names the right digit, for images of any mode."""
from __future__ import annotations

import csv
import importlib.util
import io
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


def test_predict_table_and_bad_input(trained, tmp_path: Path, in_process):
    cfg, ckpt, data = trained
    image = sorted((data / "val" / "3").glob("*.jpg"))[0]
    # the table and one bad image through predict's main in this process; several images, two bad, in a process
    res = in_process("predict.py", ["--cfg", str(cfg), "MODEL.CHECKPOINT", str(ckpt), str(image), "--topk", "3"])
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert lines[0] == str(image) and len(lines) == 4 and lines[1].split()[:2] == ["1.", "3"]
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    bad = in_process("predict.py", ["--cfg", str(cfg), "MODEL.CHECKPOINT", str(ckpt), str(text)])
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


# ---- a folder of images to a file (--output, batches, workers, --tta flip) -------------------------------------------
@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> tuple[Path, int]:
    """(a folder of 300 digits JPEGs in sub-folders, and a corrupt one among them, the number of good images)."""
    folder = export_digits_jpegs(tmp_path_factory.mktemp("photos") / "digits", size=32, per_class=30, seed=3)
    (folder / "val" / "4" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    return folder, len(list(folder.rglob("*.jpg"))) - 1


def predict_to(trained, folder: Path, output: Path, *args: str) -> subprocess.CompletedProcess:
    """tools/predict.py over `folder` to `output`, two loader workers, batches of 64."""
    cfg, ckpt, _ = trained
    return run_tool("predict.py", "--cfg", str(cfg), "MODEL.CHECKPOINT", str(ckpt), "DATA.NUM_WORKERS", "2",
                    "DATA.EVAL_BATCH_SIZE", "64", str(folder), "--output", str(output), *args)


def read_jsonl(path: Path) -> list[dict]:
    """One object per line."""
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_predict_folder_to_csv_and_jsonl(trained, photos, tmp_path: Path):
    folder, good = photos
    res = predict_to(trained, folder, tmp_path / "preds.csv")
    assert res.returncode == 2, res.stderr[-3000:]  # one image could not be read: listed, skipped, said by the code
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "broken.jpg" in errors[0]
    assert f"wrote {good} predictions" in res.stdout and "1 unreadable image skipped" in res.stdout
    rows = list(csv.DictReader(io.StringIO((tmp_path / "preds.csv").read_text())))
    assert len(rows) == good and list(rows[0])[:3] == ["image", "class_1", "prob_1"] and len(rows[0]) == 11
    assert sorted(r["image"] for r in rows) == sorted(str(p) for p in folder.rglob("*.jpg") if p.name != "broken.jpg")
    truth = [Path(r["image"]).parent.name == r["class_1"] for r in rows]
    assert sum(truth) > 0.8 * good  # the model trained on the digits names most of them
    res = predict_to(trained, folder, tmp_path / "preds.jsonl", "--topk", "10")
    lines = read_jsonl(tmp_path / "preds.jsonl")
    assert len(lines) == good and all(len(r["top"]) == 10 for r in lines)
    assert all(abs(sum(t["prob"] for t in r["top"]) - 1) < 1e-4 for r in lines)  # every class: they sum to 1
    flipped = predict_to(trained, folder, tmp_path / "flip.jsonl", "--topk", "10", "--tta", "flip")
    assert flipped.returncode == 2, flipped.stderr[-3000:]
    tta = read_jsonl(tmp_path / "flip.jsonl")
    assert [r["image"] for r in tta] == [r["image"] for r in lines] and all(len(r["top"]) == 10 for r in tta)
    assert all(abs(sum(t["prob"] for t in r["top"]) - 1) < 1e-4 for r in tta)
    assert any(a["top"] != b["top"] for a, b in zip(tta, lines, strict=True))  # a digit's mirror is another image


def run_main(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    """tools/predict.py's main in this process: (exit code, stdout, the stderr lines that are not blank)."""
    with pytest.raises(SystemExit) as exit_:
        _predict_module().main(argv)
    out, err = capsys.readouterr()
    return exit_.value.code, out, [line for line in err.splitlines() if line.strip()]


def test_predict_output_mistakes(tmp_path: Path, capsys):
    """Each said in one line, exit 2, before any image is read (the image here is no image at all)."""
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"")
    image = tmp_path / "a.jpg"
    image.write_bytes(b"")
    (tmp_path / "old.csv").write_text("image\n")
    (tmp_path / "x.csv").mkdir()
    (tmp_path / "file").write_text("")
    base = ["--cfg", str(ROOT / "configs" / "digits" / "resnet18.yaml"), "MODEL.CHECKPOINT", str(weights), str(image)]
    for args, words in ((["--output", str(tmp_path / "p.txt")], ["p.txt", ".csv or .jsonl"]),
                        (["--output", str(tmp_path / "old.csv")], ["exists", "--force"]),
                        (["--output", str(tmp_path / "OLD.CSV"), "--force"], ["OLD.CSV", "does not exist"]),
                        (["--output", str(tmp_path / "p.csv"), "--json"], ["give one of them"]),
                        (["--output", str(tmp_path / "x.csv"), "--force"], ["x.csv is a folder"]),
                        (["--output", str(tmp_path / "new" / "p.csv")], ["new does not exist"]),
                        (["--output", str(tmp_path / "file" / "p.jsonl")], ["file is not a folder"]),
                        (["--tta", "crops"], ["--tta", "flip"])):
        if "OLD.CSV" in args[1]:  # the extension's case does not matter: OLD.CSV is a CSV file, in a folder gone
            args = ["--output", str(tmp_path / "gone" / "OLD.CSV"), "--force"]
        code, _, err = run_main(base + args, capsys)
        assert code == 2 and len(err) == 1, err
        assert all(w in err[0] for w in words), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jpg", "file", "old.csv", "w.pth", "x.csv"]


# ---- names that a spreadsheet would run; a run's config read from another folder ------------------------------------
FORMULA_CLASSES = ['=HYPERLINK("http://x")', "+SUM(1,2)"]


@pytest.fixture(scope="module")
def formulas(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(config whose DATA.ROOT is relative and nowhere, untrained 2-class weights whose run's class_map.json names
    the classes like formulas, a folder of images named like formulas too)."""
    import timm
    import torch

    base = tmp_path_factory.mktemp("formulas")
    cfg = base / "config.yaml"
    cfg.write_text("MODEL: {NAME: resnet10t, NUM_CLASSES: 2}\nDEVICE: cpu\n"
                   "DATA: {NAME: folder, ROOT: data, IMG_SIZE: 16, NUM_WORKERS: 0, EVAL_BATCH_SIZE: 4}\n")
    ckpt = base / "run" / "checkpoints" / "w.pth"
    ckpt.parent.mkdir(parents=True)
    torch.save({"model": timm.create_model("resnet10t", num_classes=2).state_dict()}, ckpt)
    write_class_map(base / "run", FORMULA_CLASSES)  # what training writes from the class folders' names
    photos = base / "photos"
    for rel in ('=HYPERLINK("x")/a.png', '=HYPERLINK("x")/-cmd.png', "+SUM(1,2)/b.png", "@c.png"):
        (photos / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20, 20), (200, 10, 10)).save(photos / rel)
    return cfg, ckpt, photos


def test_predict_csv_is_spreadsheet_safe_and_jsonl_unchanged(formulas, tmp_path: Path, monkeypatch, capsys):
    """Run from the images' folder, where the config's relative DATA.ROOT is not: predict reads no data.

    An argument starting with - is an option, so -cmd.png comes inside a folder here (a class folder has no "/" in
    its name); the rule's own cases, - among them, are in tests/sweep/test_summary.py.
    """
    cfg, ckpt, photos = formulas
    monkeypatch.chdir(photos)  # image paths relative to here: each starts its CSV cell
    images = ['=HYPERLINK("x")', "+SUM(1,2)/b.png", "@c.png"]
    base = ["--cfg", str(cfg), "MODEL.CHECKPOINT", str(ckpt), *images, "--topk", "2"]
    code, out, err = run_main([*base, "--output", str(tmp_path / "preds.CSV")], capsys)  # the extension's case
    assert code == 0 and "wrote 4 predictions" in out, err
    rows = list(csv.DictReader(io.StringIO((tmp_path / "preds.CSV").read_text())))
    expected = ['=HYPERLINK("x")/-cmd.png', '=HYPERLINK("x")/a.png', "+SUM(1,2)/b.png", "@c.png"]
    assert [r["image"] for r in rows] == ["'" + name for name in expected]
    for r in rows:
        assert {r["class_1"], r["class_2"]} == {"'" + c for c in FORMULA_CLASSES}, r
        assert 0 <= float(r["prob_2"]) <= float(r["prob_1"]) <= 1  # numbers stay numbers
    code, out, err = run_main([*base, "--output", str(tmp_path / "preds.jsonl")], capsys)
    assert code == 0, err
    lines = read_jsonl(tmp_path / "preds.jsonl")
    assert [r["image"] for r in lines] == expected
    assert all({t["class"] for t in r["top"]} == set(FORMULA_CLASSES) for r in lines)
