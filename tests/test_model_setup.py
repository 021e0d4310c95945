"""Model-side mistakes end in one line at setup: class counts, pretrained tags, image sizes, weights files that
are no weights or do not fit the model (train, eval and predict), and predict's image paths; the refusals that come
before a run's claim through the tools' main in this process."""
from __future__ import annotations

import logging
import pickle
import zipfile
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image

from runner.config import load_config
from runner.data import build_data
from runner.distributed import Dist
from runner.errors import UserError
from runner.model import build_model, probe_input
from runner.weights.files import load_weights
from tests.utils import TINY, assert_user_error, run_tool

CPU = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
SYNTH = ["DATA.NAME", "synthetic", "DATA.SYNTHETIC_SIZE", "16", "DATA.BATCH_SIZE", "8"]


def cfg_of(*pairs: str):
    """A frozen default config with KEY VALUE overrides (TINY first)."""
    return load_config([*TINY, *pairs], check_paths=False)[0]  # the runner's own reading of KEY VALUE


@pytest.fixture
def run(finished_digits) -> Path:
    """OUTPUT_DIR of a finished digits run of resnet10t at 16 px (10 classes; trained once for the session): a real
    runner checkpoint."""
    return finished_digits[0]


@pytest.fixture(scope="module")
def five_classes(tmp_path_factory) -> Path:
    """A plain state_dict of a timm resnet10t with a 5-class head."""
    path = tmp_path_factory.mktemp("sd") / "resnet10t_5.pth"
    torch.save(timm.create_model("resnet10t", num_classes=5).state_dict(), path)
    return path


