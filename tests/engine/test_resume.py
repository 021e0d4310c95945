"""Checkpoints, exact resume and preemption: the real tools/train.py (and torchrun) killed and restarted on CPU.

A run killed at random moments (SIGKILL, SIGTERM, SIGUSR1) and restarted with the same command must end
bit-identical to the same run left alone: weights, EMA, optimizer, schedule, RNG, metrics and event files.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from runner.checkpoint import atomic_save, save_checkpoint
from runner.fsutil import TMP_RE
from runner.rundir.layout import STEP_RE
from tests.utils import ROOT, TRAIN, assert_user_error, env, is_alive, proc_env, read_jsonl, run_tool, torchrun

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
# Deterministic and tiny, with every source of state a resume must restore: dropout (torch RNG), mixup (numpy
# RNG), a fast EMA, momentum, a warmup + cosine schedule, and checkpoints every 3 steps so kills land between.
BASE = ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "64",
        "TRAIN.LR", "0.05", "TRAIN.EPOCHS", "2", "DATA.NUM_WORKERS", "0", "CUDNN.DETERMINISTIC", "true",
        "LOG.PERIOD", "1", "LOG.PROGRESS", "plain", "CHECKPOINT.PERIOD", "3", "MODEL.DROP_RATE", "0.2",
        "AUG.MIXUP", "0.2", "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9"]
STEPS_PER_EPOCH = 1437 // 64  # digits' training split in batches of 64 (one process)
EXIT_PREEMPTED = 75
STEP_LINE = re.compile(r" step (\d+)/(\d+) ")
RESUMED = re.compile(r"resumed from (\S+): epoch (\d+), batch (\d+) of the epoch, step (\d+)")


# ---- driving a run ------------------------------------------------------------------------------------------
_STARTED: list[Launch] = []


@pytest.fixture(scope="module", autouse=True)
def _no_strays():
    """Whatever a failed test left running is killed (torchrun's workers included)."""
    yield
    for run in _STARTED:
        if run.p.poll() is None:
            run.kill_all()


class Launch:
    """One started command (tools/train.py or torchrun) in its own process group; output goes to files."""

    def __init__(self, argv: list[str], logs: Path, name: str, **extra_env: str):
        self.out_path, self.err_path = logs / f"{name}.out", logs / f"{name}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.p = subprocess.Popen(argv, stdout=out, stderr=err, cwd=ROOT, env=env(**extra_env),
                                      start_new_session=True)
        _STARTED.append(self)

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, pattern: re.Pattern, ok=lambda m: True, since: int = 0, timeout: float = 120) -> re.Match:
        """The first match of `pattern` in stdout after offset `since` that satisfies `ok`."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for m in pattern.finditer(self.stdout, since):
                if ok(m):
                    return m
            if self.p.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"{pattern.pattern} not seen (rc {self.p.poll()}):\n{self.stdout[-3000:]}\n{self.stderr}")

    def wait_step(self, target: int, since: int = 0) -> int:
        """Block until this launch has logged optimizer step `target` or later; returns the step seen."""
        return int(self.wait_for(STEP_LINE, lambda m: int(m.group(1)) >= target, since).group(1))

    def finish(self, timeout: float = 300) -> int:
        """Wait for the exit code."""
        return self.p.wait(timeout)

    def children(self) -> list[int]:
        """The launcher's direct children (torchrun's workers)."""
        try:
            return [int(p) for p in Path(f"/proc/{self.p.pid}/task/{self.p.pid}/children").read_text().split()]
        except FileNotFoundError:  # already gone
            return []

    def worker(self, rank: int) -> int:
        """The pid of torchrun's worker with this RANK."""
        for pid in self.children():
            if proc_env(pid).get("RANK") == str(rank):
                return pid
        raise AssertionError(f"no worker with RANK={rank}")

    def kill_all(self) -> None:
        """SIGKILL the launcher and its workers, as a node failure would (torchrun gives each worker its own
        session, so killing torchrun's process group alone would leave them running)."""
        groups = [self.p.pid, *self.children()]
        for g in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGKILL)
        self.p.wait(30)
        while any(is_alive(pid) for pid in groups[1:]):  # not our children: wait until they are gone
            time.sleep(0.01)


