"""A signal to every process of a job (SLURM's scancel and preemption, Kubernetes, systemd, `timeout`) means what
it means to the main process alone: finish the step, save, exit 75, and the same command continues exactly.

Loader workers (DATA.NUM_WORKERS > 0), the fork server and a torchrun job's ranks all receive it; none of them
may decide the outcome, and none may be left behind.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.data.fixtures import export_digits_jpegs
from tests.data.test_shards import make_shards
from tests.engine.test_resume import EXIT_PREEMPTED, Launch, ckpt_step
from tests.utils import ROOT, TRAIN, is_alive, read_jsonl, run_tool, torchrun

pytestmark = pytest.mark.slow

CFG = str(ROOT / "configs" / "digits" / "test_resnet.yaml")
# 16 px digits, 2 workers, 2 short epochs of 10 steps (batch 32 of 320 images), a log line per step
RUN = ["--cfg", CFG, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "32", "TRAIN.EPOCHS", "2",
       "DATA.NUM_WORKERS", "2", "LOG.PERIOD", "1", "LOG.PROGRESS", "plain", "CUDNN.DETERMINISTIC", "true"]
STEPS = 2 * (320 // 32)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, list[str]]:
    """The two worker-fed data paths: a JPEG folder and webdataset shards of the same images."""
    base = tmp_path_factory.mktemp("group")
    jpegs = export_digits_jpegs(base / "jpegs", size=16, per_class=40)
    shards = make_shards(jpegs, base / "shards", "--shard-size", "40")
    return {"folder": ["DATA.NAME", "folder", "DATA.ROOT", str(jpegs)],
            "shards": ["DATA.NAME", "shards", "DATA.ROOT", str(shards)]}


def session_members(sid: int) -> list[int]:
    """Live processes (not zombies) of session `sid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid and fields[0] != "Z":  # state, ppid, pgrp, session
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun's ranks, their loader workers, the fork servers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for t in Path(f"/proc/{p}/task").iterdir()
                    for c in (t / "children").read_text().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def wait_gone(pids: list[int], timeout: float = 20) -> list[int]:
    """Wait until none of `pids` lives (multiprocessing's helpers end once the ranks' pipes close); those left."""
    end = time.monotonic() + timeout
    while (alive := [p for p in pids if is_alive(p)]) and time.monotonic() < end:
        time.sleep(0.05)
    return alive


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    """The model in the run's last checkpoint."""
    return torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)["model"]


@pytest.fixture(scope="module")
def reference(sources, tmp_path_factory) -> Path:
    """The folder run left alone."""
    out = tmp_path_factory.mktemp("reference") / "out"
    done = run_tool("train.py", [*RUN, *sources["folder"], "OUTPUT_DIR", str(out)])
    assert done.returncode == 0, done.stderr
    return out


def stop_whole_group(sources, tmp_path: Path, source: str, sig: signal.Signals, at: int = 4) -> tuple[Launch, Path]:
    """Start a run in its own process group, send `sig` to the whole group at step `at`; the ended run."""
    out = tmp_path / "out"
    run = Launch([sys.executable, TRAIN, *RUN, *sources[source], "OUTPUT_DIR", str(out)], tmp_path, "run")
    run.wait_step(at)
    os.killpg(run.p.pid, sig)
    assert run.finish(120) == EXIT_PREEMPTED, f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr}"
    return run, out


def assert_saved_and_alone(run: Launch, out: Path, sig: signal.Signals) -> int:
    """Exit 75's contract: one line on stderr, the signal logged once, run.json preempted, nothing left running."""
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("preempted at step"), run.stderr
    assert run.stdout.count(f"received {sig.name}") == 1, run.stdout[-3000:]  # not once per worker
    assert '"status": "preempted"' in (out / "run.json").read_text()
    assert wait_gone(session_members(run.p.pid)) == []  # workers and the fork server went with the run
    return ckpt_step(out / "checkpoints" / "last.pth")


def test_sigterm_to_the_group_saves_and_resumes_exactly(sources, reference, tmp_path):
    run, out = stop_whole_group(sources, tmp_path, "folder", signal.SIGTERM)
    saved = assert_saved_and_alone(run, out, signal.SIGTERM)
    assert 4 <= saved < STEPS
    again = run_tool("train.py", [*RUN, *sources["folder"], "OUTPUT_DIR", str(out)])
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r] == list(range(1, STEPS + 1))
    ref, got = final_weights(reference), final_weights(out)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGINT])
def test_other_stop_signals_to_the_group(sources, tmp_path, sig):
    run, out = stop_whole_group(sources, tmp_path, "folder", sig)
    assert assert_saved_and_alone(run, out, sig) >= 4


def test_sigterm_to_the_group_with_shards(sources, tmp_path):
    run, out = stop_whole_group(sources, tmp_path, "shards", signal.SIGTERM)
    saved = assert_saved_and_alone(run, out, signal.SIGTERM)
    again = run_tool("train.py", [*RUN, *sources["shards"], "OUTPUT_DIR", str(out)])
    assert again.returncode == 0 and again.stderr == "", again.stderr
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, STEPS + 1)) and saved < STEPS


def test_sigterm_to_every_process_of_a_torchrun_job(sources, tmp_path):
    """As SLURM signals a job step: torchrun, both ranks, their workers and fork servers at once."""
    out = tmp_path / "out"
    argv = [*torchrun(["--standalone", "--nproc_per_node=2", TRAIN]), *RUN, *sources["folder"]]
    run = Launch([*argv, "DATA.BATCH_SIZE", "16", "OUTPUT_DIR", str(out)], tmp_path, "ddp")
    run.wait_step(4)
    everyone = [run.p.pid, *descendants(run.p.pid)]
    assert len(everyone) >= 5  # torchrun, 2 ranks, their workers
    for pid in everyone:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    run.finish(120)
    status = (out / "run.json").read_text()
    assert '"status": "preempted"' in status, f"{status}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    # torchrun prints its own traceback for the signal it got (SignalException); the ranks print none
    assert run.stderr.count("Traceback") == run.stderr.count("SignalException: Process") == 1, run.stderr[-3000:]
    assert run.stderr.count("preempted at step") == 2 and "DataLoader worker" not in run.stderr
    assert wait_gone(everyone[1:]) == []
    saved = ckpt_step(out / "checkpoints" / "last.pth")
    again = run_tool("train.py", [*RUN, *sources["folder"], "DATA.BATCH_SIZE", "16", "TRAIN.ACCUM_STEPS", "2",
                                    "OUTPUT_DIR", str(out)])  # one process, the same global batch
    assert again.returncode == 0, again.stderr
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, STEPS + 1)) and 4 <= saved < STEPS


def test_ranks_of_a_killed_torchrun_save_and_stop(tmp_path):
    """kill -9 of torchrun alone (the OOM killer, a launcher that ends only what it started): its ranks, each in
    its own session, save and exit 75 within seconds instead of training on as orphans holding the folder."""
    out = tmp_path / "out"
    digits = ["--cfg", CFG, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "32",
              "LOG.PERIOD", "1", "LOG.PROGRESS", "plain"]
    run = Launch([*torchrun(["--standalone", "--nproc_per_node=2", TRAIN]), *digits, "TRAIN.EPOCHS", "30",
                  "OUTPUT_DIR", str(out)], tmp_path, "ddp")
    run.wait_step(3)
    ranks = run.children()
    os.kill(run.p.pid, signal.SIGKILL)
    run.finish(30)
    left = wait_gone(ranks, timeout=30)
    for pid in left:  # orphans that trained on: not to outlive the test
        os.kill(pid, signal.SIGKILL)
    assert len(ranks) == 2 and left == [], run.stdout[-3000:]
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "preempted", status
    # the first rank to notice asks both to stop (they agree at one step): the other may stop before its own look
    assert "the launcher (torchrun, pid" in run.stdout and "frame #" not in run.stdout, run.stdout[-3000:]
    saved = ckpt_step(out / "checkpoints" / "last.pth")
    assert 3 <= saved < 30 * (1437 // 64), saved
    again = run_tool("train.py", [*digits, "DATA.BATCH_SIZE", "32", "TRAIN.ACCUM_STEPS", "2", "TRAIN.EPOCHS", "30",
                                  "TRAIN.MAX_STEPS", str(saved + 2), "OUTPUT_DIR", str(out)])
    assert again.returncode == 0, again.stderr
    assert f"step {saved}" in again.stdout and "resumed from" in again.stdout, again.stdout[-2000:]


@pytest.mark.parametrize("source", ["folder", "shards"])
def test_sigkill_of_the_main_process_leaves_no_worker(sources, tmp_path, source):
    """The main process killed at once (kill -9, the OOM killer): its loader workers and fork server end within
    seconds, not train-forever orphans (torch's check watches the worker's parent, the fork server)."""
    out = tmp_path / "out"
    run = Launch([sys.executable, TRAIN, *RUN, *sources[source], "OUTPUT_DIR", str(out)], tmp_path, "run")
    run.wait_step(3)
    helpers = [p for p in session_members(run.p.pid) if p != run.p.pid]
    assert len(helpers) >= 3, helpers  # 2 workers, the fork server (and multiprocessing's resource tracker)
    run.p.kill()
    run.finish(30)
    assert wait_gone(helpers) == []
