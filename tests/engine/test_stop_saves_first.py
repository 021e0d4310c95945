"""A stop signal saves first: one that comes at an epoch's last step, or during that epoch end's evaluation, saves
with the end owed and exits 75 without waiting for the evaluation; the rerun evaluates once, first, and the run ends
as the one left alone (the real tools/train.py, its val split made slow by a source named in IMPORTS)."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.engine.test_resume import BASE, EXIT_PREEMPTED, RESUMED, STEPS_PER_EPOCH, Launch, assert_same_run, val_rows
from tests.engine.test_resume_window import PINNED, logged_rows
from tests.utils import TRAIN, wait_until

SLEEP_S = 2.0  # each val batch comes this late; one batch per pass, two passes (the model, its EMA) per evaluation
EVAL_S = 2 * SLEEP_S  # what an epoch end's evaluation takes at least

# DATA.NAME slowdigits: the digits, the val loader slow; each pass's start is a line in OUTPUT_DIR.evals (the event)
SLOW_SOURCE = f'''
import time
from pathlib import Path

from runner.data import digits, sources


class SlowVal:
    """The val loader, each batch {SLEEP_S} s late; a line in `marker` at each pass's start."""

    def __init__(self, inner, marker):
        self.inner, self.marker = inner, marker

    def __len__(self):
        return len(self.inner)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __iter__(self):
        with open(self.marker, "a") as f:
            f.write("pass\\n")
        for batch in self.inner:
            time.sleep({SLEEP_S})
            yield batch


def build(cfg, dist):
    bundle = digits.build(cfg, dist)
    bundle.val = SlowVal(bundle.val, cfg.OUTPUT_DIR + ".evals")
    return bundle


known_split = digits.known_split
sources.register("slowdigits", __name__, in_process=True)
'''
# an LR schedule that observes each evaluation: the resumed run's observation must be the one left alone's
SLOW = ["DATA.NAME", "slowdigits", "DATA.EVAL_BATCH_SIZE", "512", "TRAIN.SCHEDULER", "plateau",
        "TRAIN.PLATEAU_PATIENCE", "0"]


@pytest.fixture(scope="module")
def slow_source(tmp_path_factory) -> Path:
    """The slow source's file, for IMPORTS."""
    path = tmp_path_factory.mktemp("source") / "slowdigits.py"
    path.write_text(SLOW_SOURCE)
    return path


def argv(out: Path, source: Path) -> list[str]:
    """The run's command."""
    return [sys.executable, TRAIN, *BASE, *SLOW, "IMPORTS", f"[{source}]", "OUTPUT_DIR", str(out)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, slow_source) -> Path:
    """The same run left alone."""
    ref = tmp_path_factory.mktemp("ref") / "run"
    run = Launch(argv(ref, slow_source), ref.parent, "ref", **PINNED)
    assert run.finish() == 0, run.stdout[-3000:] + run.stderr
    return ref


def passes(out: Path) -> int:
    """Evaluation passes started so far."""
    marker = Path(f"{out}.evals")
    return len(marker.read_text().splitlines()) if marker.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("when", ["last step", "evaluation"])
def test_a_stop_at_an_epoch_end_saves_before_its_evaluation(tmp_path, slow_source, reference, when):
    """SIGTERM once epoch 1's last step is logged, or once its evaluation has started: exit 75 sooner than that
    evaluation would take, no val row yet, the checkpoint at that step with the end owed; the rerun evaluates
    epoch 1 once, first, and every metrics.jsonl row (timings aside), the checkpoint (the plateau schedule's
    counters included) and the results equal the run left alone's."""
    out = tmp_path / "run"
    run = Launch(argv(out, slow_source), tmp_path, "stopped", **PINNED)
    if when == "last step":
        run.wait_step(STEPS_PER_EPOCH)
    else:
        wait_until(lambda: passes(out) > 0, run.p, "the first evaluation pass started")
    t0 = time.monotonic()
    run.p.send_signal(signal.SIGTERM)
    rc = run.finish(timeout=60)
    elapsed = time.monotonic() - t0
    assert rc == EXIT_PREEMPTED, run.stderr[-3000:]
    assert elapsed < EVAL_S, f"{elapsed:.2f} s from SIGTERM to exit: the evaluation ran first"
    assert val_rows(out) == [] and "eval epoch" not in run.stdout
    assert run.stderr.strip() == (f"preempted at step {STEPS_PER_EPOCH} (epoch 1's end is left to the rerun): "
                                  f"checkpoint saved in {out / 'checkpoints'}; rerun the same command to continue")
    saved = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
    assert (saved["step"], saved["epoch"], saved["epoch_closed"]) == (STEPS_PER_EPOCH, 0, False)
    before = passes(out)
    final = Launch(argv(out, slow_source), tmp_path, "final", **PINNED)
    assert final.finish() == 0, final.stdout[-3000:] + final.stderr
    assert RESUMED.search(final.stdout).group(2, 3, 4) == ("1", str(STEPS_PER_EPOCH), str(STEPS_PER_EPOCH))
    assert final.stdout.count("eval epoch 1 ") == 1 and passes(out) - before == passes(reference)
    assert [r["epoch"] for r in val_rows(out)] == [1, 2]
    assert logged_rows(out) == logged_rows(reference)
    assert_same_run(out, reference)
