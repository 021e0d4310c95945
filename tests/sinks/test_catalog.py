"""A new sink is one module and one line: a toy sink registered in runner.sinks.catalog.SINKS gets every row a
short real run writes, the flushes before its checkpoints, the final results and the close. Importing a sink
module sets nothing in the process."""
from __future__ import annotations

import json
import subprocess
import sys

from runner.sinks import SINKS, Entry, Sink, SinkContext
from tests.utils import ROOT, TINY, env, read_jsonl

CFG = ["--cfg", "configs/digits/test_resnet.yaml"]
CALLS: list[tuple] = []  # what the toy sink of the latest run was called with, in order


class ToySink(Sink):
    """Records every call."""

    def __init__(self, ctx: SinkContext):
        """Note where it opens."""
        CALLS.append(("open", ctx.resume_step, ctx.total_steps))

    def write(self, step: int, epoch: int, scalars: dict[str, float]) -> None:
        """Keep the row."""
        CALLS.append(("write", step, epoch, dict(scalars)))

    def flush(self) -> None:
        """Note the checkpoint."""
        CALLS.append(("flush",))

    def finish(self, hparams: dict, metrics: dict) -> None:
        """Keep the results."""
        CALLS.append(("finish", dict(metrics)))

    def close(self) -> None:
        """Note the end."""
        CALLS.append(("close",))


open_sink = ToySink  # this module is the toy sink's module: catalog.SINKS names it


def test_a_sink_registered_with_one_line_gets_the_runs_scalars(tmp_path, monkeypatch):
    from runner.config import load_config
    from runner.engine import build_trainer

    monkeypatch.setitem(SINKS, "toy", Entry(lambda cfg: True, __name__))  # the one line
    CALLS.clear()
    out = tmp_path / "run"
    cfg = load_config([*CFG, *TINY, "TRAIN.MAX_STEPS", "6", "CHECKPOINT.PERIOD", "4", "LOG.PERIOD", "2",
                       "LOG.TENSORBOARD", "false", "OUTPUT_DIR", str(out)])[0]
    trainer = build_trainer(cfg)
    try:
        results = trainer.train()
    finally:
        trainer.close()
    assert results["status"] == "done" and results["step"] == 6
    assert CALLS[0] == ("open", 0, 6) and CALLS[-1] == ("close",)
    rows = [{"step": c[1], "epoch": c[2], **c[3]} for c in CALLS if c[0] == "write"]
    assert rows == read_jsonl(out / "metrics.jsonl") and [r["step"] for r in rows if "train/loss" in r] == [2, 4, 6]
    assert any("val/top1" in r for r in rows)
    kinds = [c[0] for c in CALLS]
    assert kinds.index("flush") > kinds.index("write")  # the checkpoint at step 4 covers the rows before it
    finish = [c[1] for c in CALLS if c[0] == "finish"]
    assert len(finish) == 1 and finish[0]["val/top1"] == json.loads((out / "results.json").read_text())["val/top1"]


def test_importing_a_sink_module_sets_nothing():
    """The MLflow sink's HTTP limits are set when it is built, not when it is imported."""
    # after `import runner` (whose own settings are another matter): what the sink modules add
    code = ("import os, runner; before = dict(os.environ); import runner.sinks, runner.sinks.mlflow_sink, "
            "runner.sinks.wandb_sink; print([k for k in os.environ if os.environ.get(k) != before.get(k)])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env(),
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"
