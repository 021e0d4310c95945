"""A folder holds one run, even before its first checkpoint; a refused command leaves the folder as it was."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from runner.config import load_config
from runner.engine.claim import check_global_batch
from runner.errors import UserError
from tests.engine.test_elastic import snapshot
from tests.engine.test_resume import Launch, tb_scalars
from tests.utils import ROOT, TRAIN, assert_user_error, read_jsonl, run_tool

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
FIRST = ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "TRAIN.EPOCHS", "1", "LOG.PERIOD", "1",
         "DATA.NUM_WORKERS", "0", "LOG.PROGRESS", "plain"]


@pytest.mark.slow
def test_another_config_on_a_killed_run_without_checkpoint_is_refused_and_the_same_starts_over(tmp_path):
    out = tmp_path / "mix"
    first = Launch([sys.executable, TRAIN, *FIRST, "OUTPUT_DIR", str(out)], tmp_path, "first")
    first.wait_step(3)
    first.kill_all()  # SIGKILL before the first checkpoint (CHECKPOINT.PERIOD 0: the epoch's end)
    assert not list((out / "checkpoints").glob("*.pth")) if (out / "checkpoints").exists() else True
    before = snapshot(out)
    assert "config.yaml" in before and "metrics.jsonl" in before
    other = run_tool("train.py", [*FIRST, "MODEL.NAME", "test_resnet", "TRAIN.OPTIMIZER", "sgd",
                                  "OUTPUT_DIR", str(out)])
    assert_user_error(other, "unfinished run", "MODEL.NAME: 'resnet10t' -> 'test_resnet'", "TRAIN.OPTIMIZER")
    assert snapshot(out) == before  # byte for byte
    defaults = run_tool("train.py", ["OUTPUT_DIR", str(out)])  # no --cfg at all: the defaults differ too
    assert_user_error(defaults, "unfinished run")
    assert snapshot(out) == before

    again = run_tool("train.py", [*FIRST, "OUTPUT_DIR", str(out)])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "no checkpoint: starting over" in again.stdout
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 1437 // 64 + 1))  # the dead attempt's steps are gone
    tb = tb_scalars(out, "train/loss")
    assert [s for s, _ in tb] == [r["step"] for r in rows]  # TensorBoard reads one curve, no step twice
    assert [v for _, v in tb] == pytest.approx([r["train/loss"] for r in rows])
    log = (out / "log.txt").read_text()
    assert log.index("starting over") > log.index("step 3/")  # the earlier lines are kept, above the restart

    # a refused resume into a new folder leaves no folder behind (not even run.lock)
    new = tmp_path / "new" / "deeper"
    refused = run_tool("train.py", [*FIRST, "TRAIN.ACCUM_STEPS", "2", "OUTPUT_DIR", str(new),
                                    "CHECKPOINT.RESUME", str(out / "checkpoints" / "last.pth")])
    assert_user_error(refused, "global batch of 64", "TRAIN.ACCUM_STEPS 1")
    assert not (tmp_path / "new").exists()


def cfg_with(batch: int, accum: int):
    """A digits config with DATA.BATCH_SIZE and TRAIN.ACCUM_STEPS set."""
    cfg, _ = load_config(["--cfg", DIGITS, "DATA.BATCH_SIZE", str(batch), "TRAIN.ACCUM_STEPS", str(accum)],
                         check_paths=False)
    return cfg


@pytest.mark.parametrize("old, batch, world, accum", [(64, 16, 1, 1), (64, 16, 2, 3), (96, 32, 2, 1),
                                                      (96, 32, 2, 2), (256, 32, 4, 1)])
def test_global_batch_advice_is_accepted_when_followed(old, batch, world, accum):
    with pytest.raises(UserError) as refused:
        check_global_batch(cfg_with(batch, accum), {"global_batch": old}, world, "last.pth")
    advice = str(refused.value).rsplit("use ", 1)[1]
    assert "DATA.BATCH_SIZE" not in advice  # never resume-safe: following it would be refused again
    followed = 0
    for fix in advice.split(" or "):
        if m := re.fullmatch(r"TRAIN\.ACCUM_STEPS (\d+)", fix):
            check_global_batch(cfg_with(batch, int(m.group(1))), {"global_batch": old}, world, "last.pth")
            followed += 1
        elif m := re.fullmatch(r"(\d+) processes", fix):
            check_global_batch(cfg_with(batch, accum), {"global_batch": old}, int(m.group(1)), "last.pth")
            followed += 1
        elif m := re.fullmatch(r"processes x TRAIN\.ACCUM_STEPS = (\d+)", fix):
            assert int(m.group(1)) * batch == old
            check_global_batch(cfg_with(batch, int(m.group(1))), {"global_batch": old}, 1, "last.pth")
            followed += 1
    assert followed == len(advice.split(" or ")), advice


def test_results_of_another_config_are_named_in_the_refusal(tmp_path, in_process):
    """A finished run's folder and another config: refused before torch is imported, naming the keys."""
    out = tmp_path / "done"
    out.mkdir()
    cfg, _ = load_config(["--cfg", DIGITS, "OUTPUT_DIR", str(out)], check_paths=False)
    from runner.config import dump_config
    from runner.rundir.marker import DONE, write_status

    (out / "config.yaml").write_text(dump_config(cfg))
    write_status(str(out), DONE)
    (out / "results.json").write_text(json.dumps({"status": DONE, "step": 5, "epoch": 1, "val/top1": 50.0}))
    before = snapshot(out)
    proc = in_process("train.py", ["--cfg", DIGITS, "TRAIN.LR", "0.5", "OUTPUT_DIR", str(out)])
    assert_user_error(proc, "finished run", "TRAIN.LR")
    assert snapshot(out) == before
    assert Path(out / "run.json").exists()
