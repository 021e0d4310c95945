"""tools/sweeps/slurm.sh on a real single-node SLURM (tests/slurm_cluster.py): a throttled 4-point array,
re-submission, preemption by `scontrol requeue` and by `scancel --signal=USR1 --full` continued bit-identically,
a SLURM time limit with its warning signal (and its TRAIN.TIME_LIMIT backstop on an array's last task), a data
path that fails once, a busy folder of another config that fails, a 2-process point through srun+torchrun,
and a point on a JPEG folder with 2 loader workers stopped by `scancel` (re-submitted) or `scontrol requeue`: SIGTERM
to every process of the task, its workers included, saves (exit 75) and the point continues bit-identically.

Every point is tiny digits (test_resnet at 8 px, one thread). SLURM holds a requeued job 120 s (its BeginTime);
the tests start it at once with `scontrol update StartTime=now` (Cluster.release_requeued), as a user may.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.data.fixtures import export_digits_jpegs
from tests.engine.test_resume import assert_same_run
from tests.slurm_cluster import Cluster
from tests.utils import ROOT, TRAIN, assert_user_error, read_jsonl

SLURM_SH = str(ROOT / "tools" / "sweeps" / "slurm.sh")
CFG = str(ROOT / "configs" / "digits" / "resnet18.yaml")
TINY = ["DATA.IMG_SIZE", "8", "DATA.BATCH_SIZE", "16", "DATA.VAL_FRACTION", "0.1", "DATA.NUM_WORKERS", "0",
        "LOG.PERIOD", "1"]
# 3 x 101 steps, ~8 s: long enough to be stopped mid-epoch; with an EMA and mixup, so that more state must resume
LONG = ["TRAIN.EPOCHS", "3", "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9", "AUG.MIXUP", "0.2", *TINY]


def slurm_sh(cluster: Cluster | None, *args: str, **env: str) -> subprocess.CompletedProcess:
    """tools/sweeps/slurm.sh with this interpreter, one thread per point, against the test cluster."""
    base = cluster.env if cluster is not None else dict(os.environ)
    full = {**base, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env}
    return subprocess.run(["bash", SLURM_SH, *args], capture_output=True, text=True, timeout=60, env=full,
                          cwd=ROOT)


def sweep_file(folder: Path, body: str, root: str = "sweep") -> Path:
    """A sweep file on the digits config (`body`: its other sections), its points under folder/root."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "s.yaml"
    path.write_text(f"cfg: {CFG}\nroot: {root}\n{body}")
    return path


GRID = "grid:\n  TRAIN.LR: [0.1, 0.05]\n  MODEL.NAME: [test_resnet, test_efficientnet]\n"


def wait_all_ended(cluster: Cluster, timeout: float = 150) -> None:
    """Until no job is left in the queue; requeued ones are started at once instead of after 120 s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        cluster.release_requeued()
        if not cluster.run("squeue", "-h", check=False).stdout.strip():
            return
        time.sleep(0.5)
    raise AssertionError(f"jobs left after {timeout} s:\n{cluster.run('squeue', check=False).stdout}")


def state(out: Path) -> Path:
    """Where `slurm.sh run ... OUTPUT_DIR out` keeps the run's logs and SLURM files: out.slurm, beside it."""
    return out.parent / f"{out.name}.slurm"


def events(root: Path, point: str) -> list[dict]:
    """The point's SLURM events (start/end of each task), oldest first."""
    return [json.loads(line) for line in (root / "slurm" / "events" / f"{point}.jsonl").read_text().splitlines()]


def wait_step(out: Path, step: int, timeout: float = 60) -> None:
    """Until the run's metrics.jsonl has a training line past `step`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if any(r.get("step", 0) > step and "train/loss" in r for r in read_jsonl(out / "metrics.jsonl")):
                return
        except (OSError, ValueError):
            pass  # not written yet, or a line half-written
        time.sleep(0.1)
    raise AssertionError(f"{out} did not pass step {step} in {timeout} s")


def wait_task_end(root: Path, point: str, timeout: float = 60, job: str | None = None) -> dict:
    """The end event of the point's first task (of array job `job`, if given), once its batch shell wrote it."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            ends = [e for e in events(root, point) if e["event"] == "end" and job in (None, e["job"])]
        except (OSError, ValueError):
            ends = []  # not written yet, or a line half-written
        if ends:
            return ends[0]
        time.sleep(0.1)
    raise AssertionError(f"no task of {point} ended within {timeout} s")


def wait_job_state(cluster: Cluster, job: str, timeout: float = 60) -> str:
    """The job's JobState once it has left the queue's live states (the batch shell's last line runs before)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        shown = cluster.run("scontrol", "show", "job", job, check=False).stdout
        found = re.search(r"JobState=(\w+)", shown)
        if found and found.group(1) not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return found.group(1)
        time.sleep(0.1)
    raise AssertionError(f"job {job} still live after {timeout} s:\n{shown}")


def wait_resumed(cluster: Cluster, out: Path, since: float, timeout: float = 90) -> tuple[int, float]:
    """The step the run stopped at, and the seconds from `since` until the requeued task logged the next one."""
    end = time.monotonic() + timeout
    log = state(out) / "logs" / f"{out.name}.log"
    stop = None
    while time.monotonic() < end:
        cluster.release_requeued()
        text = log.read_text()
        if stop is None and "preempted at step " in text:
            stop = int(text.split("preempted at step ")[1].split(":")[0])
        if stop is not None and "resumed from" in text:
            try:
                if any(r["step"] == stop + 1 for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r):
                    return stop, time.time() - since
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    tasks = "".join(f.read_text() for f in sorted((state(out) / "slurm" / "logs").glob("*.out")))
    raise AssertionError(f"no step after the preemption within {timeout} s:\n{log.read_text()[-1000:]}\n{tasks}"
                         f"\n{cluster.run('squeue', '-o', '%i %T %r %S', check=False).stdout}\n{cluster.logs()}")


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most intervals open at one time."""
    marks = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = most = 0
    for _, d in marks:
        now += d
        most = max(most, now)
    return most