# ---- 1. fewer outputs than classes ----------------------------------------------------------------------
def test_digits_with_fewer_outputs_than_classes_is_refused_before_step_1(tmp_path: Path, in_process):
    proc = in_process("train.py", [*TINY, "MODEL.NUM_CLASSES", "5", "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, "DATA.NAME digits has 10 classes but MODEL.NUM_CLASSES is 5",
                      "set MODEL.NUM_CLASSES 10")
    assert "step" not in proc.stdout


def test_digits_with_more_outputs_than_classes_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        data = build_data(cfg_of("MODEL.NUM_CLASSES", "12"), CPU)
    assert data.class_names == [str(i) for i in range(10)]
    assert "outputs 10..11 never get a target" in caplog.text


def test_auto_augment_on_digits_is_said_to_be_ignored(caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        build_data(cfg_of("AUG.AUTO_AUGMENT", "rand-m9"), CPU)
    assert "DATA.NAME digits ignores AUG.AUTO_AUGMENT 'rand-m9'" in caplog.text


# ---- 2. pretrained tags -----------------------------------------------------------------------------------
def test_pretrained_tag_without_weights_is_refused(tmp_path: Path):
    proc = run_tool("train.py", [*TINY, "MODEL.NAME", "resnet18.a1_in1k", "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, "MODEL.NAME 'resnet18.a1_in1k'", "MODEL.PRETRAINED is false",
                      "write MODEL.NAME resnet18")


def test_unknown_pretrained_tag_is_refused(tmp_path: Path):
    proc = run_tool("train.py", [*TINY, "MODEL.NAME", "resnet18.foo", "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, "no pretrained tag 'foo' for resnet18", "a1_in1k", "write MODEL.NAME resnet18")


def test_pretrained_tag_with_a_checkpoint_loads_it(five_classes: Path):
    model = build_model(cfg_of("MODEL.NAME", "resnet10t.c3_in1k", "MODEL.CHECKPOINT", str(five_classes),
                               "MODEL.NUM_CLASSES", "5"))
    assert torch.equal(model.fc.weight, torch.load(five_classes)["fc.weight"])


# ---- 4. image sizes -----------------------------------------------------------------------------------------
def test_vit_size_not_a_multiple_of_the_patch_is_refused(tmp_path: Path):
    proc = run_tool("train.py", [*TINY, *SYNTH, "MODEL.NAME", "vit_tiny_patch16_224", "DATA.IMG_SIZE", "20",
                                 "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, "MODEL.NAME vit_tiny_patch16_224", "DATA.IMG_SIZE 20 is not a multiple of 16",
                      "use DATA.IMG_SIZE 16 or 32")


def test_size_a_model_cannot_take_is_refused_at_setup(tmp_path: Path):
    proc = run_tool("train.py", [*TINY, *SYNTH, "MODEL.NAME", "convnext_atto", "DATA.IMG_SIZE", "2",
                                 "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, "MODEL.NAME convnext_atto cannot take DATA.IMG_SIZE 2 images", "Kernel size")


def test_probe_keeps_batchnorm_statistics_and_mode():
    cfg = cfg_of()
    model = timm.create_model("resnet10t", num_classes=10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe_input(model, cfg)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.eval()
    probe_input(model, cfg)
    assert not model.training


# ---- 6. files that are no weights -------------------------------------------------------------------------
class Opaque:
    """A pickled object weights_only loading refuses."""


def write_junk(d: Path) -> dict[str, tuple[Path, str]]:
    """Files that are no weights, each with a fragment of the line that must name what it is."""
    junk = {}

    def add(kind: str, name: str, fragment: str) -> Path:
        junk[kind] = (d / name, fragment)
        return d / name

    text = add("yaml", "config.yaml", "is a text file beginning 'MODEL: NAME: resnet18'")
    text.write_text("MODEL:\n  NAME: resnet18\n")
    add("empty", "empty.pth", "is an empty file (0 bytes)").write_bytes(b"")
    add("lfs", "lfs.pth", "a Git LFS pointer: fetch the file itself with git lfs pull").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 46000000\n")
    Image.new("RGB", (4, 4)).save(add("png", "weights.png", "is a PNG image"))
    with zipfile.ZipFile(add("zip", "w.zip", "is a zip archive but not a torch file (it holds notes.txt)"), "w") as z:
        z.writestr("notes.txt", "hi")
    torch.save([torch.zeros(2)], add("list", "list.pth", "holds a list, not a state_dict"))
    torch.save(torch.zeros(3), add("tensor", "tensor.pth", "holds a Tensor, not a state_dict"))
    torch.save({"obj": Opaque()}, add("object", "object.pth", "a pickle holding Python objects other than tensors"))
    add("pickle", "plain.pkl", "weights_only loading refuses").write_bytes(pickle.dumps({"a": 1}, protocol=4))
    torch.save({"epoch": 3, "name": "x"}, add("no_tensors", "meta.pth", "holds no tensors (its keys: epoch, name)"))
    torch.save({"model": [1, 2]}, add("model_list", "model_list.pth", "its 'model' entry holds a list"))
    good = d / "good.pth"
    torch.save({"w": torch.zeros(2)}, good)
    add("truncated", "cut.pth", "a damaged torch file").write_bytes(good.read_bytes()[:100])
    return junk


JUNK = ["yaml", "empty", "lfs", "png", "zip", "list", "tensor", "object", "pickle", "no_tensors", "model_list",
        "truncated"]


@pytest.fixture(scope="module")
def junk(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """The junk files, written once."""
    return write_junk(tmp_path_factory.mktemp("junk"))


@pytest.mark.parametrize("kind", JUNK)
def test_file_that_is_no_weights_is_named(junk, kind: str):
    path, fragment = junk[kind]
    with pytest.raises(UserError) as e:
        build_model(cfg_of("MODEL.CHECKPOINT", str(path)), allow_new_head=False)
    assert f"MODEL.CHECKPOINT {path}" in str(e.value) and fragment in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["yaml", "zip", "object", "pickle"])  # pickle: torch also warns on stderr
def test_file_that_is_no_weights_is_one_line_from_eval(junk, kind: str, in_process):
    path, fragment = junk[kind]
    # through the command line where a warning may come too (in this process it would be pytest's)
    call = run_tool if kind in ("yaml", "pickle") else in_process
    proc = call("eval.py", [*TINY, *SYNTH, "MODEL.CHECKPOINT", str(path)])
    assert_user_error(proc, f"MODEL.CHECKPOINT {path}", fragment)


def test_empty_state_dict_no_longer_evaluates_random_weights(tmp_path: Path):
    path = tmp_path / "empty_dict.pth"
    torch.save({}, path)
    with pytest.raises(UserError, match="holds no tensors"):
        build_model(cfg_of("MODEL.CHECKPOINT", str(path)), allow_new_head=False)


def test_safetensors_weights_load(tmp_path: Path, five_classes: Path):
    from safetensors.torch import save_file

    sd = torch.load(five_classes)
    save_file(sd, tmp_path / "model.safetensors")
    model = build_model(cfg_of("MODEL.NUM_CLASSES", "5", "MODEL.CHECKPOINT", str(tmp_path / "model.safetensors")),
                        allow_new_head=False)
    assert torch.equal(model.conv1[0].weight, sd["conv1.0.weight"])


# ---- 7. weights that do not fit -----------------------------------------------------------------------------
def test_eval_refuses_a_checkpoint_of_another_class_count(run: Path, in_process):
    proc = in_process("eval.py", [*TINY, "MODEL.NUM_CLASSES", "12", "MODEL.CHECKPOINT",
                                str(run / "checkpoints" / "last.pth")])
    assert_user_error(proc, "does not fit MODEL.NAME resnet10t with MODEL.NUM_CLASSES 12",
                      "2 tensors have other shapes than resnet10t's (fc.weight [10, 512] vs [12, 512], fc.bias",
                      "saved by a run with MODEL.NAME resnet10t, MODEL.NUM_CLASSES 10")


def test_eval_refuses_a_checkpoint_of_another_architecture(run: Path, in_process):
    proc = in_process("eval.py", [*TINY, "MODEL.NAME", "resnet18", "MODEL.CHECKPOINT",
                                str(run / "checkpoints" / "last.pth")])
    assert_user_error(proc, "does not fit MODEL.NAME resnet18", "other shapes", "missing",
                      "saved by a run with MODEL.NAME resnet10t")


def test_eval_accepts_the_checkpoint_that_fits(run: Path, in_process):
    proc = in_process("eval.py", [*TINY, "MODEL.CHECKPOINT", str(run / "checkpoints" / "last.pth")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"val/count": 360' in proc.stdout


def test_predict_refuses_weights_of_another_class_count(run: Path, five_classes: Path, tmp_path: Path, in_process):
    image = tmp_path / "x.png"
    Image.new("RGB", (20, 20), "white").save(image)
    proc = in_process("predict.py", ["--cfg", str(run / "config.yaml"), "MODEL.CHECKPOINT", str(five_classes),
                                     str(image)])
    assert_user_error(proc, f"MODEL.CHECKPOINT {five_classes} does not fit MODEL.NAME resnet10t",
                      "fc.weight [5, 512] vs [10, 512]")


def test_a_refusal_after_the_claim_leaves_nothing_running_in_the_process(five_classes: Path, tmp_path: Path,
                                                                         in_process):
    """train(cfg) as a library call: weights that do not fit are found after the folder is claimed (the model is
    built then); the run is recorded failed, and its watchdog thread and run lock go with the refusal (the fixture
    fails a test whose tool leaves a thread or an open file)."""
    out = tmp_path / "o"
    proc = in_process("train.py", [*TINY, "MODEL.NAME", "resnet18", "MODEL.CHECKPOINT", str(five_classes),
                                   "OUTPUT_DIR", str(out)])
    assert_user_error(proc, f"MODEL.CHECKPOINT {five_classes} does not fit MODEL.NAME resnet18")
    assert '"status": "failed"' in (out / "run.json").read_text()


def test_training_from_another_class_count_says_what_it_skipped(five_classes: Path, tmp_path: Path):
    out = tmp_path / "o"
    proc = run_tool("train.py", [*TINY, "TRAIN.MAX_STEPS", "1", "MODEL.CHECKPOINT", str(five_classes),
                                 "OUTPUT_DIR", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (out / "log.txt").read_text()
    assert "classifier left new for MODEL.NUM_CLASSES 10, skipped: fc.weight [5, 512] (the model's: [10, 512]); " \
           "fc.bias [5] (the model's: [10])" in log


def test_training_refuses_weights_of_another_architecture(five_classes: Path):
    with pytest.raises(UserError, match="does not fit MODEL.NAME resnet18 .*other shapes"):
        build_model(cfg_of("MODEL.NAME", "resnet18", "MODEL.CHECKPOINT", str(five_classes)))


def test_training_adapts_the_input_conv_to_in_chans(five_classes: Path, caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        model = build_model(cfg_of("MODEL.IN_CHANS", "1", "DATA.MEAN", "[0.5]", "DATA.STD", "[0.25]",
                                   "MODEL.CHECKPOINT", str(five_classes)))
    rgb = torch.load(five_classes)["conv1.0.weight"]
    assert torch.allclose(model.conv1[0].weight, rgb.sum(dim=1, keepdim=True))
    assert "conv1.0.weight adapted from 3 input channels to MODEL.IN_CHANS 1" in caplog.text


def test_load_weights_strips_wrapper_prefixes_and_returns_the_rest(five_classes: Path, tmp_path: Path):
    sd = torch.load(five_classes)
    path = tmp_path / "ddp.pth"
    torch.save({"model": {f"module._orig_mod.{k}": v for k, v in sd.items()}, "step": 7}, path)
    model = timm.create_model("resnet10t", num_classes=5)
    assert load_weights(model, str(path)) == {"step": 7}
    assert torch.equal(model.fc.bias, sd["fc.bias"])


# ---- 9. predict's image paths ---------------------------------------------------------------------------------
def test_predict_names_a_folder_and_a_broken_link(run: Path, tmp_path: Path, in_process):
    ckpt = str(run / "checkpoints" / "last.pth")
    folder = tmp_path / "pics"
    folder.mkdir()
    proc = in_process("predict.py", ["--cfg", str(run / "config.yaml"), "MODEL.CHECKPOINT", ckpt, str(folder)])
    assert_user_error(proc, "no image file (.jpg/.jpeg/.png/.bmp/.webp) in", str(folder))  # a folder is read whole
    link = tmp_path / "gone.jpg"
    link.symlink_to(tmp_path / "moved.jpg")
    proc = in_process("predict.py", ["--cfg", str(run / "config.yaml"), "MODEL.CHECKPOINT", ckpt, str(link)])
    assert_user_error(proc, f"image {link} is a broken symbolic link", "moved.jpg")
