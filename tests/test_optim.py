"""runner/optim.py: every optimizer name validation accepts builds and takes real steps; every scheduler and
clip mode does what it says, on a tiny real timm model."""
from __future__ import annotations

import importlib.util
import itertools
import logging
import math
import re

import pytest
import timm
import torch

from runner.config import ENUMS, OPTIMIZERS, UNSUPPORTED_OPTIMIZERS, get_default_config, validate
from runner.errors import UserError
from runner.optim import SCHEDULE_KEYS, SCHEDULES, build_optimizer, build_scheduler, reshaped_by_length
from tests.utils import TINY, assert_user_error, run_tool

CPU = torch.device("cpu")
HAS_OPT_EINSUM = importlib.util.find_spec("opt_einsum") is not None
TRAINABLE = [n for n in OPTIMIZERS if n not in UNSUPPORTED_OPTIMIZERS]


def tiny_model(name: str = "resnet10t") -> torch.nn.Module:
    """resnet10t (or another timm model), 3 classes, seeded: a small real timm model for the tests to train."""
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=3)


def config(**train):
    """A validated default config with TRAIN keys set."""
    cfg = get_default_config()
    for key, value in train.items():
        cfg.TRAIN[key] = value
    validate(cfg, check_files=False)
    return cfg


def take_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = 2, clip=None) -> None:
    """`steps` real forward/backward/step rounds on a fixed 16 px batch."""
    x, y = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0])
    for _ in range(steps):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if clip is not None:
            clip()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def assert_trained(before: list[torch.Tensor], model: torch.nn.Module) -> None:
    """Most parameters moved (some get no gradient through timm's zero-initialised last BN), all finite."""
    after = list(model.parameters())
    changed = sum(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert changed >= len(after) // 2, f"only {changed} of {len(after)} parameters changed"
    assert all(torch.isfinite(p).all() for p in after)


# ---------------------------------------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", TRAINABLE + ["lookahead_adamw", "lookahead_sgdp"])
def test_every_accepted_optimizer_builds_and_steps(name):
    if name.startswith("kron") and not HAS_OPT_EINSUM:
        pytest.skip("kron needs opt_einsum (refused in one line without it: see the test below)")
    # timm's test_resnet: the Muon family orthogonalizes every 2-D view of a weight at each step, and on
    # resnet10t's 512-channel convolutions four of these cases took minutes of the suite on 2 cores
    model = tiny_model("test_resnet")
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = build_optimizer(config(OPTIMIZER=name), model, CPU)
    take_steps(model, optimizer)  # two steps: adopt only initialises its second moment on the first
    assert_trained(before, model)


def scaled_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Three GradScaler steps on a fixed batch, the first overflowing (skipped); the weights after each."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)  # the CPU scaler drives the same optimizer paths
    x, y = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0])
    after = []
    for factor in (float("inf"), 1.0, 1.0):
        scaler.scale(torch.nn.functional.cross_entropy(model(x), y) * factor).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        after.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    return after


@pytest.mark.parametrize("name", ["sgd", "momentum", "adamw"])
def test_a_step_the_grad_scaler_skips_leaves_the_optimizer_as_unfused(name):
    """Under a GradScaler (float16 on CUDA) a skipped first step must not poison the next: torch's fused SGD keeps
    torch.empty_like momentum buffers then (NaN weights one step later), so the runner does not fuse SGD there."""
    cfg = config(OPTIMIZER=name)
    reference = tiny_model()
    expected = scaled_steps(reference, build_optimizer(config(OPTIMIZER=name, FUSED=False), reference, CPU))
    model = tiny_model()
    got = scaled_steps(model, build_optimizer(cfg, model, CPU, grad_scaler=True))
    assert torch.equal(got[0], expected[0])  # the skipped step changed nothing
    for a, b in zip(got[1:], expected[1:], strict=True):
        assert torch.isfinite(a).all()
        # fused Adam rounds differently from the loop, and Adam's update is about lr wherever a gradient is ~0:
        # a few hundred of 4.9M weights differ visibly; a poisoned state moves them all
        assert (a - b).abs().gt(1e-4).float().mean() < 1e-3


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_OPTIMIZERS) + ["lookahead_adahessian"])
def test_unsupported_optimizer_is_refused_by_validation(name):
    with pytest.raises(UserError, match=f"TRAIN.OPTIMIZER {name} is not supported"):
        config(OPTIMIZER=name)


