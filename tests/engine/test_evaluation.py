"""Evaluation in-process: under MODEL.COMPILE the Evaluator runs a compiled module (compiled once, sharing the
weights) and gets the eager numbers."""
from __future__ import annotations

import torch
import torch.nn as nn

from runner.config import get_default_config
from runner.distributed import Dist
from runner.engine.evaluation import Evaluator, evaluate
from runner.model import compiler


class Batches:
    """Three fixed batches of 8 images 3x8x8 with labels in 0..3; `set_epoch` is the evaluation's reset."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.data = [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)]

    def set_epoch(self, *position) -> None:
        pass

    def __iter__(self):
        return iter(self.data)


class Stepper:
    """What Evaluator.validate reads of the step: the bare module, no EMA, no schedule to tell."""

    def __init__(self, module: nn.Module):
        self.bare, self.ema, self.scheduler = module, None, None


class Trainer:
    """What Evaluator.validate reads of the loop."""

    def __init__(self, module: nn.Module):
        self.stepper, self.epoch, self.step = Stepper(module), 1, 3


def test_compiled_evaluation_matches_eager():
    cfg = get_default_config()
    cfg.MODEL.COMPILE = True
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 4))
    loader = Batches()
    eager = evaluate(model, loader, torch.device("cpu"))
    dist = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    evaluator = Evaluator(loader, 1, dist, compile_fn=compiler(cfg))
    trainer = Trainer(model)
    evaluator.validate(trainer)
    evaluator.validate(trainer)
    (compiled,) = evaluator.compiled.values()  # one compile for both passes
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule) and compiled._orig_mod is model
    assert abs(evaluator.run.last_eval["val/top1"] - eager["top1"]) < 1e-9
    assert abs(evaluator.run.last_eval["val/loss"] - eager["loss"]) < 1e-4
    assert model.training  # evaluation leaves the train mode as it found it
