"""runner/optim.py: every optimizer name validation accepts builds and takes real steps; every scheduler and
clip mode does what it says, on a tiny real timm model."""
from __future__ import annotations

import importlib.util
import itertools
import math

import pytest
import timm
import torch

from runner.config import ENUMS, OPTIMIZERS, UNSUPPORTED_OPTIMIZERS, get_default_config, validate
from runner.errors import UserError
from runner.optim import build_optimizer, build_scheduler
from tests.utils import TINY, assert_user_error, run_tool

CPU = torch.device("cpu")
HAS_OPT_EINSUM = importlib.util.find_spec("opt_einsum") is not None
TRAINABLE = [n for n in OPTIMIZERS if n not in UNSUPPORTED_OPTIMIZERS]


def tiny_model() -> torch.nn.Module:
    """resnet10t, 3 classes, seeded: the smallest real timm model the tests train."""
    torch.manual_seed(0)
    return timm.create_model("resnet10t", num_classes=3)


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
    model = tiny_model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = build_optimizer(config(OPTIMIZER=name), model, CPU)
    take_steps(model, optimizer)  # two steps: adopt only initialises its second moment on the first
    assert_trained(before, model)


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
# Schedulers: 2 epochs of 5 steps, warmup over the first 2 steps
# ---------------------------------------------------------------------------------------------------------
def lrs(scheduler_name: str) -> list[float]:
    """The LR after step_update(0..10) for a 2-epoch, 5-steps-per-epoch schedule."""
    cfg = config(SCHEDULER=scheduler_name, EPOCHS=2, LR=0.1, WARMUP_EPOCHS=0.4, WARMUP_LR=0.01, MIN_LR=0.001,
                 DECAY_EPOCHS=1.0, DECAY_RATE=0.5)
    optimizer = build_optimizer(cfg, tiny_model(), CPU)
    scheduler = build_scheduler(cfg, optimizer, steps_per_epoch=5)
    out = []
    for step in range(11):
        scheduler.step_update(step)
        out.append(optimizer.param_groups[0]["lr"])
    return out


def test_every_scheduler_gives_finite_lrs_as_configured():
    assert set(ENUMS["TRAIN.SCHEDULER"]) == {"cosine", "step", "none"}  # a new name needs a case here
    cosine, step, none = lrs("cosine"), lrs("step"), lrs("none")
    for seq in (cosine, step, none):
        assert all(math.isfinite(v) and v > 0 for v in seq), seq
    assert none == [0.1] * 11
    for seq in (cosine, step):
        assert seq[0] == pytest.approx(0.01) and seq[1] == pytest.approx(0.055)  # linear warmup from WARMUP_LR
    assert cosine[2] < 0.1 and all(a >= b for a, b in itertools.pairwise(cosine[2:]))  # decays monotonically
    assert cosine[-1] == pytest.approx(0.001, abs=1e-3)  # ends near MIN_LR
    assert step[2:5] == pytest.approx([0.1] * 3) and step[5:10] == pytest.approx([0.05] * 5)


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
