"""Issue 16's recipe keys over timm: gradient checkpointing, evaluation at another size, the BCE loss, and
their one-line refusals. (Layer decay: tests/test_optim.py.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from timm.loss import BinaryCrossEntropy, SoftTargetCrossEntropy

from runner.config import get_default_config, load_config, validate
from runner.data.folder import build_folder_datasets
from runner.engine import build_trainer
from runner.engine.build import build_loss
from runner.engine.evaluation import evaluate
from runner.errors import UserError
from runner.model import build_model
from tests.data.fixtures import export_digits_jpegs
from tests.utils import TRAIN, assert_user_error, merge_pairs, run_tool


def tiny_cfg(**overrides):
    """A validated, frozen config for a tiny synthetic run (resnet10t, 32 px, batches of 8)."""
    cfg = get_default_config()
    merge_pairs(cfg, ["DATA.NAME", "synthetic", "DATA.SYNTHETIC_SIZE", 16, "DATA.BATCH_SIZE", 8,
                         "DATA.IMG_SIZE", 32, "MODEL.NAME", "resnet10t", "OUTPUT_DIR", "/nonexistent-not-written"])
    merge_pairs(cfg, [x for pair in overrides.items() for x in pair])
    validate(cfg, check_files=False)
    cfg.freeze()
    return cfg


def two_steps(cfg) -> tuple[torch.Tensor, object]:
    """Train two optimizer steps on the first two batches; the summed loss and the trainer."""
    trainer = build_trainer(cfg, hooks=[])
    trainer.data.train.set_epoch(0)
    batches = iter(trainer.data.train)
    for _ in range(2):
        x, y = next(batches)
        assert trainer.stepper.train_batch(x, y, last=True)
    return trainer.stepper.loss_sum.detach().clone(), trainer


# ---------------------------------------------------------------------------------------------------------
# MODEL.GRAD_CHECKPOINTING
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["resnet10t", "vit_tiny_patch16_224"])
def test_grad_checkpointing_trains_to_the_same_loss(name):
    plain, a = two_steps(tiny_cfg(**{"MODEL.NAME": name}))
    checkpointed, b = two_steps(tiny_cfg(**{"MODEL.NAME": name, "MODEL.GRAD_CHECKPOINTING": True}))
    assert b.stepper.bare.grad_checkpointing and not a.stepper.bare.grad_checkpointing
    assert torch.isfinite(plain) and torch.allclose(plain, checkpointed, rtol=1e-5, atol=1e-6)
    for p, q in zip(a.stepper.bare.parameters(), b.stepper.bare.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)


def test_grad_checkpointing_unsupported_is_one_line(tmp_path):
    proc = run_tool(TRAIN, ["MODEL.NAME", "dla46_c", "MODEL.GRAD_CHECKPOINTING", "true", "DATA.NAME", "synthetic",
                            "DATA.SYNTHETIC_SIZE", "16", "DATA.BATCH_SIZE", "8", "TRAIN.EPOCHS", "1",
                            "DATA.NUM_WORKERS", "0", "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, "MODEL.GRAD_CHECKPOINTING", "dla46_c", "does not support")


# ---------------------------------------------------------------------------------------------------------
# EVAL.IMG_SIZE and EVAL.CROP_PCT
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["resnet10t", "vit_tiny_patch16_224"])
def test_eval_at_another_size(name, capsys):
    _, trainer = two_steps(tiny_cfg(**{"MODEL.NAME": name, "EVAL.IMG_SIZE": 48}))
    assert "evaluating at 48 px (EVAL.IMG_SIZE), training at 32 px" in capsys.readouterr().out  # the run's log
    x, _ = next(iter(trainer.data.train))
    assert x.shape[-2:] == (32, 32)
    trainer.data.val.set_epoch(0)
    seen = []
    trainer.stepper.model.register_forward_pre_hook(lambda m, args: seen.append(tuple(args[0].shape[-2:])))
    res = evaluate(trainer.stepper.model, trainer.data.val, torch.device("cpu"))
    assert res["count"] == 8 and set(seen) == {(48, 48)}  # synthetic val: max(batch, n // 4) images


def test_eval_size_unset_is_the_training_size():
    cfg = tiny_cfg(**{"MODEL.NAME": "vit_tiny_patch16_224"})
    trainer = build_trainer(cfg, hooks=[])
    assert next(iter(trainer.data.val))[0].shape[-2:] == (32, 32)
    assert not trainer.stepper.bare.dynamic_img_size  # the model is built exactly as before the key existed


def test_folder_eval_size_and_crop(tmp_path):
    root = export_digits_jpegs(tmp_path / "d", size=40, per_class=2)
    base = {"DATA.NAME": "folder", "DATA.ROOT": str(root), "DATA.IMG_SIZE": 16}
    _, val, _ = build_folder_datasets(tiny_cfg(**base, **{"EVAL.IMG_SIZE": 24, "EVAL.CROP_PCT": 0.5}))
    assert val[0][0].shape == (3, 24, 24)
    resize = val.transform.transforms[0]
    assert getattr(resize, "size", None) in (48, [48], (48, 48))  # 24 / 0.5: timm's resize before the crop
    _, val, _ = build_folder_datasets(tiny_cfg(**base))
    assert val[0][0].shape == (3, 16, 16)


def test_vit_eval_size_must_fit_its_patches():
    with pytest.raises(UserError, match="EVAL.IMG_SIZE 40 is not a multiple of 16"):
        build_model(tiny_cfg(**{"MODEL.NAME": "vit_tiny_patch16_224", "EVAL.IMG_SIZE": 40}))


# ---------------------------------------------------------------------------------------------------------
# TRAIN.LOSS bce
# ---------------------------------------------------------------------------------------------------------
def test_bce_loss_as_timm_pairs_it():
    mixup, loss = build_loss(tiny_cfg(**{"TRAIN.LOSS": "bce", "TRAIN.LABEL_SMOOTHING": 0.1,
                                         "TRAIN.BCE_TARGET_THRESH": 0.2}))
    assert mixup is None and isinstance(loss, BinaryCrossEntropy)
    assert loss.smoothing == 0.1 and loss.target_threshold == 0.2
    mixup, loss = build_loss(tiny_cfg(**{"TRAIN.LOSS": "bce", "TRAIN.LABEL_SMOOTHING": 0.1, "AUG.MIXUP": 0.2}))
    assert mixup.label_smoothing == 0.1 and loss.smoothing == 0.0 and loss.target_threshold is None
    assert isinstance(build_loss(tiny_cfg(**{"AUG.MIXUP": 0.2}))[1], SoftTargetCrossEntropy)


@pytest.mark.parametrize("extra", [{}, {"AUG.MIXUP": 0.8, "AUG.CUTMIX": 1.0, "TRAIN.BCE_TARGET_THRESH": 0.2}])
def test_bce_trains_two_steps(extra):
    loss, trainer = two_steps(tiny_cfg(**{"TRAIN.LOSS": "bce", **extra}))
    assert isinstance(trainer.stepper.criterion, BinaryCrossEntropy) and torch.isfinite(loss) and loss > 0


# ---------------------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, fragments", [
    (["TRAIN.LOSS", "nll"], ["TRAIN.LOSS must be one of ce|bce"]),
    (["TRAIN.LAYER_DECAY", "1.5"], ["TRAIN.LAYER_DECAY must be in [0, 1]"]),
    (["TRAIN.BCE_TARGET_THRESH", "0.2"], ["TRAIN.BCE_TARGET_THRESH", "needs TRAIN.LOSS bce"]),
    (["TRAIN.LOSS", "bce", "TRAIN.BCE_TARGET_THRESH", "1"], ["TRAIN.BCE_TARGET_THRESH must be in [0, 1)"]),
    (["EVAL.IMG_SIZE", "-1"], ["EVAL.IMG_SIZE must be in [0, 8192]"]),
    (["EVAL.CROP_PCT", "1.2"], ["EVAL.CROP_PCT must be in [0, 1]"]),
    (["MODEL.GRAD_CHECKPOINTING", "maybe"], ["MODEL.GRAD_CHECKPOINTING expects true or false"]),
])
def test_bad_values_are_one_line(tmp_path, args, fragments, in_process):
    assert_user_error(in_process(TRAIN, args + ["OUTPUT_DIR", str(tmp_path / "o")]), *fragments)


# ---------------------------------------------------------------------------------------------------------
# The recipe configs: configs/imagenet/*.yaml and configs/finetune/*.yaml
# ---------------------------------------------------------------------------------------------------------
RECIPES = sorted(p for p in (Path(__file__).parents[1] / "configs").glob("[if]*/*.yaml") if p.name != "base.yaml")
# Only the data and the size change: every training feature a recipe turns on (its loss, mixup, repeated
# augmentation, layer decay, clipping, bf16 autocast, channels_last, drop path) stays on.
TINY = ["DATA.NAME", "synthetic", "DATA.SYNTHETIC_SIZE", "32", "DATA.BATCH_SIZE", "4", "DATA.NUM_WORKERS", "0",
        "DATA.ROOT", "", "MODEL.NUM_CLASSES", "5", "OUTPUT_DIR", "/nonexistent-not-written"]
# ViT-style models need the image to fit their patches (and Swin its windows): the smallest size that does
SIZES = {"swin_tiny_patch4_window7_224": 224, "deit_small_patch16_224": 32, "vit_small_patch16_224": 32}


def test_every_recipe_is_listed():
    names = {p.relative_to(p.parents[1]).as_posix() for p in RECIPES}
    assert {"imagenet/resnet50_a3.yaml", "imagenet/deit_small.yaml", "imagenet/convnext_tiny.yaml",
            "imagenet/swin_tiny.yaml", "finetune/resnet50.yaml", "finetune/vit_small.yaml"} <= names


def recipe_cfg(path: Path, *extra: str):
    """The recipe shrunk to TINY: images of the smallest size its model takes, evaluation 1.5x larger when the
    recipe evaluates at another size than it trains (RSB A3)."""
    cfg, _ = load_config(["--cfg", str(path), *TINY], check_paths=False)
    size = SIZES.get(cfg.MODEL.NAME, 32)
    eval_size = size * 3 // 2 if cfg.EVAL.IMG_SIZE not in (0, cfg.DATA.IMG_SIZE) else 0
    return load_config(["--cfg", str(path), *TINY, "DATA.IMG_SIZE", str(size), "EVAL.IMG_SIZE", str(eval_size),
                        *extra], check_paths=False)[0]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_recipe_trains_two_steps(path, tmp_path, capsys):
    cfg = recipe_cfg(path)
    if path.parent.name == "finetune":  # fine-tuning starts from weights whose classifier has another size
        weights = tmp_path / "w.pth"
        arch = cfg.MODEL.NAME.split(".")[0]  # the recipe's Hub weights stand in for a local file: never downloaded
        torch.save(build_model(recipe_cfg(path, "MODEL.NUM_CLASSES", "3", "MODEL.NAME", arch,
                                          "MODEL.PRETRAINED", "false")).state_dict(), weights)
        cfg = recipe_cfg(path, "MODEL.CHECKPOINT", str(weights))
    loss, trainer = two_steps(cfg)
    assert torch.isfinite(loss) and loss > 0
    assert cfg.AMP.ENABLED and cfg.MODEL.CHANNELS_LAST  # base.yaml's precision and layout are exercised
    if path.parent.name == "finetune":
        assert "classifier left new for MODEL.NUM_CLASSES 5" in capsys.readouterr().out
        assert len({g["lr"] for g in trainer.stepper.optimizer.param_groups}) > 2  # layer decay's groups


@pytest.mark.slow
def test_finetune_recipe_on_a_folder_beats_scratch(tmp_path):
    """configs/finetune/base.yaml on a 5-class digits folder with 8 images a class, from weights a 10-class digits
    run saved: the classifier is left new (the log says so), and fine-tuning beats training from scratch."""
    pre = tmp_path / "pre"
    proc = run_tool(TRAIN, ["--cfg", "configs/digits/resnet18.yaml", "TRAIN.EPOCHS", "4", "LOG.PERIOD", "50",
                            "DATA.NUM_WORKERS", "0", "OUTPUT_DIR", str(pre)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = export_digits_jpegs(tmp_path / "folder", size=24, per_class=10)
    for split in ("train", "val"):
        for digit in "56789":
            shutil.rmtree(root / split / digit)
    common = ["--cfg", "configs/finetune/base.yaml", "MODEL.NAME", "test_resnet", "MODEL.NUM_CLASSES", "5",
              "DATA.ROOT", str(root), "DATA.IMG_SIZE", "24", "DATA.BATCH_SIZE", "8", "DATA.NUM_WORKERS", "0",
              "TRAIN.EPOCHS", "6", "AUG.SCALE", "[0.8, 1.0]", "AUG.HFLIP", "0.0", "AUG.CROP_PCT", "1.0",
              "LOG.PERIOD", "5"]
    tuned = run_tool(TRAIN, common + ["MODEL.CHECKPOINT", str(pre / "checkpoints" / "last.pth"),
                                      "OUTPUT_DIR", str(tmp_path / "tuned")])
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    assert "classifier left new for MODEL.NUM_CLASSES 5" in tuned.stdout + tuned.stderr
    scratch = run_tool(TRAIN, common + ["OUTPUT_DIR", str(tmp_path / "scratch")])
    assert scratch.returncode == 0, scratch.stderr[-2000:]
    top1 = {name: json.loads((tmp_path / name / "results.json").read_text())["val/top1"]
            for name in ("tuned", "scratch")}
    print("fine-tuned vs scratch val/top1:", top1)
    assert top1["tuned"] >= 80 and top1["tuned"] > top1["scratch"] + 20