def assert_checkpoints_load(out: Path) -> None:
    """Every file under a final checkpoint name loads; anything else is a hidden temporary file."""
    d = out / "checkpoints"
    for f in d.iterdir() if d.is_dir() else []:
        if STEP_RE.match(f.name) or f.name in ("last.pth", "best.pth"):
            state = torch.load(f, map_location="cpu", weights_only=True)
            assert "model" in state and "step" in state, f
        else:
            assert f.name.startswith(".") and ".tmp." in f.name, f"unexpected file {f}"


def ckpt_step(path: Path) -> int:
    """The step stored in a checkpoint."""
    return torch.load(path, map_location="cpu", weights_only=True)["step"]


# ---- comparing two runs -----------------------------------------------------------------------------------
def assert_same(a, b, where: str = "") -> None:
    """Recursive exact equality of checkpoint contents: tensors with torch.equal, floats with ==."""
    if isinstance(a, torch.Tensor):
        same = isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        assert same, f"{where} differs"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where} keys differ: {set(a) ^ set(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where} lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# run-to-run bookkeeping that legitimately differs: timings, and the config (its OUTPUT_DIR)
_VOLATILE = ("wall_s", "throughput", "config")


def _steady(state: dict) -> dict:
    """A checkpoint without its volatile entries, at the top and in each hook's part."""
    kept = {k: v for k, v in state.items() if k not in _VOLATILE}
    kept["hooks"] = {name: {k: v for k, v in part.items() if k not in _VOLATILE}
                     for name, part in state["hooks"].items()}
    return kept


def assert_same_run(out: Path, ref: Path) -> None:
    """Final checkpoint, results, metrics.jsonl and TensorBoard scalars of `out` equal those of `ref`."""
    got = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
    want = torch.load(ref / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
    for k in ("model", "ema", "optimizer", "scheduler"):
        assert want[k], k  # present and not empty: the comparison means something
    assert want["hooks"]["checkpointer"]["rng"]
    assert_same(_steady(got), _steady(want), "last.pth")
    res, ref_res = (json.loads((d / "results.json").read_text()) for d in (out, ref))
    for k in ("val/top1", "val/top5", "val_ema/top1", "val_ema/top5", "best/val/top1", "best/epoch", "step", "epoch"):
        assert res[k] == ref_res[k], (k, res[k], ref_res[k])
    rows, ref_rows = train_rows(out), train_rows(ref)
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), "duplicated steps in metrics.jsonl"
    assert steps == [r["step"] for r in ref_rows], "missing or extra steps in metrics.jsonl"
    assert rows == ref_rows  # LOG.PERIOD 1: every step's loss and LR, exactly
    assert val_rows(out) == val_rows(ref)
    tb, ref_tb = tb_scalars(out, "train/loss"), tb_scalars(ref, "train/loss")
    tb_steps = [s for s, _ in tb]
    assert len(tb_steps) == len(set(tb_steps)), "duplicated train/loss steps in the event files"
    assert tb == ref_tb and tb_steps == steps
    assert tb_scalars(out, "val/top1") == tb_scalars(ref, "val/top1")


def train_rows(out: Path) -> list[dict]:
    """metrics.jsonl training lines without the timing scalars."""
    keep = ("step", "epoch", "train/loss", "train/lr")
    return [{k: r[k] for k in keep} for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]


def val_rows(out: Path) -> list[dict]:
    """metrics.jsonl evaluation lines."""
    return [r for r in read_jsonl(out / "metrics.jsonl") if "val/top1" in r]


def tb_scalars(out: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of one scalar tag as TensorBoard reads it back (purged events dropped, files merged)."""
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer().AddRunsFromDirectory(str(out))
    mux.Reload()
    return [(e.step, e.value) for e in mux.Scalars(".", tag)]


# ---- one process ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """An uninterrupted run and the same command interrupted four times at seeded random moments, restarted after
    each and left to finish. The uninterrupted one runs alongside, on the other core.

    Interruptions: SIGKILL at step 1-2 (before the first checkpoint), SIGKILL mid-epoch 1, SIGTERM (preemption),
    SIGKILL in epoch 2. After each, every file under a final checkpoint name must load.
    """
    ref, out = tmp_path_factory.mktemp("reference"), tmp_path_factory.mktemp("interrupted")
    logs = tmp_path_factory.mktemp("logs")
    ref_run = Launch([sys.executable, TRAIN, *BASE, "OUTPUT_DIR", str(ref)], logs, "reference")
    interrupted = _interrupt(out, logs)
    assert ref_run.finish() == 0, ref_run.stdout[-3000:] + ref_run.stderr
    return ref, *interrupted


def _interrupt(out: Path, logs: Path) -> tuple[Path, list[Launch], dict]:
    """Run the BASE command in `out`, interrupting and restarting it; the folder, launches, what SIGTERM did."""
    argv = [sys.executable, TRAIN, *BASE, "OUTPUT_DIR", str(out)]
    rng = random.Random(1234)
    plan = [(signal.SIGKILL, 1, 0.0), (signal.SIGKILL, 10, rng.uniform(0, 0.4)),
            (signal.SIGTERM, 20, rng.uniform(0, 0.4)), (signal.SIGKILL, 30, rng.uniform(0, 0.4))]
    launches, preempt = [], {}
    for i, (sig, target, delay) in enumerate(plan):
        run = Launch(argv, logs, f"run{i}")
        launches.append(run)
        run.wait_step(target)
        time.sleep(delay)
        t0 = time.monotonic()
        run.p.send_signal(sig)
        rc = run.finish(timeout=60)
        if sig == signal.SIGTERM:
            preempt = {"rc": rc, "seconds": time.monotonic() - t0, "stderr": run.stderr,
                       "status": json.loads((out / "run.json").read_text()),
                       "last_step": ckpt_step(out / "checkpoints" / "last.pth")}
        else:
            assert rc == -signal.SIGKILL, (rc, run.stderr)
        assert_checkpoints_load(out)
    final = Launch(argv, logs, "final")
    launches.append(final)
    assert final.finish() == 0, final.stdout[-3000:] + final.stderr
    return out, launches, preempt


@pytest.fixture(scope="module")
def reference(single):
    """The uninterrupted single-process run's folder."""
    return single[0]


@pytest.fixture(scope="module")
def interrupted(single):
    """(folder, launches, what SIGTERM did) of the interrupted single-process run."""
    return single[1:]


def test_killed_run_equals_uninterrupted(interrupted, reference):
    """Weights, EMA, optimizer, schedule, RNG, results, metrics.jsonl and event files are bit-identical."""
    out, launches, _ = interrupted
    resumes = [RESUMED.search(run.stdout) for run in launches]
    # the first kill came right after step 1, before step 3's checkpoint: the second launch started fresh (and
    # its metrics.jsonl and event files had to drop what the killed one wrote)
    assert resumes[1] is None, "the first kill was meant to land before the first checkpoint"
    assert all(resumes[2:]), "every later launch resumed"
    epoch, batch = int(resumes[2].group(2)), int(resumes[2].group(3))
    assert epoch == 1 and 0 < batch < STEPS_PER_EPOCH, "the second kill was mid-epoch"
    assert_same_run(out, reference)
    assert_checkpoints_load(out)


def test_sigterm_saves_and_exits_75(interrupted):
    """SIGTERM: the step in progress finishes, a checkpoint of it is saved, exit 75, status preempted."""
    out, launches, preempt = interrupted
    assert preempt["rc"] == EXIT_PREEMPTED, preempt["stderr"]
    assert preempt["seconds"] < 30
    assert preempt["status"]["status"] == "preempted"
    step = preempt["status"]["step"]
    assert preempt["last_step"] == step
    assert re.match(rf"preempted (at step {step}|after epoch)", preempt["stderr"]), preempt["stderr"]
    assert "Traceback" not in preempt["stderr"]
    assert len(preempt["stderr"].strip().splitlines()) == 1
    assert int(RESUMED.search(launches[3].stdout).group(4)) == step  # the next launch went on from there


# ---- corrupt, missing and refused checkpoints -------------------------------------------------------------
def unfinished_copy(ref: Path, dst: Path, keep: int = 2) -> Path:
    """The reference run's folder as if killed after its last checkpoint: no results.json, `keep` step files."""
    shutil.copytree(ref, dst, ignore=lambda d, names: [n for n in names if n in ("results.json", "run.lock")
                                                        or n.endswith(".pth")])
    ck = dst / "checkpoints"
    for _, p in sorted((int(STEP_RE.match(p.name).group(1)), p) for p in (ref / "checkpoints").glob("step_*"))[-keep:]:
        shutil.copyfile(p, ck / p.name)
    os.link(max(ck.glob("step_*.pth")), ck / "last.pth")  # like save_checkpoint: last.pth is the same file
    return dst


def corrupt(path: Path, how: str) -> None:
    """Damage a file in place (so its hard link last.pth is damaged too)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if how == "truncated":
            f.truncate(size // 2)
        elif how == "empty":
            f.truncate(0)
        else:
            f.write(random.Random(0).randbytes(size))


@pytest.mark.parametrize("how", ["truncated", "empty", "random"])
def test_corrupt_newest_checkpoint_falls_back(reference, tmp_path, how):
    """A damaged newest checkpoint is skipped with a warning naming it; the run resumes from the previous one
    and still ends identical to the uninterrupted run."""
    out = unfinished_copy(reference, tmp_path / "run")
    newest = max((out / "checkpoints").glob("step_*.pth"))
    previous = min((out / "checkpoints").glob("step_*.pth"))
    corrupt(newest, how)
    r = run_tool("train.py", [*BASE, "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert re.search(rf"W checkpoint {re.escape(str(newest))} is unusable \(\w+", r.stdout), r.stdout[:3000]
    assert f"checkpoint {out / 'checkpoints' / 'last.pth'} is unusable" in r.stdout
    assert RESUMED.search(r.stdout).group(1) == str(previous)
    # warned while the folder was being claimed, before log.txt was open: log.txt has them too
    assert f"W checkpoint {newest} is unusable" in (out / "log.txt").read_text()
    assert_same_run(out, reference)


def test_explicit_resume_path_unloadable_is_exit_2(tmp_path, in_process):
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"PK\x03\x04 not really a checkpoint")
    r = in_process("train.py", [*BASE, "CHECKPOINT.RESUME", str(bad), "OUTPUT_DIR", str(tmp_path / "run")])
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"error: checkpoint '{bad}' cannot be loaded")
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr + r.stdout


class Opaque:
    """An object torch.load(weights_only=True) refuses to unpickle."""


def test_explicit_resume_path_holding_code_is_one_whole_line(tmp_path, in_process):
    """torch's own message (several lines, cut mid-sentence before) becomes MODEL.CHECKPOINT's line for it."""
    bad = tmp_path / "with_code.pth"
    torch.save({"model": {"w": torch.zeros(2)}, "step": 3, "extra": Opaque()}, bad)
    r = in_process("train.py", [*BASE, "CHECKPOINT.RESUME", str(bad), "OUTPUT_DIR", str(tmp_path / "run")])
    line = assert_user_error(r, f"checkpoint '{bad}' cannot be loaded (a pickle holding Python objects other "
                                f"than tensors ({__name__}.Opaque), which weights_only loading refuses; ")
    assert line.endswith("name one it wrote (OUTPUT_DIR/checkpoints/last.pth))") and "\x1b" not in line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_resume_with_changed_config_is_refused(reference, tmp_path, in_process):
    """Keys that change the run are refused with exit 2, listing them; nothing in the folder changes."""
    out = unfinished_copy(reference, tmp_path / "run", keep=1)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"}
    changed = ["TRAIN.LR", "0.01", "MODEL.NAME", "resnet18"]
    r = in_process("train.py", [*BASE, *changed, "OUTPUT_DIR", str(out)])
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr + r.stdout
    assert "TRAIN.LR: 0.05 -> 0.01" in r.stderr and "MODEL.NAME: 'resnet10t' -> 'resnet18'" in r.stderr
    assert "last.pth" in r.stderr  # where the stored config came from
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"} == before
    # a finished run is refused the same way, before anything heavy is imported
    r = in_process("train.py", [*BASE, *changed, "OUTPUT_DIR", str(reference)])
    assert r.returncode == 2 and "TRAIN.LR: 0.05 -> 0.01" in r.stderr and "MODEL.NAME" in r.stderr


def test_extending_epochs_continues_training(reference, tmp_path, in_process):
    """TRAIN.EPOCHS raised on a finished run: refused unless TRAIN.EXTEND says so; then the finished result is
    kept beside, the run resumes at its last step and trains on with the schedule re-derived (a warm restart)."""
    out = unfinished_copy(reference, tmp_path / "run", keep=1)
    shutil.copyfile(reference / "results.json", out / "results.json")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = in_process("train.py", [*BASE, "TRAIN.EPOCHS", "3", "OUTPUT_DIR", str(out)])
    line = assert_user_error(r, "holds a finished run (2 epochs", "TRAIN.EXTEND True",
                             f"results-step{2 * STEPS_PER_EPOCH}.json", "warm restart")
    assert "another OUTPUT_DIR" in line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.lock"} == before
    r = run_tool("train.py", [*BASE, "TRAIN.EPOCHS", "3", "TRAIN.EXTEND", "true", "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert RESUMED.search(r.stdout).group(4) == str(2 * STEPS_PER_EPOCH)
    assert f"results.json is kept as results-step{2 * STEPS_PER_EPOCH}.json" in r.stdout
    assert "TRAIN.EPOCHS 2 -> 3" in r.stdout  # the one line on the schedule's new length
    kept = out / f"results-step{2 * STEPS_PER_EPOCH}.json"
    assert kept.read_bytes() == (reference / "results.json").read_bytes()
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "done" and res["epoch"] == 3 and res["step"] == 3 * STEPS_PER_EPOCH
    assert res["extended_from"] == [kept.name]  # never to be taken for a fresh 3-epoch run
    rows = train_rows(out)
    assert [r["step"] for r in rows] == list(range(1, 3 * STEPS_PER_EPOCH + 1))
    assert rows[: 2 * STEPS_PER_EPOCH] == train_rows(reference)
    assert all(r["train/lr"] > 0 for r in rows[2 * STEPS_PER_EPOCH: -1])  # the schedule spans the new length
    # the documented warm restart: the cosine had nearly ended; re-derived for 3 epochs its LR is back up
    assert rows[2 * STEPS_PER_EPOCH]["train/lr"] > 10 * rows[2 * STEPS_PER_EPOCH - 1]["train/lr"]
    assert [r["epoch"] for r in val_rows(out)] == [1, 2, 3]
    got = torch.load(out / "checkpoints" / "last.pth", weights_only=True)["model"]
    want = torch.load(reference / "checkpoints" / "last.pth", weights_only=True)["model"]
    assert not torch.equal(got["fc.weight"], want["fc.weight"])  # it learned something more


# ---- a crash while writing a checkpoint ----------------------------------------------------------------
_SAVER = """
import torch
from runner.checkpoint import save_checkpoint
state = {{"model": {{"w": torch.randn(12_000_000)}}, "step": 0}}
for step in range(1, 10_000):
    state["step"] = step
    save_checkpoint(state, {out!r}, step, keep=2, best=False)
    print(step, flush=True)
"""


def test_kill_during_save_leaves_only_loadable_files(tmp_path):
    """SIGKILL while a checkpoint is being written: every final name loads, the half file is a hidden temp,
    and the next save removes it."""
    out = tmp_path / "run"
    ck = out / "checkpoints"
    rng = random.Random(7)
    leftovers = []
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", _SAVER.format(root=str(ROOT), out=str(out))],
                             stdout=subprocess.PIPE, text=True, env=env())
        p.stdout.readline()  # one complete save
        while not any(TMP_RE.match(f.name) for f in ck.iterdir()):
            assert p.poll() is None
        time.sleep(rng.uniform(0, 0.02))
        p.kill()
        p.wait()
        p.stdout.close()
        assert_checkpoints_load(out)
        for f in ck.glob("step_*.pth"):
            assert ckpt_step(f) == int(STEP_RE.match(f.name).group(1))
        assert ckpt_step(ck / "last.pth") == max(int(STEP_RE.match(f.name).group(1)) for f in ck.glob("step_*"))
        leftovers = [f for f in ck.iterdir() if TMP_RE.match(f.name)]
        if leftovers:
            break
    assert leftovers, "no kill landed inside a save"
    save_checkpoint({"model": {"w": torch.zeros(1)}, "step": 99}, out, 99, keep=2, best=False)
    assert not [f for f in ck.iterdir() if TMP_RE.match(f.name)], "stale temporary files are cleaned up"


def test_save_failing_partway_keeps_the_previous_file(tmp_path):
    """A write that fails midway (disk full, simulated with RLIMIT_FSIZE) raises and leaves the old files."""
    import resource

    out = tmp_path / "run"
    save_checkpoint({"model": {"w": torch.ones(4)}, "step": 1}, out, 1, keep=2, best=False)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
        with pytest.raises((OSError, RuntimeError), match="File too large|unexpected pos"):
            save_checkpoint({"model": {"w": torch.ones(4 << 20)}, "step": 2}, out, 2, keep=2, best=False)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    ck = out / "checkpoints"
    assert sorted(f.name for f in ck.iterdir()) == ["last.pth", "step_00000001.pth"]
    assert ckpt_step(ck / "last.pth") == 1
    atomic_save({"ok": torch.ones(1)}, ck / "x.pth")  # and the folder still takes writes


# ---- two processes under torchrun -------------------------------------------------------------------------
def ddp_argv(out: Path, *launcher: str) -> list[str]:
    """torchrun with two CPU workers (gloo) running the same command as the single-process tests."""
    return torchrun(["--standalone", "--nproc_per_node=2", *launcher, TRAIN, *BASE, "OUTPUT_DIR", str(out)])


DDP_STEPS = 2 * (1437 // 2 // 64)  # two epochs of each rank's half of the split


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    """The uninterrupted two-process run."""
    out = tmp_path_factory.mktemp("ddp_reference")
    r = subprocess.run(ddp_argv(out), capture_output=True, text=True, cwd=ROOT, env=env(), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def ddp_interrupted(tmp_path_factory):
    """The same two-process job, interrupted three ways and restarted with the same command.

    1. under torchrun --max-restarts=1 a worker is SIGKILLed: torchrun restarts both, they resume by themselves;
       then the whole torchrun process group is SIGKILLed;
    2. SIGUSR1 reaches rank 1 only: both ranks agree on a step, rank 0 saves, both exit 75;
    3. left to finish.
    """
    out, logs = tmp_path_factory.mktemp("ddp_interrupted"), tmp_path_factory.mktemp("ddp_logs")
    rng = random.Random(99)
    info = {}
    job = Launch(ddp_argv(out, "--max-restarts=1"), logs, "restarts")
    info["killed_worker_at"] = job.wait_step(4)
    time.sleep(rng.uniform(0, 0.3))
    os.kill(job.worker(1), signal.SIGKILL)
    resumed = job.wait_for(RESUMED)
    info["auto_resumed_step"] = int(resumed.group(4))
    job.wait_step(info["auto_resumed_step"] + 4, since=resumed.end())
    time.sleep(rng.uniform(0, 0.3))
    job.kill_all()
    assert_checkpoints_load(out)

    job = Launch(ddp_argv(out), logs, "sigusr1")
    info["resumed_after_group_kill"] = int(job.wait_for(RESUMED).group(4))
    job.wait_step(info["resumed_after_group_kill"] + 3)
    time.sleep(rng.uniform(0, 0.3))
    t0 = time.monotonic()
    os.kill(job.worker(1), signal.SIGUSR1)
    info["rc"] = job.finish(timeout=60)
    info["seconds"] = time.monotonic() - t0
    info["stdout"], info["stderr"] = job.stdout, job.stderr
    info["status"] = json.loads((out / "run.json").read_text())
    info["last_step"] = ckpt_step(out / "checkpoints" / "last.pth")
    assert_checkpoints_load(out)

    job = Launch(ddp_argv(out), logs, "final")
    assert job.finish() == 0, job.stdout[-3000:] + job.stderr[-3000:]
    info["final_resumed"] = int(RESUMED.search(job.stdout).group(4))
    return out, info


def test_ddp_killed_and_restarted_equals_uninterrupted(ddp_interrupted, ddp_reference):
    """Two processes: worker killed (torchrun restarts it), job killed, one rank signalled: bit-identical."""
    out, info = ddp_interrupted
    # torchrun's restart resumed from a checkpoint (step 3 was saved before step 4 was logged), not from scratch
    assert 3 <= info["auto_resumed_step"] <= info["killed_worker_at"] + 3 and info["auto_resumed_step"] % 3 == 0
    assert info["final_resumed"] == info["last_step"]
    assert json.loads((out / "results.json").read_text())["world_size"] == 2
    assert json.loads((out / "results.json").read_text())["step"] == DDP_STEPS
    assert_same_run(out, ddp_reference)  # exact: tolerance zero


def test_ddp_sigusr1_on_one_rank_stops_every_rank(ddp_interrupted):
    out, info = ddp_interrupted
    assert info["seconds"] < 30
    assert info["status"]["status"] == "preempted" and info["status"]["step"] == info["last_step"]
    assert re.search(rf"preempted (at step {info['last_step']}|after epoch)", info["stderr"]), info["stderr"][-3000:]
    # torchrun's summary: both workers exited 75 (torchrun itself exits 1)
    assert set(re.findall(r"rank\s+: (\d) \(local_rank.*\n\s+exitcode\s+: 75\b", info["stderr"])) == {"0", "1"}
    assert info["rc"] == 1


# ---- Ctrl-C -------------------------------------------------------------------------------------------------
CTRL_C = ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "TRAIN.EPOCHS", "2",
          "DATA.NUM_WORKERS", "0", "LOG.PERIOD", "1", "LOG.PROGRESS", "plain"]


def test_ctrl_c_once_saves_and_exits_75(tmp_path):
    """A first Ctrl-C behaves like SIGTERM: the step finishes, is saved, exit 75, status preempted."""
    job = Launch([sys.executable, TRAIN, *CTRL_C, "OUTPUT_DIR", str(tmp_path / "run")], tmp_path, "once")
    job.wait_step(3)
    job.p.send_signal(signal.SIGINT)
    assert job.finish(60) == EXIT_PREEMPTED, job.stderr
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["status"] == "preempted" and status["step"] >= 3
    assert ckpt_step(tmp_path / "run" / "checkpoints" / "last.pth") == status["step"]
    assert "Ctrl-C again to stop at once" in job.stdout and "Traceback" not in job.stderr


def test_ctrl_c_twice_stops_at_once_with_one_line(tmp_path):
    """A second Ctrl-C stops without saving: exit 130, one stderr line, status interrupted, resumable."""
    out = tmp_path / "run"
    slow = ["DATA.IMG_SIZE", "96", "CHECKPOINT.PERIOD", "1"]  # steps of about a second: time for the second
    job = Launch([sys.executable, TRAIN, *CTRL_C, *slow, "OUTPUT_DIR", str(out)], tmp_path, "twice")
    job.wait_step(2)  # step 1 is saved
    job.p.send_signal(signal.SIGINT)
    job.wait_for(re.compile("Ctrl-C again"))  # the first is handled: the second now stops at once
    job.p.send_signal(signal.SIGINT)
    assert job.finish(60) == 130, job.stderr
    assert job.stderr.strip() == "interrupted" and "Traceback" not in job.stdout
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    assert_checkpoints_load(out)
    r = run_tool("train.py", [*CTRL_C, *slow, "TRAIN.MAX_STEPS", "3", "OUTPUT_DIR", str(out)])
    assert r.returncode == 0 and RESUMED.search(r.stdout), r.stdout[-2000:] + r.stderr