@pytest.mark.skipif(HAS_OPT_EINSUM, reason="opt_einsum is installed: kron trains (test above)")
def test_kron_without_opt_einsum_is_one_line(tmp_path):
    proc = run_tool("train.py", [*TINY, "DATA.IMG_SIZE", "8", "TRAIN.OPTIMIZER", "kron",
                                 "OUTPUT_DIR", str(tmp_path / "o")], timeout=120)
    assert_user_error(proc, "TRAIN.OPTIMIZER kron needs the opt_einsum package")


# ---------------------------------------------------------------------------------------------------------
# Schedulers: 5 steps per epoch, real timm schedulers on a tiny model
# ---------------------------------------------------------------------------------------------------------
ALL_SCHEDULES = {"cosine", "tanh", "poly", "step", "multistep", "plateau", "constant", "none"}
SPE = 5  # steps per epoch
STALLED = {"val/top1": 50.0}  # an evaluation that never improves on the first


def schedule(name: str, model: torch.nn.Module | None = None, **train):
    """(optimizer, scheduler) for schedule `name` with TRAIN keys set, 5 steps per epoch."""
    cfg = config(SCHEDULER=name, **train)
    optimizer = build_optimizer(cfg, model if model is not None else torch.nn.Linear(4, 3), CPU)
    return optimizer, build_scheduler(cfg, optimizer, steps_per_epoch=SPE)


def lr_path(optimizer, scheduler, steps: int, evals=None) -> list[float]:
    """The LR after step_update(0..steps); `evals(step)`: an evaluation's scalars after that step, or None."""
    out = []
    for step in range(steps + 1):
        scheduler.step_update(step)
        scalars = evals(step) if evals is not None else None
        if scalars is not None:
            scheduler.observe(scalars)
        out.append(optimizer.param_groups[0]["lr"])
    return out


def lrs(name: str, **train) -> list[float]:
    """The LR after step_update(0..10) for a 2-epoch schedule with a 2-step warmup (plateau: evaluated each
    epoch, never improving)."""
    knobs = dict(EPOCHS=2, LR=0.1, WARMUP_EPOCHS=0.4, WARMUP_LR=0.01, MIN_LR=0.001, DECAY_EPOCHS=1.0,
                 DECAY_RATE=0.5, DECAY_MILESTONES=(1.0,), PLATEAU_PATIENCE=0)
    optimizer, scheduler = schedule(name, **{**knobs, **train})
    evals = (lambda step: STALLED if step % SPE == 0 else None) if name == "plateau" else None
    return lr_path(optimizer, scheduler, 10, evals)


def test_every_scheduler_gives_finite_lrs_as_configured():
    assert set(ENUMS["TRAIN.SCHEDULER"]) == ALL_SCHEDULES  # a new name needs a case here
    seqs = {name: lrs(name) for name in ALL_SCHEDULES}
    for name, seq in seqs.items():
        assert all(math.isfinite(v) and v > 0 for v in seq), (name, seq)
        if name != "none":  # linear warmup from WARMUP_LR over 2 steps (tanh's aims at its curve's value there)
            assert seq[0] == pytest.approx(0.01) and seq[1] == pytest.approx(0.055, rel=1e-3), name
    assert seqs["none"] == [0.1] * 11 and seqs["constant"][2:] == [pytest.approx(0.1)] * 9
    for name in ("cosine", "tanh", "poly"):  # decay monotonically, end at MIN_LR
        seq = seqs[name]
        assert seq[2] <= 0.1 and all(a >= b for a, b in itertools.pairwise(seq[2:])), name
        assert seq[-1] == pytest.approx(0.001, abs=1e-3), name
    for name in ("step", "multistep"):  # DECAY_EPOCHS 1 / DECAY_MILESTONES [1]: halved after the first epoch
        assert seqs[name][2:5] == pytest.approx([0.1] * 3) and seqs[name][5:10] == pytest.approx([0.05] * 5)
    # plateau: evaluations at steps 0 (warmup: not counted), 5 (the first: best), 10 (no better: patience 0)
    assert seqs["plateau"][2:10] == pytest.approx([0.1] * 8) and seqs["plateau"][10] == pytest.approx(0.05)


