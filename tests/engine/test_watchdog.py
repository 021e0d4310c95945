"""The hang watchdog under torchrun (gloo, CPU): one rank frozen with SIGSTOP mid-training ends the job with
exit 76 within the timeout plus 30 s, stack files of the live ranks, run.json `hung` naming the frozen rank,
no process left; the same command then resumes it like a preempted run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.engine.watchdog import Watchdog
from tests.test_distributed import (
    DIGITS,
    TINY_RESNET,
    alive_with,
    descendants,
    finish,
    kill_tree,
    launch,
    logged_a_step,
)
from tests.utils import TRAIN, proc_env, proc_stat

HANG_S = 8


def _workers(launcher: int, out: Path) -> dict[int, int]:
    """{rank: pid} of the training workers below a torchrun launcher."""
    found = {}
    for pid in descendants(launcher):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if str(out) in cmd:
                found[int(proc_env(pid).get("RANK", -1))] = pid
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def _wait_training(proc: subprocess.Popen, out: Path, log: Path) -> None:
    """Until both ranks are in the training loop and a checkpoint is saved (the resume starts from it)."""
    deadline = time.monotonic() + 120
    while not (logged_a_step(out) and any((out / "checkpoints").glob("*.pth"))):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


@pytest.mark.slow
def test_frozen_rank_ends_job_with_stacks_and_resumes(tmp_path):
    out, log = tmp_path / "out", tmp_path / "run.log"
    args = ["--standalone", "--nproc_per_node=2", TRAIN, "--cfg", DIGITS, *TINY_RESNET, "TRAIN.EPOCHS", "3",
            "TRAIN.MAX_STEPS", "400", "DIST.HANG_TIMEOUT_S", str(HANG_S), "CHECKPOINT.PERIOD", "5",
            "OUTPUT_DIR", str(out)]
    proc = launch(args, log)
    frozen = None
    try:
        _wait_training(proc, out, log)
        workers = _workers(proc.pid, out)
        assert sorted(workers) == [0, 1], workers
        frozen = workers[1]
        os.kill(frozen, signal.SIGSTOP)
        t0 = time.monotonic()
        finish(proc, log, timeout=HANG_S + 30)
        elapsed = time.monotonic() - t0
    finally:
        if frozen is not None and proc_stat(frozen) is not None and proc_stat(frozen)[0] != "Z":
            os.kill(frozen, signal.SIGCONT)
            os.kill(frozen, signal.SIGKILL)
            survived = True
        else:
            survived = False
        kill_tree(proc.pid)
        proc.wait()
    text = log.read_text()
    assert not survived, "the frozen rank was left behind"
    assert elapsed < HANG_S + 30, elapsed
    assert "exitcode  : 76" in text or "exitcode: 76" in text.replace("  ", " "), text[-3000:]
    time.sleep(0.5)
    assert alive_with(str(out)) == [], "a process of the hung job survived"
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "hung" and status["hung_ranks"] == [1], status
    assert status["step"] > 0
    stack = (out / "hang" / "rank0.txt").read_text()
    assert "Thread" in stack and ("all_reduce" in stack or "backward" in stack or "wait" in stack), stack
    assert not (out / "hang" / "rank1.txt").exists()  # the frozen rank could write nothing
    assert "rank 1 stopped reporting" in (out / "log.txt").read_text()

    resumed = launch(args[:-2] + ["TRAIN.MAX_STEPS", "30", "OUTPUT_DIR", str(out)], tmp_path / "resume.log")
    text = finish(resumed, tmp_path / "resume.log", timeout=150)
    assert resumed.returncode == 0, text[-3000:]
    assert "resumed from" in text, text[-3000:]
    assert json.loads((out / "results.json").read_text())["step"] == 30


def test_single_process_hang_writes_stacks_and_status(tmp_path):
    """In-process: the watchdog's thread sees no step for its timeout and ends the process with 76."""
    code = (
        "import time, sys\n"
        "from pathlib import Path\n"
        "from runner.distributed import Dist\n"
        "from runner.engine.watchdog import Watchdog\n"
        "import torch\n"
        f"dog = Watchdog(1.0, Path({str(tmp_path)!r}), Dist(0, 1, 0, torch.device('cpu')), None, tick=0.2,"
        " setup_allowance=1.0)\n"
        "dog.start()\n"
        "time.sleep(30)\n"
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 76, proc.stderr
    assert time.monotonic() - t0 < 20
    stack = (tmp_path / "hang" / "rank0.txt").read_text()
    assert "<module>" in stack and "Thread" in stack, stack
    assert "hung: no optimizer step" in proc.stderr


def test_watchdog_limits():
    """Before the first step the set-up allowance applies; auto is max(300 s, 20 x the slowest step)."""
    import torch

    from runner.distributed import Dist

    dog = Watchdog(-1, Path("."), Dist(0, 1, 0, torch.device("cpu")), None)
    assert dog.limit() == 600.0
    dog.stepped, dog.slowest = True, 0.5
    assert dog.limit() == 300.0
    dog.slowest = 30.0
    assert dog.limit() == 600.0
    assert Watchdog(8, Path("."), Dist(0, 1, 0, torch.device("cpu")), None).limit() == 600.0
