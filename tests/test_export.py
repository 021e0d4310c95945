"""tools/export.py: each format loaded back by its own consumer (timm local-dir:, safetensors into a fresh timm model,
onnxruntime, torch.export.load) classifies the run's validation images as the checkpoint does; EMA weights by
default, the raw ones with --no-ema; mistakes are one line and exit 2; a failed verification leaves nothing."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import load_file
from timm.data import create_transform, resolve_data_config

from runner import export as lib
from runner.checkpoint import load_file as load_checkpoint
from runner.config import config_from_yaml_text
from runner.data.folder.dataset import timm_transform
from runner.weights.preprocess import resolve
from tests.utils import env, give_back_loggers, logger_state

ROOT = Path(__file__).resolve().parents[1]
# test_resnet on the digits for one epoch (22 steps, ~5 s); EMA decay 0.9 so the EMA differs from the raw weights
TRAIN = ["--cfg", "configs/digits/test_resnet.yaml", "TRAIN.EPOCHS", "1", "TRAIN.EMA", "true", "TRAIN.EMA_DECAY",
         "0.9", "DATA.NUM_WORKERS", "0", "LOG.TENSORBOARD", "false"]
IMAGES = 128


def tool():
    """tools/export.py imported as a module (tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("export_tool", ROOT / "tools" / "export.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_main(*args: str) -> int:
    """tools/export.py's main in this process; its exit code. The log handlers it sets up (on this test's captured
    stdout) are taken back after it: left, the next in-process tool would log to a closed stream."""
    loggers = logger_state()
    try:
        with pytest.raises(SystemExit) as done:
            tool().main(list(args))
    finally:
        give_back_loggers(loggers)
    return done.value.code


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished digits run with EMA weights."""
    out = tmp_path_factory.mktemp("export") / "run"
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), *TRAIN, "OUTPUT_DIR", str(out)],
                         capture_output=True, text=True, cwd=ROOT, env=env(), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def reference(run: Path) -> dict:
    """The checkpoint's EMA and raw models (built here with timm, not by the exporter) and the val images."""
    ckpt = load_checkpoint(run / "checkpoints" / "best.pth")
    cfg = config_from_yaml_text(ckpt["config"])
    models = {}
    for kind, sd in (("ema", {k.removeprefix("module."): v for k, v in ckpt["ema"].items()}), ("raw", ckpt["model"])):
        models[kind] = timm.create_model(cfg.MODEL.NAME, num_classes=cfg.MODEL.NUM_CLASSES).eval()
        models[kind].load_state_dict(sd)
    images, _ = lib.val_images(lib.load_source(str(run)).cfg, IMAGES)
    return {"ckpt": ckpt, "cfg": cfg, "models": models, "images": images}


def logits(model, images: torch.Tensor, batch: int = 50) -> torch.Tensor:
    """The model's logits over the images, in batches of `batch` (the last one smaller)."""
    with torch.inference_mode():
        return torch.cat([torch.as_tensor(model(images[i:i + batch])) for i in range(0, len(images), batch)])


def assert_agrees(got: torch.Tensor, reference: dict, kind: str = "ema", atol: float = 1e-4) -> None:
    """The export's logits match the checkpoint's model's: the same top-1 class for every image, close values."""
    want = logits(reference["models"][kind], reference["images"])
    assert torch.equal(got.argmax(1), want.argmax(1))
    torch.testing.assert_close(got, want, atol=atol, rtol=1e-4)


def export(run: Path, out: Path, fmt: str, capsys, *extra: str) -> str:
    """Export in-process; its stdout (asserted: exit 0, the verification line, nothing on stderr)."""
    assert run_main(str(run), "--format", fmt, "--output", str(out), "--images", str(IMAGES), *extra) == 0
    printed = capsys.readouterr()
    assert printed.err == ""
    assert f"top-1 agreement {IMAGES}/{IMAGES} (100.00%)" in printed.out
    return printed.out


def test_hf_folder_loads_with_timm_local_dir(run, reference, tmp_path, capsys):
    out = tmp_path / "hf"
    printed = export(run, out, "hf", capsys)
    assert "exported EMA weights" in printed and "max |logit difference| 0," in printed
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    assert_agrees(logits(model, reference["images"]), reference, atol=0)
    config = json.loads((out / "config.json").read_text())
    cfg = reference["cfg"]
    assert config["architecture"] == cfg.MODEL.NAME and config["num_classes"] == 10
    assert config["label_names"] == [str(i) for i in range(10)] and config["num_features"] == model.num_features
    pre = config["pretrained_cfg"]
    assert pre["input_size"] == [3, 24, 24] and pre["crop_pct"] == 1.0 and pre["interpolation"] == "bilinear"
    assert pre["mean"] == list(cfg.DATA.MEAN) and pre["std"] == list(cfg.DATA.STD)
    assert "tag" not in pre  # timm's published weights' tag would misname these
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left beside it


def test_safetensors_into_a_fresh_timm_model(run, reference, tmp_path, capsys):
    out = tmp_path / "st"
    printed = export(run, out, "safetensors", capsys)
    assert 'timm.create_model("test_resnet", num_classes=10, in_chans=3' in printed
    model = timm.create_model("test_resnet", num_classes=10)
    model.load_state_dict(load_file(out / "model.safetensors"), strict=True)
    assert_agrees(logits(model.eval(), reference["images"]), reference, atol=0)


def test_torch_export_program_has_a_dynamic_batch(run, reference, tmp_path, capsys):
    out = tmp_path / "pt2"
    export(run, out, "torch-export", capsys)
    program = torch.export.load(out / "model.pt2").module()
    assert_agrees(logits(program, reference["images"]), reference)
    one = logits(program, reference["images"][:1])  # sizes other than the traced sample's 2
    assert one.shape == (1, 10)


@pytest.mark.slow
def test_onnx_runs_in_onnxruntime_with_a_clean_stderr(run, reference, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out = tmp_path / "onnx"
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "export.py"), str(run), "--format", "onnx",
                          "--output", str(out)], capture_output=True, text=True, cwd=ROOT, env=env(), timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # torch.onnx's and onnxruntime's chatter held back
    assert "verified on 256 val images" in res.stdout and "top-1 agreement 256/256" in res.stdout
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    run_onnx = lambda x: torch.from_numpy(session.run(None, {"input": x.numpy()})[0])  # noqa: E731
    assert_agrees(logits(run_onnx, reference["images"]), reference)
    assert logits(run_onnx, reference["images"][:1], 1).shape == (1, 10)


def test_ema_by_default_raw_with_no_ema(run, reference, tmp_path, capsys):
    ckpt = reference["ckpt"]
    ema = {k.removeprefix("module."): v for k, v in ckpt["ema"].items()}
    assert any(not torch.equal(ema[k], v) for k, v in ckpt["model"].items())  # the test can tell them apart
    assert "exported EMA weights" in export(run, tmp_path / "default", "safetensors", capsys)
    default = load_file(tmp_path / "default" / "model.safetensors")
    raw_out = export(run, tmp_path / "raw", "safetensors", capsys, "--no-ema")
    assert "exported raw weights" in raw_out
    raw = load_file(tmp_path / "raw" / "model.safetensors")
    assert all(torch.equal(default[k], ema[k]) for k in ema)
    assert all(torch.equal(raw[k], v) for k, v in ckpt["model"].items())


def test_a_checkpoint_file_without_ema(run, reference, tmp_path, capsys):
    """A .pth given itself; a run without EMA weights exports its raw ones."""
    plain = tmp_path / "plain.pth"
    torch.save({**reference["ckpt"], "ema": None}, plain)
    printed = export(plain, tmp_path / "out", "torch-export", capsys)
    assert f"exported raw weights of {plain}" in printed
    assert_agrees(logits(torch.export.load(tmp_path / "out" / "model.pt2").module(), reference["images"]),
                  reference, kind="raw")


def test_a_failed_verification_leaves_nothing(run, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(lib, "TOLERANCE", -1.0)  # no difference is small enough: every export fails its check
    out = tmp_path / "out"
    assert run_main(str(run), "--format", "safetensors", "--output", str(out), "--images", "16") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the safetensors export does not agree") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # neither the output nor its temporary folder


def test_an_empty_output_folder_is_filled(run, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    assert run_main(str(run), "--format", "safetensors", "--output", str(tmp_path / "out"), "--images", "16") == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["model.safetensors"]


def test_mistakes_are_one_line(run, tmp_path, capsys, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    (tmp_path / "notarun").mkdir()
    (tmp_path / "weights.pth").write_bytes(b"")
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "bare.pth")
    monkeypatch.setitem(lib.REQUIRES, "onnx", ("onnx", "no_such_package_for_this_test"))
    cases = [
        ([str(tmp_path / "missing"), "--format", "hf"], "does not exist; give a run folder"),
        ([str(tmp_path / "notarun"), "--format", "hf"], "is a folder but not a run folder"),
        ([str(run), "--format", "tflite"], "argument --format: invalid choice: 'tflite'"),
        ([str(run), "--format", "hf", "--images", "0"], "--images 0"),
        ([str(tmp_path / "weights.pth"), "--format", "hf"], "empty file"),
        ([str(tmp_path / "bare.pth"), "--format", "hf"], "holds no config and is not in a run folder"),
        ([str(run), "--format", "onnx"], 'needs no_such_package_for_this_test, not installed here: pip install -e '
                                         '".[export]"'),
    ]
    for args, words in cases:
        assert run_main(*args, "--output", str(tmp_path / "new")) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, (args, err)
    assert run_main(str(run), "--format", "hf", "--output", str(full)) == 2
    assert "is a folder that is not empty" in capsys.readouterr().err
    assert [p.name for p in full.iterdir()] == ["keep.txt"] and not (tmp_path / "new").exists()


FOLDER_RUN = """MODEL: {NAME: test_resnet, NUM_CLASSES: 3}
DATA: {NAME: folder, ROOT: /nowhere, IMG_SIZE: 32, MEAN: [0.5, 0.4, 0.3], STD: [0.2, 0.25, 0.3]}
AUG: {INTERPOLATION: bicubic, CROP_PCT: 0.8}
EVAL: {CROP_PCT: 0.9}
"""


def test_config_json_gives_timm_the_runs_eval_transform(tmp_path):
    """An image-folder run's eval preprocessing (size, crop, interpolation, mean, std) is what timm builds from the
    exported config.json (resolve_data_config + create_transform)."""
    cfg = resolve(config_from_yaml_text(FOLDER_RUN))
    lib.write_hf(timm.create_model("test_resnet", num_classes=3), tmp_path, cfg, ["a", "b", "c"])
    loaded = timm.create_model(f"local-dir:{tmp_path}", pretrained=True)
    settings = resolve_data_config(model=loaded)
    assert settings["crop_pct"] == 0.9 and settings["interpolation"] == "bicubic"
    assert loaded.pretrained_cfg["label_names"] == ["a", "b", "c"]
    image = Image.fromarray(torch.randint(0, 256, (41, 57, 3), dtype=torch.uint8).numpy())
    assert torch.equal(create_transform(**settings)(image), timm_transform(cfg, is_training=False)(image))