def table_rows(root: Path) -> dict[str, str]:
    """The sweep's table.md rows by run name (the whole line)."""
    rows = {}
    for line in (root / "slurm" / "table.md").read_text().splitlines():
        cells = [c.strip().strip("*") for c in line.split("|")]
        if len(cells) > 3 and cells[2] not in ("run", "---", ""):
            rows[cells[2]] = line
    return rows


def train_alone(out: Path, args: list[str]) -> Path:
    """`out` trained once without interruption (tools/train.py, one thread, no SLURM)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, TRAIN, "--cfg", CFG, "OUTPUT_DIR", str(out), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The point of the preemption tests, trained once without interruption."""
    return train_alone(tmp_path_factory.mktemp("slurm_ref") / "ref", LONG)


@pytest.fixture(scope="module")
def folder_point(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The KEY VALUE pairs of a point on a JPEG folder read by 2 loader workers (2 x ~180 steps of 8 images)."""
    jpegs = export_digits_jpegs(tmp_path_factory.mktemp("slurm_jpegs") / "jpegs", size=16)
    return ["DATA.NAME", "folder", "DATA.ROOT", str(jpegs), "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "8",
            "DATA.NUM_WORKERS", "2", "TRAIN.EPOCHS", "2", "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9",
            "LOG.PERIOD", "1"]


@pytest.fixture(scope="module")
def folder_reference(tmp_path_factory: pytest.TempPathFactory, folder_point: list[str]) -> Path:
    """The folder point trained once without interruption."""
    return train_alone(tmp_path_factory.mktemp("slurm_folder_ref") / "ref", folder_point)


@pytest.mark.slow
def test_sweep_array_throttled_and_resubmitted(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """4 points with THROTTLE=2: at most 2 tasks at once, all done, 4 rows; the same command again submits nothing."""
    path, root = sweep_file(tmp_path, GRID), tmp_path / "sweep"
    t0 = time.monotonic()
    first = slurm_sh(slurm_cluster, str(path), "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "4", *TINY, THROTTLE="2")
    assert first.returncode == 0, first.stderr
    assert "as array job" in first.stdout and "(0-3%2)" in first.stdout, first.stdout
    wait_all_ended(slurm_cluster)
    wall = time.monotonic() - t0
    points = [f"lr={lr},model.name={m}" for lr in ("0.1", "0.05") for m in ("test_resnet", "test_efficientnet")]
    spans = []
    for p in points:
        ev = events(root, p)
        assert [e["event"] for e in ev] == ["start", "end"] and ev[1]["action"] == "done", ev
        spans.append((ev[0]["t"], ev[1]["t"]))
        assert json.loads((root / p / "results.json").read_text())["status"] == "done"
    assert max_overlap(spans) == 2, spans  # throttled to 2, and 2 did run side by side
    rows = table_rows(root)  # written by the dependent job once the array ended
    assert sorted(rows) == sorted(points) and all("| done |" in r for r in rows.values()), rows
    printed = next((root / "slurm" / "logs").glob("table-*.out")).read_text()
    assert printed == (root / "slurm" / "table.md").read_text(), printed  # the table job printed it too
    t1 = time.monotonic()
    again = slurm_sh(slurm_cluster, str(path), "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "4", *TINY, THROTTLE="2")
    resubmit = time.monotonic() - t1
    assert again.returncode == 0, again.stderr
    assert "nothing submitted" in again.stdout and all(f"skip {p} (done)" in again.stdout for p in points)
    assert not slurm_cluster.run("squeue", "-h").stdout.strip()
    assert len(list((root / "slurm").glob("submit-*.tsv"))) == 1  # no second array
    print(f"4-point sweep (throttle 2): {wall:.1f} s to all ended; re-submission {resubmit:.2f} s")


SEARCH = ("set: {TRAIN.EPOCHS: 2, DATA.IMG_SIZE: 8, DATA.BATCH_SIZE: 64, DATA.VAL_FRACTION: 0.1, "
          "DATA.NUM_WORKERS: 0}\nsearch:\n  trials: 3\n  seed: 0\n  asha: {eta: 2, min_epochs: 1}\n"
          "  space: {TRAIN.LR: {log: [1.0e-4, 1.0e-1]}}\n")


def study_trials(path: Path, *extra: str) -> list:
    """The trials of the search in the sweep file at `path` (`extra`: the command line's KEY VALUE)."""
    from runner.sweep.search import load_search
    from runner.sweep.study import open_study

    return open_study(load_search(str(path), list(extra)), create=False).trials


@pytest.mark.slow
def test_search_workers_finish_the_study_and_the_table_job_prints_it(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """WORKERS=2: an array of two search workers that pull trials until the study is done; then the search table."""
    from optuna.trial import TrialState

    path, root = sweep_file(tmp_path, SEARCH), tmp_path / "sweep"
    sub = slurm_sh(slurm_cluster, str(path), "LOG.PERIOD", "5", WORKERS="2")
    assert sub.returncode == 0, sub.stderr
    assert "submitted 2 worker(s) as array job" in sub.stdout and "(0-1)" in sub.stdout, sub.stdout
    wait_all_ended(slurm_cluster, timeout=300)
    for k in range(2):
        ev = events(root, f"worker_{k}")
        assert [e["event"] for e in ev] == ["start", "end"] and ev[1]["action"] == "done", ev
    trials = study_trials(path, "LOG.PERIOD", "5")
    assert len(trials) == 3 and all(t.state in (TrialState.COMPLETE, TrialState.RUNNING) for t in trials)
    assert sum(t.state == TrialState.COMPLETE for t in trials) >= 1
    table = (root / "slurm" / "table.md").read_text()
    assert "3 of 3 trials" in table and f"--cfg {root}/trial_" in table, table
    assert (root / "report.html").is_file()
    logs = {p.name for p in (root / "logs").iterdir()}
    assert {"worker_0.log", "worker_1.log", "trial_0.log"} <= logs, logs


@pytest.mark.slow
def test_a_requeued_search_worker_resumes_its_trial(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """USR1 to a worker mid-trial: the trial saves (75), the worker exits 75 and requeues; the trial resumes."""
    path, root = sweep_file(tmp_path, SEARCH.replace("TRAIN.EPOCHS: 2", "TRAIN.EPOCHS: 4, TRAIN.EMA: true").replace(
        "DATA.BATCH_SIZE: 64", "DATA.BATCH_SIZE: 16").replace("trials: 3", "trials: 1").replace(
        "  asha: {eta: 2, min_epochs: 1}\n", "")), tmp_path / "sweep"  # one trial, trained to the end in one go
    # LOG.PERIOD 1: a row per step (a row after a mid-period resume averages fewer steps than a straight run's)
    sub = slurm_sh(slurm_cluster, str(path), "LOG.PERIOD", "1", WORKERS="1")
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.split("array job ")[1].split()[0]
    wait_step(root / "trial_0", 20, timeout=120)
    slurm_cluster.run("scancel", "--signal=USR1", "--full", f"{job}_0")
    wait_all_ended(slurm_cluster, timeout=300)
    ev = events(root, "worker_0")
    assert [e["event"] for e in ev] == ["start", "end", "start", "end"], ev
    assert ev[1]["action"] == "requeue" and ev[1]["rc"] == 75 and ev[3]["action"] == "done", ev
    log = (root / "logs" / "trial_0.log").read_text()
    assert "preempted at step" in log and "resumed from" in log, log[-2000:]
    steps = [r["step"] for r in read_jsonl(root / "trial_0" / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, steps[-1] + 1)), "steps lost or repeated across the requeue"
    assert [t.state.name for t in study_trials(path, "LOG.PERIOD", "1")] == ["COMPLETE"]
    ref = tmp_path / "straight"  # the trial's own config trained without a stop: the same run, exactly
    proc = subprocess.run([sys.executable, TRAIN, "--cfg", str(root / "trial_0" / "config.yaml"), "OUTPUT_DIR",
                           str(ref)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_same_run(root / "trial_0", ref)


@pytest.mark.slow
def test_a_requeued_two_process_search_worker_resumes_its_trial_exactly(slurm_cluster: Cluster,
                                                                       tmp_path: Path) -> None:
    """NPROC_PER_NODE=2 for a search: the trial trains under torchrun with 2 gloo processes; USR1 mid-trial saves it
    (75), the worker requeues, the trial resumes, and it equals its config trained straight under torchrun x 2."""
    path, root = sweep_file(tmp_path, SEARCH.replace("TRAIN.EPOCHS: 2", "TRAIN.EPOCHS: 4, TRAIN.EMA: true").replace(
        "DATA.BATCH_SIZE: 64", "DATA.BATCH_SIZE: 8").replace("trials: 3", "trials: 1").replace(
        "  asha: {eta: 2, min_epochs: 1}\n", "")), tmp_path / "sweep"
    sub = slurm_sh(slurm_cluster, str(path), "LOG.PERIOD", "1", WORKERS="1", NPROC_PER_NODE="2")
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.split("array job ")[1].split()[0]
    wait_step(root / "trial_0", 20, timeout=180)
    slurm_cluster.run("scancel", "--signal=USR1", "--full", f"{job}_0")
    wait_all_ended(slurm_cluster, timeout=400)
    ev, log = events(root, "worker_0"), (root / "logs" / "trial_0.log").read_text()
    assert [e["event"] for e in ev] == ["start", "end", "start", "end"], (ev, log[-3000:])
    assert ev[1]["action"] == "requeue" and ev[1]["rc"] == 75 and ev[3]["action"] == "done", (ev, log[-3000:])
    assert log.count("torch.distributed.run --standalone --nproc_per_node=2") == 2, log[-3000:]
    assert "preempted at step" in log and "resumed from" in log and "(2 processes)" in log, log[-3000:]
    assert [t.state.name for t in study_trials(path, "LOG.PERIOD", "1")] == ["COMPLETE"]
    ref = tmp_path / "straight"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAIN,
                           "--cfg", str(root / "trial_0" / "config.yaml"), "OUTPUT_DIR", str(ref)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert_same_run(root / "trial_0", ref)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["scontrol-requeue", "scancel-usr1"])
def test_preempted_task_continues_exactly(slurm_cluster: Cluster, tmp_path: Path, reference: Path, how: str) -> None:
    """A task preempted mid-epoch is requeued, resumes from its checkpoint and ends equal to the run left alone."""
    out = tmp_path / "pt"
    sub = slurm_sh(slurm_cluster, "run", "--cfg", CFG, "OUTPUT_DIR", str(out), *LONG)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.split("array job ")[1].split()[0]
    per_epoch = json.loads((reference / "results.json").read_text())["step"] // 3
    wait_step(out, per_epoch + per_epoch // 3)  # a third into epoch 2
    t_signal = time.time()
    if how == "scontrol-requeue":  # SLURM's own requeue: SIGTERM to every process, the runner saves
        slurm_cluster.run("scontrol", "requeue", f"{job}_0")
    else:  # the user's (or a preempting scheduler's) USR1: the task saves and requeues itself
        slurm_cluster.run("scancel", "--signal=USR1", "--full", f"{job}_0")
    stop_step, latency = wait_resumed(slurm_cluster, out, t_signal)
    wait_all_ended(slurm_cluster)
    ev = events(state(out), "pt")
    assert [e["event"] for e in ev] == ["start", "end", "start", "end"], ev
    assert ev[1]["action"] == ("stopped" if how == "scontrol-requeue" else "requeue"), ev[1]
    assert ev[2]["restart"] == 1 and ev[3]["action"] == "done", ev
    assert per_epoch < stop_step < 2 * per_epoch, (stop_step, per_epoch)  # mid-epoch 2
    assert f"resumed from {out / 'checkpoints' / 'last.pth'}" in (state(out) / "logs" / "pt.log").read_text()
    assert_same_run(out, reference)
    print(f"{how}: from the signal to the requeued task's next step (step {stop_step + 1}): {latency:.1f} s")


def task_texts(root: Path, point: str) -> str:
    """Everything a point's tasks wrote: the run's log (its stdout and stderr) and the tasks' own SLURM logs."""
    logs = [root / "logs" / f"{point}.log", *sorted((root / "slurm" / "logs").glob("*.out"))]
    return "".join(f.read_text(errors="replace") for f in logs)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["scancel", "scontrol-requeue"])
def test_sigterm_to_every_process_with_loader_workers(slurm_cluster: Cluster, tmp_path: Path, folder_point: list[str],
                                                      folder_reference: Path, how: str) -> None:
    """SIGTERM to every process of a task reading a JPEG folder with 2 workers: exit 75, saved, continued exactly.

    scancel JOB (SIGCONT and SIGTERM to every process of every step, the batch shell and the loader workers
    included; the job ends CANCELLED, never requeued) is the user's cancel: the same command re-submitted goes on.
    scontrol requeue sends the same signals and requeues the job, as a preemption with PreemptMode=REQUEUE does.
    """
    out = tmp_path / "fw"
    cmd = ("run", "--cfg", CFG, "OUTPUT_DIR", str(out), *folder_point)
    sub = slurm_sh(slurm_cluster, *cmd)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.split("array job ")[1].split()[0]
    per_epoch = json.loads((folder_reference / "results.json").read_text())["step"] // 2
    wait_step(out, per_epoch + 5)  # in epoch 2, its workers started afresh
    t_signal = time.time()
    slurm_cluster.run(*(["scancel"] if how == "scancel" else ["scontrol", "requeue"]), f"{job}_0")
    first = wait_task_end(state(out), "fw")
    assert first["action"] == "stopped" and first["rc"] == 75, f"{first}\n{task_texts(state(out), 'fw')[-3000:]}"
    assert first["why"].endswith("run.json preempted"), first  # the helper's reading of run.json at the end
    if how == "scancel":
        wait_all_ended(slurm_cluster)  # cancelled: not requeued
        assert '"status": "preempted"' in (out / "run.json").read_text()
        again = slurm_sh(slurm_cluster, *cmd)  # the user's re-submission: a new job, which resumes
        assert again.returncode == 0 and "submitted 1 point(s)" in again.stdout, again.stderr
    stop_step, latency = wait_resumed(slurm_cluster, out, t_signal)
    wait_all_ended(slurm_cluster)
    ev, texts = events(state(out), "fw"), task_texts(state(out), "fw")
    assert [e["event"] for e in ev] == ["start", "end", "start", "end"] and ev[3]["action"] == "done", ev
    assert "task 0: Exited with exit code 75" in texts and texts.count("received SIGTERM") == 1  # once, not per worker
    for bad in ("DataLoader worker", "killed by signal", "Traceback"):
        assert bad not in texts, texts[-3000:]
    assert texts.count("preempted at step") == 1 and per_epoch < stop_step < 2 * per_epoch, (stop_step, per_epoch)
    assert_same_run(out, folder_reference)
    print(f"{how} with 2 loader workers: from the signal to the next step (step {stop_step + 1}): {latency:.1f} s")


@pytest.mark.slow
def test_time_limit_warning_saves_requeues_and_finishes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """--time=1 with USR1 50 s before it: the task saves at the warning, requeues itself and finishes.

    Each attempt trains from its start-up until the warning or TRAIN.TIME_LIMIT, whichever comes first: slurmctld
    checks time limits every 30 s, so the warning due 10 s after the start may come up to 30 s later, and the
    backstop (the time left minus 30 s) stops the task 30 s after it started. The run must outlast that: 50 x 101
    steps, about twice what one attempt trains on an idle 2-core machine (25 epochs ended in the first attempt
    once the runner got faster, CI 2026-11-26), so two or three attempts, more under load."""
    out = tmp_path / "tl"
    sub = slurm_sh(slurm_cluster, "--time=1", "run", "--cfg", CFG, "OUTPUT_DIR", str(out), "TRAIN.EPOCHS", "50",
                   *TINY, WARN_SIGNAL="USR1@50")
    assert sub.returncode == 0, sub.stderr
    wait_all_ended(slurm_cluster, timeout=300)
    ev = events(state(out), "tl")
    ends = [e for e in ev if e["event"] == "end"]
    assert ends[0]["action"] == "requeue", ends  # stopped by the warning signal (or TRAIN.TIME_LIMIT), requeued
    assert ends[-1]["action"] == "done" and len(ends) >= 2, ends
    assert json.loads((out / "results.json").read_text())["status"] == "done"
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]
    assert steps == list(range(1, steps[-1] + 1)), "steps lost or repeated across the requeue"


@pytest.mark.slow
def test_bad_data_path_fails_once_and_the_table_says_why(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """A data folder the task cannot see (paths are the tasks' to check): exit 2 once, no requeue, one table line.

    (A key that does not exist is now refused before submitting: test_a_wrong_point_is_refused_before_submitting.)
    """
    out = tmp_path / "bad"
    sub = slurm_sh(slurm_cluster, "run", "--cfg", CFG, "OUTPUT_DIR", str(out), "DATA.NAME", "folder", "DATA.ROOT",
                   str(tmp_path / "no_such_data"), *TINY)
    assert sub.returncode == 0, sub.stderr
    wait_all_ended(slurm_cluster)
    ev = events(state(out), "bad")
    assert [e["event"] for e in ev] == ["start", "end"] and ev[1]["action"] == "failed" and ev[1]["rc"] == 2, ev
    row = table_rows(state(out))["bad"]
    assert "| failed |" in row and "no_such_data" in row and "exit 2" in row, row


@pytest.mark.slow
def test_two_process_point_through_srun_and_torchrun(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """NPROC_PER_NODE=2: the task runs srun -> torchrun with 2 gloo processes, and the point is done."""
    out = tmp_path / "ddp"
    sub = slurm_sh(slurm_cluster, "run", "--cfg", CFG, "OUTPUT_DIR", str(out), "TRAIN.EPOCHS", "1",
                   "TRAIN.MAX_STEPS", "4", *TINY, NPROC_PER_NODE="2")
    assert sub.returncode == 0, sub.stderr
    wait_all_ended(slurm_cluster)
    task_out = next((state(out) / "slurm" / "logs").glob("*_0.out")).read_text()
    assert "1 node(s) x 2 process(es)" in task_out and "ddp: done" in task_out, task_out
    assert json.loads((out / "results.json").read_text())["status"] == "done"
    log = (state(out) / "logs" / "ddp.log").read_text()
    assert "on cpu (2 processes)" in log, log[-2000:]


@pytest.mark.parametrize("setting, env, fragment", [
    ("throttle 0", {"THROTTLE": "0"}, "THROTTLE=0"),
    ("no sbatch", {"SBATCH": "/nonexistent/sbatch"}, "SBATCH=/nonexistent/sbatch"),
    ("SLURM_CONF unreadable", {"SLURM_CONF": "/nonexistent/slurm.conf"}, "SLURM_CONF=/nonexistent/slurm.conf"),
    ("bad warning signal", {"WARN_SIGNAL": "HUP@60"}, "WARN_SIGNAL=HUP@60"),
])
def test_bad_setting_is_one_line_before_submitting(tmp_path: Path, setting: str, env: dict, fragment: str) -> None:
    """Each mistake: exit 2, one line naming the setting, and no submission folder."""
    root = tmp_path / "sweep"
    proc = slurm_sh(None, str(sweep_file(tmp_path, GRID)), **{"SBATCH": sys.executable, **env})
    assert_user_error(proc, fragment)
    assert not root.exists(), setting


@pytest.fixture
def fake_sbatch(tmp_path: Path) -> Path:
    """An sbatch that records each call's argv (one JSON line in its .calls file) and answers job id 7."""
    path = tmp_path / "sbatch"
    path.write_text(f"#!{sys.executable}\nimport json, sys\nwith open({str(path) + '.calls'!r}, 'a') as f:\n"
                    "    f.write(json.dumps(sys.argv[1:]) + '\\n')\nprint(7)\n")
    path.chmod(0o755)
    return path


def sbatch_calls(fake: Path) -> list[list[str]]:
    """The argv of every call of the fake sbatch."""
    calls = Path(f"{fake}.calls")
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


@pytest.mark.parametrize("body, args, fragments", [
    (GRID, ["TRAIN.EPOCS", "3"], ["point lr=0.1,model.name=test_resnet", "TRAIN.EPOCS"]),  # a typo
    (GRID, ["TRAIN.EPOCHS", "3", "DATA.IMG_SIZE"], ["DATA.IMG_SIZE"]),  # an odd number of overrides
    ("grid: {MODEL.NAME: ['hf-hub:timm/test_resnet', 'hf-hub:timm_test_resnet']}\n", [],
     ["MODEL.NAME=hf-hub:timm/test_resnet and MODEL.NAME=hf-hub:timm_test_resnet", "one folder"]),
    ("grid:\n", [], ["no points"]),
    ("search: {trials: 2, asha: {eta: 1}, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n", [], ["eta must be"]),
    ("", ["run", "--cfg", CFG, "OUTPUT_DIR", "OUT", "TRAIN.LR", "fast"], ["TRAIN.LR expects a number"]),
])
def test_a_wrong_point_is_refused_before_submitting(tmp_path: Path, fake_sbatch: Path, body: str, args: list[str],
                                                    fragments: list[str]) -> None:
    """Used to submit the array and the table job (exit 0); every task then failed in the queue."""
    path = sweep_file(tmp_path, body)
    args = [str(tmp_path / "r" / "run1") if a == "OUT" else a for a in args]
    proc = slurm_sh(None, *(args if args[:1] == ["run"] else [str(path), *args]), SBATCH=str(fake_sbatch))
    assert_user_error(proc, *fragments)
    assert sbatch_calls(fake_sbatch) == [] and not (tmp_path / "sweep").exists() and not (tmp_path / "r").exists()


def test_neither_a_file_nor_run_is_one_line(tmp_path: Path, fake_sbatch: Path) -> None:
    """`slurm.sh nosuch` (the old script-name form, lr_x_model, too) names what it takes."""
    for what in ("nosuch", "lr_x_model"):
        assert_user_error(slurm_sh(None, what, SBATCH=str(fake_sbatch)), f"{what} is neither a sweep file")
    assert_user_error(slurm_sh(None, str(tmp_path / "no.yaml"), SBATCH=str(fake_sbatch)), "no.yaml not found")


def test_search_file_submits_its_workers_and_the_search_table(tmp_path: Path, fake_sbatch: Path) -> None:
    """A search: file is an array of WORKERS search workers (default: THROTTLE), then a job for the search's table."""
    path = sweep_file(tmp_path, "search: {trials: 4, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n")
    proc = slurm_sh(None, str(path), "LOG.PERIOD", "5", SBATCH=str(fake_sbatch), THROTTLE="3")
    assert proc.returncode == 0, proc.stderr
    assert "submitted 3 worker(s) as array job 7 (0-2%3)" in proc.stdout
    manifest = next((tmp_path / "sweep" / "slurm").glob("submit-*.tsv")).read_text().splitlines()
    assert [line.split("\t")[0] for line in manifest] == ["worker_0", "worker_1", "worker_2"]
    assert manifest[0].split("\t")[3:] == ["-m", "runner.sweep", "search", "--no-table", str(path), "LOG.PERIOD", "5"]
    array, table = sbatch_calls(fake_sbatch)
    assert "--requeue" in array and table[-1].endswith(f"search --table {path} LOG.PERIOD 5 | tee "
                                                      f"{tmp_path / 'sweep' / 'slurm' / 'table.md'}")
    proc = slurm_sh(None, str(path), SBATCH=str(fake_sbatch), WORKERS="2")
    assert proc.returncode == 0 and "submitted 2 worker(s) as array job 7 (0-1)" in proc.stdout, proc.stderr


def test_single_run_keeps_its_slurm_files_in_its_own_folder(tmp_path: Path, fake_sbatch: Path) -> None:
    """`slurm.sh run ... OUTPUT_DIR runs/r1` wrote logs/ and slurm/ into runs/, beside the user's other runs."""
    runs = tmp_path / "runs"
    (runs / "mine").mkdir(parents=True)
    proc = slurm_sh(None, "run", "--cfg", CFG, "OUTPUT_DIR", str(runs / "r1"), *TINY, SBATCH=str(fake_sbatch))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in runs.iterdir()) == ["mine", "r1.slurm"], proc.stdout
    assert {p.name for p in (runs / "r1.slurm").iterdir()} == {"logs", "slurm"}
    manifest = next((runs / "r1.slurm" / "slurm").glob("submit-*.tsv")).read_text()
    assert f"OUTPUT_DIR\t{runs / 'r1'}" in manifest and len(sbatch_calls(fake_sbatch)) == 2


# ---------------------------------------------------------------------------------------------------------------
# The task manifest: no field ever reaches a shell (issue 46, item 4)
# ---------------------------------------------------------------------------------------------------------------
INJECT = "$(touch {mark})`touch {mark}`"  # what eval of a field would run


@pytest.mark.parametrize("where", ["SWEEP_ROOT", "root:", "a value", "run's OUTPUT_DIR", "search root:"])
def test_a_tab_or_newline_in_a_field_is_refused_before_submitting(tmp_path: Path, fake_sbatch: Path,
                                                                  where: str) -> None:
    """A TAB in the sweep's root shifted the manifest's fields, and the task's eval ran a $(...) from them."""
    mark = tmp_path / "injected"
    bad = f"{tmp_path}/x\t{INJECT.format(mark=mark)}"
    env, args = {"SBATCH": str(fake_sbatch)}, []
    if where == "SWEEP_ROOT":
        env["SWEEP_ROOT"] = bad
        args = [str(sweep_file(tmp_path, GRID))]
    elif where in ("root:", "search root:"):
        body = GRID if where == "root:" else "search: {trials: 2, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n"
        args = [str(sweep_file(tmp_path, body, root=json.dumps(bad)))]  # a YAML string with its \t
    elif where == "a value":
        args = [str(sweep_file(tmp_path, GRID)), "DATA.ROOT", f"/data\n{INJECT.format(mark=mark)}"]
    else:
        args = ["run", "--cfg", CFG, "OUTPUT_DIR", bad]
    line = assert_user_error(slurm_sh(None, *args, **env), "holds a TAB or a newline")
    assert "x\\t" in line or "\\n" in line, line  # the field, quoted
    assert sbatch_calls(fake_sbatch) == [] and not mark.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["sbatch", *(["s.yaml"] if args[0] != "run" else [])])


def run_task(tmp_path: Path, manifest: Path, task: int = 0,
             **extra: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """tools/sweeps/slurm_task.sh on line `task` of `manifest` (`extra`: more environment), with an srun that
    records its argv and exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "srun.calls"
    (bin_dir / "srun").write_text(f"#!{sys.executable}\nimport json, sys\nwith open({str(calls)!r}, 'a') as f:\n"
                                  "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n")
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 1\n")  # no time left known: no TRAIN.TIME_LIMIT injected
    for tool in ("srun", "squeue"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "SLURM_ARRAY_TASK_ID": str(task), "SLURM_JOB_ID": "7"}
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_GPUS_PER_NODE", "NPROC_PER_NODE"):
        env.pop(key, None)
    env.update(extra)
    proc = subprocess.run(["bash", str(ROOT / "tools" / "sweeps" / "slurm_task.sh"), str(ROOT / "tools" / "sweeps"),
                           str(manifest)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    runs = [json.loads(x) for x in calls.read_text().splitlines()] if calls.exists() else []
    return proc, runs


def test_the_task_runs_each_field_as_it_is(tmp_path: Path) -> None:
    """Each field after the third is one argument, as written: empty, spaced, quoted or $(...), none is evaluated."""
    mark = tmp_path / "injected"
    args = ["tools/train.py", "KEY", INJECT.format(mark=mark), "EMPTY", "", "SPACED", "a  b", "QUOTES", "'\"\\",
            "GLOB", "*", "LAST", ""]
    manifest = tmp_path / "submit.tsv"
    manifest.write_text("\t".join(["pt", str(tmp_path / "root"), str(tmp_path / "root" / "pt"), *args]) + "\n")
    proc, runs = run_task(tmp_path, manifest)
    assert proc.returncode == 0 and "pt: done" in proc.stdout, proc.stdout + proc.stderr
    assert len(runs) == 1 and runs[0][runs[0].index("step") + 1:] == [sys.executable, *args]
    assert not mark.exists()
    proc, runs = run_task(tmp_path, manifest, task=1)  # no such line
    assert proc.returncode == 2 and "line 2 of" in proc.stderr and len(runs) == 1


def test_a_task_appends_to_its_log_after_a_header(tmp_path: Path) -> None:
    """Issue 46, item 12: a task (a requeue, a re-submission) never truncates ROOT/logs/NAME.log; each start adds a
    header line naming when, the job and the command, so the runs are told apart."""
    root = tmp_path / "root"
    manifest = tmp_path / "submit.tsv"
    manifest.write_text("\t".join(["pt", str(root), str(root / "pt"), "tools/train.py", "KEY", "a b"]) + "\n")
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "pt.log").write_text("an earlier run's line\n")
    for _ in range(2):
        proc, _ = run_task(tmp_path, manifest)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (root / "logs" / "pt.log").read_text().splitlines()
    assert lines[0] == "an earlier run's line" and len(lines) == 3, lines
    assert all(x.startswith("=== ") and " start pt: job 7, " in x and x.endswith(" tools/train.py KEY a\\ b")
               for x in lines[1:]), lines


def test_a_submitted_value_reaches_the_task_unchanged(tmp_path: Path, fake_sbatch: Path) -> None:
    """slurm.sh's manifest read back by slurm_task.sh: a point's $(...) value is one argument, never run."""
    mark = tmp_path / "injected"
    value = f"/data/{INJECT.format(mark=mark)} x"
    proc = slurm_sh(None, str(sweep_file(tmp_path, GRID)), "DATA.ROOT", value, SBATCH=str(fake_sbatch))
    assert proc.returncode == 0, proc.stderr
    manifest = next((tmp_path / "sweep" / "slurm").glob("submit-*.tsv"))
    proc, runs = run_task(tmp_path, manifest, task=3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = runs[0][runs[0].index("step") + 1:]
    assert argv[:2] == [sys.executable, str(ROOT / "tools" / "train.py")] and argv[-2:] == [
        "OUTPUT_DIR", str(tmp_path / "sweep" / "lr=0.05,model.name=test_efficientnet")], argv
    assert argv[argv.index("DATA.ROOT") + 1] == value and not mark.exists()


def test_a_search_worker_gives_its_trials_nproc_per_node(tmp_path: Path, fake_sbatch: Path) -> None:
    """NPROC_PER_NODE=2 (or the GPUs per node) for a search: the worker runs once, on one node, with --nproc 2, so
    each segment of its trials runs under torchrun with 2 processes; one process per trial without it."""
    path = sweep_file(tmp_path, "search: {trials: 2, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n")
    assert slurm_sh(None, str(path), SBATCH=str(fake_sbatch)).returncode == 0
    manifest = next((tmp_path / "sweep" / "slurm").glob("submit-*.tsv"))
    worker = ["-m", "runner.sweep", "search"]
    for env, want in (({"NPROC_PER_NODE": "2"}, ["--nproc", "2"]),
                      ({"SLURM_GPUS_PER_NODE": "a100:4"}, ["--nproc", "4"]), ({"SLURM_JOB_NUM_NODES": "2"}, []),
                      ({}, [])):
        proc, runs = run_task(tmp_path, manifest, **env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        srun = runs[-1]
        assert "--nodes=1" in srun and srun[srun.index("step") + 1:] == [sys.executable, *worker, *want,
                                                                          "--no-table", str(path)], (env, srun)
        assert f"1 node(s) x {want[1] if want else 1} process(es)" in proc.stdout, proc.stdout


def test_a_search_on_more_than_one_node_is_refused(tmp_path: Path, fake_sbatch: Path) -> None:
    """A search worker and its trials' torchrun live on one node: --nodes=2 is one line, nothing submitted."""
    path = sweep_file(tmp_path, "search: {trials: 2, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n")
    assert_user_error(slurm_sh(None, "--nodes=2", str(path), SBATCH=str(fake_sbatch)), "--nodes=2", "WORKERS=K")
    assert sbatch_calls(fake_sbatch) == [] and not (tmp_path / "sweep").exists()
    assert slurm_sh(None, "--nodes=1", str(path), SBATCH=str(fake_sbatch)).returncode == 0


def markdown_names(table: str) -> list[str]:
    """The run names of a markdown table, top to bottom."""
    return [c[2].strip().strip("*") for c in (line.split("|") for line in table.splitlines())
            if len(c) > 3 and c[2].strip() not in ("run", "---", "")]


@pytest.mark.slow
def test_last_task_of_an_array_gets_the_time_limit(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """Two points side by side with --time=5: both get TRAIN.TIME_LIMIT, the last one too; the table hides it.

    SLURM gives the array's last task the array's own job id, for which `squeue -j` listed every task: the time
    left was not found and that point had no backstop (and the table showed TRAIN.TIME_LIMIT as a swept column).
    """
    path = sweep_file(tmp_path, "grid: {TRAIN.LR: [0.1, 0.05]}\n", root="tl2")
    root = tmp_path / "tl2"
    sub = slurm_sh(slurm_cluster, "--time=5", str(path), "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "4", *TINY)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.split("array job ")[1].split()[0]
    wait_all_ended(slurm_cluster)
    points = ["lr=0.1", "lr=0.05"]
    evs = {p: events(root, p) for p in points}
    assert max_overlap([(e[0]["t"], e[-1]["t"]) for e in evs.values()]) == 2, evs  # the others still running
    assert any(e[0]["job"] == job for e in evs.values()), evs  # one task ran under the array's own id
    for p in points:
        limit = re.search(r"TIME_LIMIT: '?(\d+)", (root / p / "config.yaml").read_text())
        assert limit and 200 < int(limit.group(1)) < 300, (p, evs[p])  # 5 min left: a tenth below
        assert evs[p][0]["injected"] == ["TRAIN.TIME_LIMIT"] and evs[p][-1]["action"] == "done", evs[p]
    table = (root / "slurm" / "table.md").read_text()
    assert "TIME_LIMIT" not in table, table  # the launcher's key, not a swept one
    local = subprocess.run([sys.executable, str(ROOT / "tools" / "summarize.py"), str(root)], capture_output=True,
                           text=True, check=True).stdout
    assert markdown_names(table) == markdown_names(local), (table, local)  # the same default order
    by_name = slurm_sh(slurm_cluster, "table", str(root), "--sort", "run", "--asc")
    assert by_name.returncode == 0 and markdown_names(by_name.stdout) == sorted(points), by_name.stdout
    assert_user_error(slurm_sh(slurm_cluster, "table", str(root), "--sort", "nosuch"), "--sort 'nosuch'")


@pytest.mark.slow
def test_busy_folder_of_another_config_fails(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """A second submission naming a running run's folder with another config fails; it used to exit 0 as busy."""
    out = tmp_path / "pt"
    # long enough to be training still when the second task ends (LONG's 3 epochs ended first once: CI 2026-11-26)
    longer = [*LONG, "TRAIN.EPOCHS", "30"]
    first = slurm_sh(slurm_cluster, "run", "--cfg", CFG, "OUTPUT_DIR", str(out), *longer)
    assert first.returncode == 0, first.stderr
    wait_step(out, 5)
    second = slurm_sh(slurm_cluster, "run", "--cfg", CFG, "OUTPUT_DIR", str(out), *longer, "TRAIN.LR", "0.0123")
    assert second.returncode == 0, second.stderr
    job = second.stdout.split("array job ")[1].split()[0]
    end = wait_task_end(state(out), "pt", job=job)  # the second task's end; the first still trains
    assert end["action"] == "failed" and end["rc"] == 2 and "TRAIN.LR" in end["why"], end
    # the end event is written by the task's shell before it exits: SLURM may still show it RUNNING or COMPLETING
    assert wait_job_state(slurm_cluster, f"{job}_0") == "FAILED"
    slurm_cluster.cancel_all()


def helper_end(tmp_path: Path, out: Path, *train_args: str) -> list[str]:
    """slurm_helper.py end for a task of `out` whose train.py said the folder is in use (exit 2)."""
    log = tmp_path / "task.log"
    log.write_text(f"error: {out} is in use by a running job (pid 1 on node); wait for it or choose another\n")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "sweeps" / "slurm_helper.py"), "end",
                           str(tmp_path / "ev.jsonl"), str(out), str(log), "2", "", "--", *train_args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split("\t")


def test_busy_is_a_failure_when_the_folder_holds_another_config(tmp_path: Path) -> None:
    """The task's own config against the folder's config.yaml: another config fails, the same one is busy."""
    out = tmp_path / "run"
    out.mkdir()
    shown = subprocess.run([sys.executable, TRAIN, "--cfg", CFG, "OUTPUT_DIR", str(out), "--print-config"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT, check=True).stdout
    (out / "config.yaml").write_text(shown)
    action, why = helper_end(tmp_path, out, "--cfg", CFG, "OUTPUT_DIR", str(out), "TRAIN.LR", "0.0123")
    assert action == "failed" and "holds another config's run" in why and "TRAIN.LR" in why, why
    action, _ = helper_end(tmp_path, out, "--cfg", CFG, "OUTPUT_DIR", str(out), "TRAIN.TIME_LIMIT", "100")
    assert action == "busy"