def test_only_cosine_tanh_and_poly_follow_the_length():
    shaped = {name for name in ALL_SCHEDULES if SCHEDULES[name].length_shaped}
    assert shaped == {"cosine", "tanh", "poly"}
    for name in ALL_SCHEDULES:
        assert reshaped_by_length(config(SCHEDULER=name, EPOCHS=20), 10) == (name in shaped)


def test_step_and_multistep_drop_at_their_epochs_by_the_rate():
    _, path = None, lr_path(*schedule("step", EPOCHS=6, DECAY_EPOCHS=2.0, DECAY_RATE=0.5), 30)
    assert path == pytest.approx([0.1 * 0.5 ** (s // 10) for s in range(31)])
    path = lr_path(*schedule("multistep", EPOCHS=6, DECAY_MILESTONES=(1.0, 4.0), DECAY_RATE=0.1), 30)
    # after 1 and after 4 whole epochs (steps 5 and 20), as step and torch's MultiStepLR count
    assert path == pytest.approx([0.1] * 5 + [0.01] * 15 + [0.001] * 11)


@pytest.mark.parametrize("power", [0.5, 1.0, 2.0])
def test_poly_decays_with_its_power(power):
    path = lr_path(*schedule("poly", EPOCHS=2, POLY_POWER=power), 10)
    assert path == pytest.approx([0.1 * (1 - s / 10) ** power for s in range(11)])


@pytest.mark.parametrize("name", ["cosine", "tanh", "poly"])
def test_cycles_restart_with_their_decay_and_fill_the_run(name):
    power = {"POLY_POWER": 2.0} if name == "poly" else {}  # poly's default 0.5 falls late, at each cycle's end
    path = lr_path(*schedule(name, EPOCHS=4, CYCLE_LIMIT=2, CYCLE_DECAY=0.5, MIN_LR=0.001, **power), 20)
    assert path[0] == pytest.approx(0.1) and path[10] == pytest.approx(0.05)  # 2 cycles of 2 epochs
    assert path[9] < 0.02 and path[19] < 0.02 and path[20] == pytest.approx(0.001)
    # CYCLE_MUL 2: 3 epochs as 1 + 2
    path = lr_path(*schedule(name, EPOCHS=3, CYCLE_LIMIT=2, CYCLE_MUL=2.0, CYCLE_DECAY=0.5, MIN_LR=0.001, **power),
                   15)
    assert path[5] == pytest.approx(0.05) and path[4] < path[5] and path[14] < 0.01
    assert path[15] == pytest.approx(0.001)


@pytest.mark.parametrize("name", ["cosine", "tanh", "poly"])
def test_cooldown_holds_min_lr_for_its_epochs(name):
    path = lr_path(*schedule(name, EPOCHS=4, COOLDOWN_EPOCHS=1.0, MIN_LR=0.001), 20)
    assert path[15:] == pytest.approx([0.001] * 6) and path[14] > 0.001  # the cycle ends after 3 epochs
    assert path[0] == pytest.approx(0.1) and all(a >= b for a, b in itertools.pairwise(path))


def test_k_decay_holds_the_lr_longer():
    plain, k = (lr_path(*schedule("cosine", EPOCHS=2, K_DECAY=kd), 10) for kd in (1.0, 2.0))
    assert all(b >= a for a, b in zip(plain[1:9], k[1:9], strict=True)) and k[5] > plain[5]


def test_plateau_lowers_the_lr_after_patience_evaluations_without_improvement():
    optimizer, sched = schedule("plateau", PLATEAU_PATIENCE=2, DECAY_RATE=0.5, MIN_LR=0.02)
    seen = []
    for value in (1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3):
        sched.observe({"val/top1": float(value), "val/loss": 0.0})
        seen.append(optimizer.param_groups[0]["lr"])
    # best 1, best 2, two tolerated, the third lowers; best 3, three more lower again ... down to MIN_LR
    assert seen == pytest.approx([0.1] * 4 + [0.05] * 4 + [0.025] * 3 + [0.02] * 3)


def test_plateau_cooldown_and_a_loss_metric():
    optimizer, sched = schedule("plateau", PLATEAU_PATIENCE=0, PLATEAU_COOLDOWN=2, DECAY_RATE=0.5)
    for _ in range(5):  # lowered, 2 evaluations of cooldown, lowered, cooldown
        sched.observe(STALLED)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    cfg = config(SCHEDULER="plateau", PLATEAU_PATIENCE=0)  # BEST_MODE auto: a loss is better lower
    cfg.defrost()
    cfg.CHECKPOINT.BEST_METRIC = "val/loss"
    optimizer = build_optimizer(cfg, torch.nn.Linear(4, 3), CPU)
    sched = build_scheduler(cfg, optimizer, SPE)
    for loss in (2.0, 1.0, 0.5):
        sched.observe({"val/top1": 0.0, "val/loss": loss})
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    sched.observe({"val/top1": 0.0, "val/loss": 0.6})
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_plateau_without_its_metric_warns_once_and_keeps_the_lr(caplog):
    optimizer, sched = schedule("plateau", PLATEAU_PATIENCE=0)
    with caplog.at_level(logging.WARNING, logger="runner"):
        for _ in range(3):
            sched.observe({"val/loss": 1.0})
    assert [r.getMessage() for r in caplog.records] == ["TRAIN.SCHEDULER plateau: the evaluation has no val/top1; "
                                                         "the LR stays"]
    assert optimizer.param_groups[0]["lr"] == 0.1


RESUME_KNOBS = {  # each schedule with its knobs away from the defaults, 6 epochs of 5 steps, a 1-epoch warmup
    "cosine": dict(CYCLE_LIMIT=2, CYCLE_MUL=1.5, K_DECAY=1.5, COOLDOWN_EPOCHS=1.0, MIN_LR=0.001),
    "tanh": dict(CYCLE_LIMIT=2, COOLDOWN_EPOCHS=1.0, MIN_LR=0.001),
    "poly": dict(POLY_POWER=2.0, CYCLE_LIMIT=3, CYCLE_DECAY=0.7, COOLDOWN_EPOCHS=0.6),
    "step": dict(DECAY_EPOCHS=1.4, DECAY_RATE=0.5),
    "multistep": dict(DECAY_MILESTONES=(2.0, 3.6, 5.0), DECAY_RATE=0.3),
    "plateau": dict(PLATEAU_PATIENCE=1, PLATEAU_COOLDOWN=1, DECAY_RATE=0.5, MIN_LR=0.004),
    "constant": {}, "none": {},
}
# an evaluation every 2 steps: better, then stalled for a while, better again ... (plateau's counters all move)
EVALS = [1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4]


def evaluation(step: int) -> dict | None:
    """The scalars of the evaluation after `step`, if one is due."""
    return {"val/top1": float(EVALS[step // 2 % len(EVALS)])} if step % 2 == 0 else None


def stepped(name: str, resume_at: int | None = None, steps: int = 30) -> list[float]:
    """The LR after each step of a TrainStep on `name`'s schedule; with `resume_at`, its checkpoint then is
    loaded into a TrainStep built anew, which steps on (as a killed run resumed does)."""
    from runner.engine.step import TrainStep

    def fresh() -> TrainStep:
        """A step with a newly built optimizer and schedule."""
        model = torch.nn.Linear(4, 3)
        optimizer, sched = schedule(name, model, EPOCHS=6, WARMUP_EPOCHS=1.0, WARMUP_LR=0.001, **RESUME_KNOBS[name])
        return TrainStep(model, optimizer, scheduler=sched)

    stepper, out = fresh(), []
    for step in range(1, steps + 1):
        if step == resume_at:  # the checkpoint after step - 1, loaded as TrainStep.load_state_dict does at a resume
            state = {**stepper.state_dict(), "step": step - 1}
            stepper = fresh()
            stepper.load_state_dict(state)
        stepper.step = step
        stepper.scheduler.step_update(step)
        if evaluation(step) is not None and hasattr(stepper.scheduler, "observe"):
            stepper.scheduler.observe(evaluation(step))
        out.append([g["lr"] for g in stepper.optimizer.param_groups])
    return out


@pytest.mark.parametrize("name", sorted(ALL_SCHEDULES))
def test_a_resume_mid_run_gives_the_lrs_of_the_run_left_alone(name):
    alone = stepped(name)
    assert len({lr[0] for lr in alone}) > (0 if name == "none" else 2), alone  # the schedule moves
    for k in (3, 5, 12, 19, 27):  # in the warmup, at its end, mid-run, in a cooldown
        assert stepped(name, resume_at=k) == alone, (name, k)


def test_plateau_state_is_all_of_its_counters():
    _, sched = schedule("plateau", PLATEAU_PATIENCE=3, PLATEAU_COOLDOWN=2)
    for value in (1.0, 2.0, 2.0):
        sched.observe({"val/top1": value})
    state = sched.state_dict()
    assert state["plateau"]["best"] == 2.0 and state["plateau"]["num_bad_epochs"] == 1 and state["started"]
    _, fresh = schedule("plateau", PLATEAU_PATIENCE=3, PLATEAU_COOLDOWN=2)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    assert fresh.plateau.patience == 3  # the knobs stay the config's


@pytest.mark.parametrize("key, value, words", [
    ("DECAY_MILESTONES", "[60, 30]", "TRAIN.DECAY_MILESTONES must be a non-empty list of increasing epochs > 0"),
    ("DECAY_MILESTONES", "[]", "TRAIN.DECAY_MILESTONES must be a non-empty list"),
    ("DECAY_MILESTONES", "[0, 10]", "TRAIN.DECAY_MILESTONES must be a non-empty list"),
    ("DECAY_MILESTONES", "30", "TRAIN.DECAY_MILESTONES expects a list"),
    ("POLY_POWER", "-1", "TRAIN.POLY_POWER must be > 0, got -1.0"),
    ("CYCLE_LIMIT", "0", "TRAIN.CYCLE_LIMIT must be >= 1"),
    ("CYCLE_MUL", "0", "TRAIN.CYCLE_MUL must be > 0"),
    ("CYCLE_DECAY", "1.5", "TRAIN.CYCLE_DECAY must be in (0, 1]"),
    ("K_DECAY", "0", "TRAIN.K_DECAY must be > 0"),
    ("COOLDOWN_EPOCHS", "-1", "TRAIN.COOLDOWN_EPOCHS must be >= 0"),
    ("PLATEAU_PATIENCE", "-2", "TRAIN.PLATEAU_PATIENCE must be >= 0"),
    ("PLATEAU_COOLDOWN", "1.5", "TRAIN.PLATEAU_COOLDOWN expects an integer"),
])
def test_schedule_knob_mistakes_are_one_line(key, value, words):
    from runner.config import load_config

    with pytest.raises(UserError, match=re.escape(words)) as err:
        load_config([f"TRAIN.{key}", value, "OUTPUT_DIR", "x"])
    assert "\n" not in str(err.value) and "(command line)" in str(err.value)


@pytest.mark.parametrize("argv, words", [
    (["TRAIN.SCHEDULER", "cosine", "TRAIN.EPOCHS", "10", "TRAIN.WARMUP_EPOCHS", "2", "TRAIN.COOLDOWN_EPOCHS", "8"],
     "TRAIN.WARMUP_EPOCHS (2.0) + TRAIN.COOLDOWN_EPOCHS (8.0) must be less than TRAIN.EPOCHS (10)"),
    (["TRAIN.SCHEDULER", "plateau", "TRAIN.DECAY_RATE", "1"], "TRAIN.SCHEDULER plateau needs TRAIN.DECAY_RATE < 1"),
])
def test_schedule_rules_across_keys(argv, words):
    from runner.config import load_config

    with pytest.raises(UserError, match=re.escape(words)):
        load_config([*argv, "OUTPUT_DIR", "x"])
    load_config([*argv[:2], "OUTPUT_DIR", "x"])  # the schedule alone is fine
    if argv[1] == "cosine":  # a cooldown only cosine, tanh and poly read is not held against step
        load_config(["TRAIN.SCHEDULER", "step", *argv[2:], "OUTPUT_DIR", "x"])


def test_a_bad_milestone_through_train_py_is_exit_2(tmp_path, in_process):
    proc = in_process("train.py", [*TINY, "TRAIN.SCHEDULER", "multistep", "TRAIN.DECAY_MILESTONES", "[3, 2]",
                                   "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, "TRAIN.DECAY_MILESTONES must be a non-empty list of increasing epochs > 0",
                      "got [3.0, 2.0] (command line)")


def test_a_knob_the_schedule_does_not_read_is_warned_about_once(caplog):
    with caplog.at_level(logging.WARNING, logger="runner"):
        schedule("cosine", DECAY_EPOCHS=2.0, DECAY_MILESTONES=(1.0, 2.0), COOLDOWN_EPOCHS=1.0)
        schedule("step", DECAY_EPOCHS=2.0, WARMUP_EPOCHS=1.0)
        schedule("none", WARMUP_EPOCHS=1.0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("TRAIN.SCHEDULER cosine ignores TRAIN.DECAY_EPOCHS 2.0, TRAIN.DECAY_MILESTONES (1.0, ")
    assert "COOLDOWN" not in lines[0] and lines[1].startswith("TRAIN.SCHEDULER none ignores TRAIN.WARMUP_EPOCHS 1.0")
    assert len(lines) == 2  # step reads both of its knobs


def test_help_keys_train_says_what_each_knob_does():
    from runner.config.key_help import help_keys_text

    text = help_keys_text("TRAIN")
    for key in SCHEDULE_KEYS:
        block = text.split(f"TRAIN.{key} = ", 1)[1].split("\nTRAIN.", 1)[0]
        assert len(block.splitlines()) >= 2, f"TRAIN.{key} has no comment"
    for name in ALL_SCHEDULES:
        assert name in text.split("TRAIN.SCHEDULER = ", 1)[1].split("\nTRAIN.WARMUP_EPOCHS", 1)[0], name


# ---------------------------------------------------------------------------------------------------------
# Gradient clipping through the run's own step (runner.engine), as tools/benchmark.py drives it
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ENUMS["TRAIN.CLIP_MODE"])
def test_every_clip_mode_through_the_training_step(tmp_path, mode):
    from runner.config import load_config
    from runner.engine import build_trainer

    cfg, _ = load_config(["DATA.NAME", "synthetic", "DATA.SYNTHETIC_SIZE", "32", "DATA.BATCH_SIZE", "8",
                          "DATA.IMG_SIZE", "16", "MODEL.NAME", "resnet10t", "MODEL.NUM_CLASSES", "3",
                          "DATA.NUM_WORKERS", "0", "TRAIN.CLIP_GRAD", "0.01", "TRAIN.CLIP_MODE", mode,
                          "TRAIN.OPTIMIZER", "sgdp", "OUTPUT_DIR", str(tmp_path / "o")])
    trainer = build_trainer(cfg, hooks=[])
    try:
        before = [p.detach().clone() for p in trainer.stepper.bare.parameters()]
        x, y = next(iter(trainer.data.train))
        assert trainer.stepper.train_batch(x, y, True) and trainer.stepper.train_batch(x, y, True)  # two steps
        assert_trained(before, trainer.stepper.bare)
    finally:
        trainer.close()


# ---------------------------------------------------------------------------------------------------------
# Layer-wise LR decay (TRAIN.LAYER_DECAY) through timm's parameter groups
# ---------------------------------------------------------------------------------------------------------
def tiny_vit() -> torch.nn.Module:
    """A 2-block ViT at 32 px: 4 depths of parameters (embedding, block 0, block 1, head)."""
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=3)


def test_layer_decay_groups_are_timms():
    from timm.optim import param_groups_layer_decay

    model = tiny_vit()
    cfg = config(LAYER_DECAY=0.5, OPTIMIZER="adamw", LR=0.1)
    groups = build_optimizer(cfg, model, CPU).param_groups
    want = param_groups_layer_decay(model, weight_decay=cfg.TRAIN.WEIGHT_DECAY, layer_decay=0.5,
                                    no_weight_decay_list=model.no_weight_decay())
    got = [(g["lr_scale"], g["weight_decay"], [id(p) for p in g["params"]]) for g in groups]
    assert got == [(g["lr_scale"], g["weight_decay"], [id(p) for p in g["params"]]) for g in want]
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    assert scale[id(model.head.weight)] == 1.0 and scale[id(model.blocks[1].attn.qkv.weight)] == 0.5
    assert scale[id(model.blocks[0].attn.qkv.weight)] == 0.25 and scale[id(model.patch_embed.proj.weight)] == 0.125


def test_layer_decay_off_by_default_keeps_one_scale():
    groups = build_optimizer(config(OPTIMIZER="adamw"), tiny_vit(), CPU).param_groups
    assert all("lr_scale" not in g for g in groups) and {g["lr"] for g in groups} == {0.1}


@pytest.mark.parametrize("sched", ENUMS["TRAIN.SCHEDULER"])
def test_every_scheduler_keeps_the_layer_scale(sched):
    model = tiny_vit()
    cfg = config(LAYER_DECAY=0.5, OPTIMIZER="adamw", LR=0.1, SCHEDULER=sched, WARMUP_EPOCHS=1.0, EPOCHS=4,
                 DECAY_EPOCHS=1.0)
    optimizer = build_optimizer(cfg, model, CPU)
    scheduler = build_scheduler(cfg, optimizer, steps_per_epoch=5)
    for step in (1, 7, 12):
        scheduler.step_update(step)
        lr = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
        head = lr[id(model.head.weight)]
        assert lr[id(model.blocks[1].mlp.fc1.weight)] == pytest.approx(head * 0.5)
        assert lr[id(model.patch_embed.proj.weight)] == pytest.approx(head * 0.125)
        assert head == pytest.approx(0.1) if sched == "none" else 0 < head <= 0.1


TOY_SCHEDULE = '''
class HalfLR:
    """Half the optimizer's LR from the first step on (timm's scheduler interface)."""

    def __init__(self, optimizer):
        self.optimizer, self.base = optimizer, [g["lr"] for g in optimizer.param_groups]

    def step_update(self, num_updates):
        for group, base in zip(self.optimizer.param_groups, self.base):
            group["lr"] = base / 2

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def build(cfg, optimizer, steps_per_epoch):
    return HalfLR(optimizer)
'''


@pytest.fixture
def half_schedule(tmp_path, monkeypatch):
    """A schedule in a module of its own, registered with its one line (removed from the table afterwards)."""
    from runner import optim

    (tmp_path / "half_lr.py").write_text(TOY_SCHEDULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import half_lr

    yield optim.register_schedule("half", half_lr.build)  # the one line
    optim.SCHEDULES.pop("half")


def test_a_new_schedule_is_one_module_and_one_line_and_trains(half_schedule, tmp_path):
    from runner.config import load_config
    from runner.engine import build_trainer

    cfg, _ = load_config(["DEVICE", "cpu", "DATA.NAME", "synthetic", *TINY, "DATA.BATCH_SIZE", "8",
                          "TRAIN.SCHEDULER", "half", "TRAIN.LR", "0.2", "TRAIN.MAX_STEPS", "2",
                          "OUTPUT_DIR", str(tmp_path / "run")])
    trainer = build_trainer(cfg, hooks=[])
    try:
        trainer.run_until(2)
    finally:
        trainer.close()
    assert [g["lr"] for g in trainer.stepper.optimizer.param_groups][0] == pytest.approx(0.1)
    assert "half" in ENUMS["TRAIN.SCHEDULER"]


# ---------------------------------------------------------------------------------------------------------
# plateau end to end: tools/train.py on the digits, SIGKILLed in its third epoch and run again
# ---------------------------------------------------------------------------------------------------------
# an evaluation every 3 steps at a high LR: the val top-1 stalls now and then. Killed at step 45 (one process, 1
# thread: the tests' environment), the best is 3 evaluations old (step 42) and 2 did not improve on it (44 and
# 45): the one at step 48 lowers the LR; with the counters lost it would count as an improvement
PLATEAU_RUN = ["MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "64", "DATA.NUM_WORKERS", "0",
               "TRAIN.EPOCHS", "3", "TRAIN.LR", "0.4", "TRAIN.WARMUP_EPOCHS", "0", "TRAIN.SCHEDULER", "plateau",
               "TRAIN.PLATEAU_PATIENCE", "2", "TRAIN.DECAY_RATE", "0.5", "EVAL.PERIOD_STEPS", "3",
               "CHECKPOINT.PERIOD", "3", "LOG.PERIOD", "1", "LOG.PROGRESS", "plain", "CUDNN.DETERMINISTIC", "true",
               "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9"]  # assert_same_run compares an EMA too


@pytest.mark.slow
def test_plateau_run_killed_in_its_third_epoch_resumes_exactly(tmp_path):
    import signal
    import sys

    from tests.engine.test_resume import DIGITS, RESUMED, STEPS_PER_EPOCH, Launch, assert_same_run, train_rows
    from tests.utils import TRAIN, wait_last_checkpoint

    ref, out = tmp_path / "alone", tmp_path / "killed"
    argv = [sys.executable, TRAIN, "--cfg", DIGITS, *PLATEAU_RUN, "OUTPUT_DIR"]
    launches = [Launch([*argv, str(ref)], tmp_path, "alone"), Launch([*argv, str(out)], tmp_path, "killed")]
    try:
        launches[1].wait_step(2 * STEPS_PER_EPOCH + 1)
        # epoch 2's checkpoint is written in the background (CHECKPOINT.ASYNC): the kill comes once a resume
        # would read it (last.pth is linked to it after its file appears; CI once killed in between)
        wait_last_checkpoint(out, 2 * STEPS_PER_EPOCH, launches[1].p)
        launches[1].p.send_signal(signal.SIGKILL)
        assert launches[1].finish(60) == -signal.SIGKILL
        launches.append(Launch([*argv, str(out)], tmp_path, "resumed"))
        for run in launches[::2]:
            assert run.finish() == 0, run.stdout[-3000:] + run.stderr
    finally:
        for run in launches:
            if run.p.poll() is None:
                run.kill_all()
    resumed_at = int(RESUMED.search(launches[2].stdout).group(4))
    assert 2 * STEPS_PER_EPOCH <= resumed_at, launches[2].stdout[-3000:]
    assert_same_run(out, ref)
    lrs = [row["train/lr"] for row in train_rows(ref)]  # one row per step, from step 1
    assert min(lrs[resumed_at:]) < lrs[resumed_at - 1], lrs  # the restored counters decided a drop
