"""Certified continuation of a whole search study: with `seed` set and one worker, a search killed with SIGKILL at
random moments (the worker, or the trial's tools/train.py), several times, and re-run to the end gives the same
trials, the same parameters, the same rung values and promotions, the same best and bit-identical final checkpoints
as the same search left alone. Real tools/train.py on the digits, real workers, real kills."""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from runner.sweep.search import load_search
from runner.sweep.study import open_study
from runner.sweep.worker import MAX_KILLS
from tests.engine.test_resume import _steady, assert_same
from tests.utils import env, is_alive

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs/digits/test_resnet.yaml"
STEP = re.compile(r" step (\d+)/(\d+) ")
KILLS = 4  # SIGKILLs in all, each at a random step, of the worker or of its trial's process
SEED = int(os.environ.get("STUDY_KILL_SEED", "40"))  # the kill plan's seed: set it to replay another plan


def sweep(tmp_path: Path, name: str) -> Path:
    """A seeded ASHA search of 3 trials (eta 3, rungs at epochs 1 and 3) on the digits, rooted at tmp/NAME_out."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"cfg: {DIGITS}\nroot: {tmp_path / (name + '_out')}\n"
        "set: {TRAIN.EPOCHS: 3, DATA.IMG_SIZE: 16, MODEL.NAME: resnet10t, DATA.BATCH_SIZE: 64, LOG.PERIOD: 2,\n"
        "      LOG.PROGRESS: plain, DATA.NUM_WORKERS: 0, CHECKPOINT.PERIOD: 5}\n"
        "search:\n  trials: 3\n  seed: 11\n  asha: {eta: 3, min_epochs: 1}\n"
        "  space:\n    TRAIN.LR: {log: [0.01, 0.2]}\n    TRAIN.WEIGHT_DECAY: {uniform: [0.0, 0.001]}\n")
    return path


def start(path: Path) -> subprocess.Popen:
    """One search worker, in its own session (so a kill reaches it alone), without the table."""
    return subprocess.Popen([sys.executable, "-m", "runner.sweep", "search", "--no-table", str(path)], cwd=ROOT,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def steps_logged(root: Path) -> int:
    """Training-step lines printed by every trial's segments so far."""
    logs = sorted((root / "logs").glob("trial_*.log")) if (root / "logs").is_dir() else []
    return sum(len(STEP.findall(p.read_text(errors="replace"))) for p in logs)


def trainer_of(pid: int) -> int | None:
    """The worker's tools/train.py process (its child), if one runs now."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rpartition(")")[2].split()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == pid and b"train.py" in cmd:
            return int(entry.name)
    return None


def run_with_kills(path: Path, plan: list[tuple[str, int]]) -> list[str]:
    """Run the search to its end, killing per `plan` ((worker|trial, after that many more step lines)); what was
    done, for the failure message."""
    root = Path(load_search(str(path)).root)
    proc, done = start(path), []
    for target, after in plan:
        goal = steps_logged(root) + after
        end = time.monotonic() + 300
        while steps_logged(root) < goal and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        child = trainer_of(proc.pid)
        if proc.poll() is not None:
            break
        if target == "trial" and child is not None:
            os.kill(child, signal.SIGKILL)  # the worker sees it die of a signal and resumes it
            done.append(f"trial pid {child} after {after} steps")
            continue
        os.kill(proc.pid, signal.SIGKILL)  # its trial gets SIGTERM from the kernel, saves and exits 75
        proc.wait(60)
        done.append(f"worker pid {proc.pid} after {after} steps (trial {child})")
        proc = start(path)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"{done}\n{out[-3000:]}"
    return done


def final_state(trial_dir: Path) -> dict:
    """The trial's last checkpoint without its volatile entries (wall time, throughput, the config's paths)."""
    return _steady(torch.load(trial_dir / "checkpoints" / "last.pth", map_location="cpu", weights_only=True))


def kill_plan(rng: random.Random) -> list[tuple[str, int]]:
    """KILLS (target, steps after the previous kill); at most MAX_KILLS of trials (a trial killed more often in a
    row fails by design: the OOM killer at every start)."""
    plan = []
    for _ in range(KILLS):
        target = rng.choice(["worker", "trial"])
        trials = sum(t == "trial" for t, _ in plan)
        plan.append(("worker" if target == "trial" and trials == MAX_KILLS else target, rng.randint(2, 14)))
    return plan


@pytest.mark.slow
def test_a_study_killed_at_random_equals_the_study_left_alone(tmp_path):
    plan = kill_plan(random.Random(SEED))
    ref_path, kill_path = sweep(tmp_path, "alone"), sweep(tmp_path, "killed")
    left_alone = subprocess.run([sys.executable, "-m", "runner.sweep", "search", "--no-table", str(ref_path)],
                                cwd=ROOT, env=env(), capture_output=True, text=True, timeout=900)
    assert left_alone.returncode == 0, left_alone.stdout[-3000:] + left_alone.stderr
    done = run_with_kills(kill_path, plan)
    why = f"kill plan (STUDY_KILL_SEED={SEED}): {done}"
    assert len(done) >= KILLS - 1, why  # the kills landed while the study trained (the last may find it done)
    ref, got = load_search(str(ref_path)), load_search(str(kill_path))
    ref_study, got_study = open_study(ref, create=False), open_study(got, create=False)
    want, have = ref_study.get_trials(), got_study.get_trials()
    assert [t.number for t in have] == [t.number for t in want], why
    for a, b in zip(have, want, strict=True):
        assert a.params == b.params, (why, a.number)
        assert a.intermediate_values == b.intermediate_values, (why, a.number)  # rung values: the promotions
        assert a.state == b.state and a.value == b.value, (why, a.number, a.state, b.state)
        assert "error" not in a.user_attrs, (why, a.user_attrs)
        assert_same(final_state(Path(got.trial_dir(a.number))), final_state(Path(ref.trial_dir(b.number))),
                    f"trial {a.number} last.pth")
    assert best_of(have) is not None and best_of(have) == best_of(want), why
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and is_alive(int(p.name))
                and b"killed_out" in _cmdline(p)], "a trial's process outlived the test"


def best_of(trials) -> tuple | None:
    """(number, value) of the best trial that trained to the full length (ties: the earlier)."""
    done = [t for t in trials if t.value is not None]
    top = min(done, key=lambda t: (-t.value, t.number), default=None)
    return None if top is None else (top.number, top.value)


def _cmdline(entry: Path) -> bytes:
    """A process's command line ('' once it is gone)."""
    try:
        return (entry / "cmdline").read_bytes()
    except OSError:
        return b""
