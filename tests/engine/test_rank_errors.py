"""Errors from any rank: under torchrun, rank 1 alone meets more unreadable files than DATA.BAD_FILE_BUDGET; the
whole job ends within seconds, every worker exits 2, and rank 0's stderr, log.txt and run.json carry rank 1's
line."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

from runner.config import load_config
from runner.data import build_data
from runner.distributed import Dist
from tests.data.fixtures import export_digits_jpegs
from tests.test_distributed import alive_with, finish, launch
from tests.utils import TRAIN

ARGS = ["MODEL.NAME", "resnet10t", "DATA.NAME", "folder", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "8",
        "TRAIN.EPOCHS", "2", "DATA.NUM_WORKERS", "0", "DATA.CHECK", "False", "LOG.PERIOD", "1",
        "LOG.TENSORBOARD", "False", "DIST.TIMEOUT_S", "120"]


def _sampler(loader):
    """The index sampler inside a built train loader, wherever the loader keeps it."""
    todo = [loader]
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.utils.data.Sampler) and not isinstance(obj, torch.utils.data.BatchSampler):
            return obj
        todo += [v for k, v in vars(obj).items() if not k.startswith("__")] if hasattr(obj, "__dict__") else []
    raise AssertionError(f"no sampler found in {loader!r}")


def rank_files(root: Path, rank: int, world: int, count: int) -> list[str]:
    """The first `count` training files `rank` of `world` reads in epoch 0, asked of the loader code itself."""
    cfg, _ = load_config(["DATA.ROOT", str(root), *ARGS])
    data = build_data(cfg, Dist(rank, world, rank, torch.device("cpu")))
    sampler = _sampler(data.train)
    sampler.set_epoch(0, 0)
    dataset = data.train.loader.dataset
    return [dataset.samples[i[0] if isinstance(i, tuple) else i][0] for i in list(iter(sampler))[:count]]


@pytest.mark.slow
def test_user_mistake_on_rank_1_ends_the_job_with_its_line(tmp_path):
    root = export_digits_jpegs(tmp_path / "digits", size=16, per_class=30)
    mine, others = rank_files(root, 1, 2, 6), set(rank_files(root, 0, 2, 10**6))
    bad = [p for p in mine if p not in others]
    assert len(bad) >= 4, (mine, len(others))
    for path in bad:  # 240 training files, budget 1%: the third bad file rank 1 meets stops it
        Path(path).write_bytes(b"not a jpeg")
    out, log = tmp_path / "out", tmp_path / "run.log"
    t0 = time.monotonic()
    proc = launch(["--standalone", "--nproc_per_node=2", TRAIN, "DATA.ROOT", str(root), *ARGS,
                   "OUTPUT_DIR", str(out)], log)
    text = finish(proc, log, timeout=120)
    assert proc.returncode != 0, text[-3000:]
    codes = re.findall(r"rank\s*: (\d) \(local_rank: \d\)\s*\n\s*exitcode\s*: (-?\d+)", text)
    assert sorted(codes) == [("0", "2"), ("1", "2")], text[-3000:]
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "failed" and status["rank"] == 1, status
    assert status["error"].startswith("rank 1: ") and "DATA.BAD_FILE_BUDGET" in status["error"], status
    # rank 0's own stderr line names rank 1 (torchrun mixes both workers' output into the log)
    assert re.search(r"^error: rank 1: .*DATA\.BAD_FILE_BUDGET", text, re.M), text[-3000:]
    assert "rank 1: " in (out / "log.txt").read_text()
    assert text.count("Traceback") == 1, text[-3000:]  # torchrun's own (ChildFailedError); none of a worker
    assert alive_with(str(out)) == []
    assert time.monotonic() - t0 < 60  # far from DIST.TIMEOUT_S, which a stuck rank 0 would wait out


@pytest.mark.slow
def test_a_mistake_every_rank_meets_is_said_once(tmp_path):
    """Under torchrun a mistake that both ranks meet (in the arguments, or while building) is one error line."""
    import subprocess

    from tests.utils import ROOT, env, torchrun

    def errors(*args: str) -> list[str]:
        cmd = torchrun(["--standalone", "--nproc_per_node=2", TRAIN, *args, "OUTPUT_DIR", str(tmp_path / "o")])
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(), timeout=180)
        return [line for line in proc.stderr.splitlines() if line.startswith("error:")]

    assert errors("BAD.KEY", "1") == ["error: unknown config key BAD.KEY on the command line"]
    known = errors("DATA.BATCH_SIZE", "100000", "DATA.NUM_WORKERS", "0")  # digits' size is known before the claim
    assert len(known) == 1 and "is larger than the training split of DATA.NAME digits" in known[0], known
    jpegs = export_digits_jpegs(tmp_path / "jpegs", size=8, per_class=3)  # a folder's is known once it is built
    built = errors("DATA.NAME", "folder", "DATA.ROOT", str(jpegs), "DATA.NUM_WORKERS", "0")
    assert len(built) == 1 and "gives 0 batches per process" in built[0], built


@pytest.mark.slow
@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_crash_on_rank_1_is_in_log_txt_and_run_json_names_it(tmp_path, how):
    """A real failure on rank 1: its traceback reaches rank 0's log.txt; a rank that dies without a word (not
    rank 0, whose collective then breaks) is the one run.json names."""
    import subprocess

    from tests.utils import ROOT, env, torchrun

    out = tmp_path / "o"
    script = str(ROOT / "tests" / "engine" / "crash_rank.py")
    cmd = torchrun(["--standalone", "--nproc_per_node=2", script, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16",
                    "TRAIN.EPOCHS", "1", "DATA.NUM_WORKERS", "0", "LOG.PERIOD", "1", "DIST.TIMEOUT_S", "60",
                    "OUTPUT_DIR", str(out)])
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=240,
                          env=env(CRASH_RANK="1", CRASH_STEP="3", CRASH_HOW=how))
    assert proc.returncode != 0
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "failed" and status["rank"] == 1, status
    log = (out / "log.txt").read_text()
    if how == "raise":
        assert "rank 1: RuntimeError: injected crash in the step" in status["error"]
        assert "rank 1's traceback:" in log and "Traceback (most recent call last)" in log
        assert 'raise RuntimeError("injected crash in the step")' in log
    else:
        assert status["error"].startswith("rank 1 stopped without a word"), status
        assert "rank 1 stopped without a word" in log
