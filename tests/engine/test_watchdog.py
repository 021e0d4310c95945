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
from tests.utils import TRAIN, env, is_alive, proc_env, proc_stat

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


def _diagnosis(out: Path) -> str:
    """The tail of log.txt and rank 0's stacks, for a job that did not end in time."""
    parts = []
    for name in ("log.txt", "hang/rank0.txt"):
        path = out / name
        parts.append(f"--- {name}:\n" + (path.read_text(errors="replace")[-4000:] if path.is_file() else "(none)"))
    return "\n".join(parts)


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
        try:
            finish(proc, log, timeout=HANG_S + 30)
        except pytest.fail.Exception as e:  # what the job's own files say about where it stopped
            pytest.fail(f"{e}\n{_diagnosis(out)}")
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
    assert exited_76(text), text[-3000:]
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


CRASH = str(Path(__file__).resolve().parent / "crash_rank.py")
FROZEN_RUN = [*TINY_RESNET, "TRAIN.MAX_STEPS", "3"]  # the run's last evaluation follows step 3


def _frozen_job(tmp_path: Path, at: str, *keys: str, how: str = "stop",
                rank: str = "1") -> tuple[subprocess.CompletedProcess, float]:
    """torchrun on 2 processes with rank 1 frozen (SIGSTOP) at `at`; its stderr (as stdout: the two interleaved,
    as stderr: alone); seconds until rank 0 ended.

    The frozen worker is SIGKILLed once rank 0 has ended (torchrun would wait 30 s for it)."""
    out, log, err = tmp_path / "out", tmp_path / "run.log", tmp_path / "stderr.log"
    with open(log, "w") as f, open(err, "w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", CRASH,
             "--cfg", DIGITS, *FROZEN_RUN, *keys, "OUTPUT_DIR", str(out)], stdout=f, stderr=e,
            env={**env(), "CRASH_RANK": rank, "CRASH_HOW": how, "CRASH_AT": at, "CRASH_STEP": "0"})
    t0, workers, ended = time.monotonic(), {}, None
    try:
        while proc.poll() is None and time.monotonic() - t0 < 150:
            workers.update(_workers(proc.pid, out))
            if 0 in workers and not is_alive(workers[0]):
                ended = ended or time.monotonic() - t0
                if 1 in workers and is_alive(workers[1]):
                    os.kill(workers[1], signal.SIGKILL)
            time.sleep(0.2)
    finally:
        kill_tree(proc.pid)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, log.read_text(), err.read_text()), ended or 0.0


def exited_76(text: str) -> bool:
    """True when torchrun reports a worker that exited 76: its 'failed (exitcode: 76)' line, or the failure
    summary's 'exitcode  : 76' (torchrun names first whichever failed worker its monitor saw first, so the frozen
    rank that the test SIGKILLs may be the one on the 'failed' line)."""
    return "exitcode  : 76" in text or "exitcode: 76" in text.replace("  ", " ")


def _runner_lines(text: str) -> list[str]:
    """The output lines that are not torchrun's own (its launcher's log lines and its failure summary)."""
    summary = text.find("Traceback (most recent call last):\n  File \"<frozen runpy>\"")
    text = text if summary < 0 else text[:summary]
    return [line for line in text.splitlines() if line.strip() and not line.startswith(("W1", "E1", "I1"))]


@pytest.mark.slow
@pytest.mark.parametrize("first", ["watchdog", "collective"])
def test_rank_frozen_in_evaluation_is_named_in_one_line(tmp_path, first):
    """Rank 1 freezes in the run's evaluation (the watchdog is paused there): one line names it, exit 76, run.json
    hung, whether the watchdog's heartbeat check (DIST.HANG_TIMEOUT_S) or gloo's timeout (DIST.TIMEOUT_S) ends
    it first; no gloo traceback, and the frozen rank is not left for torchrun's 30 s."""
    keys = ["DIST.HANG_TIMEOUT_S", "5", "DIST.TIMEOUT_S", "60"] if first == "watchdog" else \
        ["DIST.HANG_TIMEOUT_S", "60", "DIST.TIMEOUT_S", "6"]
    proc, _ = _frozen_job(tmp_path, "eval", *keys)
    assert exited_76(proc.stderr), proc.stderr[-3000:]
    lines = _runner_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("hung: "), lines
    assert "rank 1 stopped reporting" in lines[0]
    assert ("during the evaluation" if first == "watchdog" else "a collective waited DIST.TIMEOUT_S") in lines[0]
    assert "Timed out" not in proc.stderr + proc.stdout and "[rank0]" not in proc.stderr
    assert "Unable to shutdown" not in proc.stderr, "torchrun waited 30 s to kill the frozen rank"
    status = json.loads((tmp_path / "out" / "run.json").read_text())
    assert status["status"] == "hung" and status["hung_ranks"] == [1] and status["step"] == 3, status


@pytest.mark.slow
def test_rank_frozen_before_the_process_group_is_named(tmp_path):
    """Rank 1 freezes before the process group forms: rank 0 names it in one line within DIST.TIMEOUT_S, exit
    76 (the same command starts again), instead of a store timeout traceback naming no rank; nothing written."""
    proc, ended = _frozen_job(tmp_path, "setup", "DIST.TIMEOUT_S", "5")
    assert exited_76(proc.stderr), proc.stderr[-3000:]
    lines = _runner_lines(proc.stderr)
    assert lines == [lines[0]] and lines[0].startswith("hung: rank 1 did not reach the process group within "
                                                       "DIST.TIMEOUT_S (5 s)"), lines
    assert "DistStoreError" not in proc.stderr and "socket.cpp" not in proc.stderr
    assert 5 < ended < 60, ended
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_evaluation_that_stalls_is_a_hang(tmp_path):
    """Rank 0's evaluation never gets its batch (a loader worker stuck at its fork, say) while every thread still
    beats and rank 1 waits in the evaluation's all_reduce: one line, exit 76 within DIST.HANG_TIMEOUT_S (not
    gloo's DIST.TIMEOUT_S, nor never), run.json hung."""
    proc, ended = _frozen_job(tmp_path, "eval", "DIST.HANG_TIMEOUT_S", "5", "DIST.TIMEOUT_S", "600", how="block",
                              rank="0")
    assert exited_76(proc.stderr), proc.stderr[-3000:]
    lines = _runner_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("hung: no evaluation batch for 5 s in the evaluation after "
                                                   "step 3"), lines
    assert "every rank still reports" in lines[0] and 5 < ended < 60, (lines, ended)
    status = json.loads((tmp_path / "out" / "run.json").read_text())
    assert status["status"] == "hung" and status["step"] == 3, status


def test_a_rank_has_a_heartbeat_as_soon_as_its_watchdog_starts(tmp_path):
    """A rank frozen within its first tick (a tiny model's set-up takes under a second) still has a heartbeat, with
    its pid, so rank 0 can kill it: without one, torchrun waited its 30 s grace on the frozen rank (CI, twice)."""
    import torch
    from torch.distributed import HashStore

    from runner.distributed import Dist
    from runner.engine.watchdog import JobBoard

    board = JobBoard(HashStore(), 1, 2)
    dog = Watchdog(8, tmp_path, Dist(1, 2, 1, torch.device("cpu")), board, tick=30.0)
    dog.start()
    try:
        beats = board.heartbeats()
    finally:
        dog.stop()
    assert 1 in beats and beats[1][3] == str(os.getpid()), beats
