"""CPU threads (runner/process/threads.py): cgroup quota files, the precedence of affinity, quota, local ranks and
the user's environment, and the choice in effect in a real process whose entry point prepares before torch loads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from runner.process import threads
from tests.utils import ROOT, TINY, TRAIN, read_jsonl

# a fresh process: its choice, torch's count and what libgomp itself read (OMP_DISPLAY_ENV prints its settings)
PROBE = ("import json, os; from runner.process.startup import prepare; prepare(); import torch; "
         "from runner.process import threads; "
         "print(json.dumps({'torch': torch.get_num_threads(), 'line': threads.describe(), "
         "'env': {k: os.environ.get(k) for k in ('OMP_NUM_THREADS', 'OMP_WAIT_POLICY', threads.MARKER)}}))")


def _clean_env(**extra: str) -> dict[str, str]:
    """os.environ without the thread settings this (runner-importing) test process put there, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "LOCAL_WORLD_SIZE", threads.MARKER)}
    return {**env, "OMP_DISPLAY_ENV": "TRUE", **extra}


def _probe(env: dict[str, str], cpus: set[int] | None = None) -> tuple[dict, str]:
    """Run PROBE in a subprocess (pinned to `cpus` if given); its report and libgomp's stderr."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=env, preexec_fn=pin)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _cores(line: str = "") -> int:
    """The cores a fresh process here would choose (affinity and quota), halved where its start `line` says the
    cores were crowded (other processes on this machine right then), to compare against."""
    n = threads.intra_op_threads(threads.affinity_cpus(), threads.cgroup_quota(), 1)
    return max(1, n // 2) if "the cores are crowded" in line else n


# --- cgroup quota files ---------------------------------------------------------------------------------------

def test_cgroup_v2_cpu_max(tmp_path: Path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_quota(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_quota(tmp_path) is None


@pytest.mark.parametrize("sub", ["cpu", "cpu,cpuacct"])
def test_cgroup_v1_cfs_quota(tmp_path: Path, sub: str):
    d = tmp_path / sub
    d.mkdir()
    (d / "cpu.cfs_quota_us").write_text("300000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_quota(tmp_path) == 3.0
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_quota(tmp_path) is None


def test_no_or_unreadable_cgroup_files_mean_no_quota(tmp_path: Path):
    assert threads.cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert threads.cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("")
    assert threads.cgroup_quota(tmp_path) is None


# --- precedence -------------------------------------------------------------------------------------------------

def test_count_is_affinity_floored_quota_and_local_share():
    assert threads.intra_op_threads(8, None, 1) == 8
    assert threads.intra_op_threads(8, 2.5, 1) == 2  # a third thread would be throttled by the quota
    assert threads.intra_op_threads(2, 16.0, 1) == 2  # the mask is narrower than the quota
    assert threads.intra_op_threads(8, None, 4) == 2
    assert threads.intra_op_threads(2, 0.5, 4) == 1  # never 0


def test_user_environment_wins_and_is_left_alone():
    env = {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE", "LOCAL_WORLD_SIZE": "4"}
    choice = threads.choose(env, cpus=8, quota=None)
    assert (choice.threads, choice.policy, choice.threads_from_env, choice.policy_from_env) == (3, "ACTIVE", True,
                                                                                                 True)
    threads.apply(choice, env)
    assert env["OMP_NUM_THREADS"] == "3" and env["OMP_WAIT_POLICY"] == "ACTIVE" and env[threads.MARKER] == ""


def test_unset_environment_takes_the_cores_shared_among_local_ranks():
    env = {"LOCAL_WORLD_SIZE": "2"}
    choice = threads.choose(env, cpus=8, quota=6.0, busy_now=0.2)
    assert (choice.threads, choice.policy, choice.threads_from_env, choice.policy_from_env) == (3, None, False,
                                                                                                 False)
    threads.apply(choice, env)
    assert env["OMP_NUM_THREADS"] == "3" and "OMP_WAIT_POLICY" not in env
    assert ("(affinity 8 cores, cgroup quota 6 cores, 2 local ranks), OMP_WAIT_POLICY unset (0.2 of 6 cores busy "
            "at start: libgomp's spin-wait)" in threads.describe(choice))


@pytest.mark.parametrize("cpus, quota, busy_now, count, policy", [
    (2, None, 0.0, 2, None),  # quiet: libgomp's spin-wait (PASSIVE doubled a tiny model's run time here)
    (2, None, 1.4, 2, None),
    (2, None, 1.5, 1, "PASSIVE"),  # others fill both cores: spinning would steal them, and half the threads
    (2, None, 2.0, 1, "PASSIVE"),
    (8, 2.0, 1.8, 1, "PASSIVE"),  # the quota's cores are what this process may use
    (8, None, 2.5, 8, None),
    (8, None, 7.9, 4, "PASSIVE"),
])
def test_crowded_cores_at_start_halve_the_threads_and_make_them_sleep(cpus, quota, busy_now, count, policy):
    env: dict[str, str] = {}
    choice = threads.choose(env, cpus=cpus, quota=quota, busy_now=busy_now)
    assert (choice.threads, choice.policy, choice.crowded) == (count, policy, policy is not None)
    threads.apply(choice, env)
    assert env.get("OMP_WAIT_POLICY") == policy and env["OMP_NUM_THREADS"] == str(count)
    assert ("the cores are crowded: half of them" in threads.describe(choice)) == choice.crowded


@pytest.mark.parametrize("load, busy_now, policy", [
    (2.2, 0.1, None),  # the load average still counts a run that just ended (a sweep's last job): cores idle now
    (0.3, 2.0, "PASSIVE"),  # a load that started 3 s ago is not in the 1-minute average yet: the look sees it
    (2.2, 1.6, "PASSIVE"),
    (2.2, None, "PASSIVE"),  # no look possible (no /proc/stat): the load average is the only hint
    (1.0, None, None),
    (None, None, None),  # neither: as libgomp does
])
def test_the_look_at_the_cores_decides_and_the_load_average_is_only_a_fallback(load, busy_now, policy):
    choice = threads.choose({}, cpus=2, quota=None, load=load, busy_now=busy_now)
    assert choice.policy == policy
    line = threads._policy_text(choice)
    assert ("cores busy at start" in line) == (busy_now is not None)
    assert busy_now is None or f"{busy_now:.1f} of 2 cores busy at start" in line
    assert busy_now is not None or "load average" in line


def test_a_launchers_share_divides_the_cores_like_local_ranks():
    assert threads.choose({threads.SHARE_ENV: "2"}, cpus=2, quota=None, busy_now=0.0).threads == 1
    assert threads.choose({threads.SHARE_ENV: "2", "LOCAL_WORLD_SIZE": "2"}, cpus=8, quota=None).threads == 2
    assert threads.choose({threads.SHARE_ENV: "x"}, cpus=8, quota=None).share == 1  # no count: ignored
    assert threads.choose({threads.SHARE_ENV: "4", "OMP_NUM_THREADS": "3"}, cpus=8, quota=None).threads == 3
    line = threads.describe(threads.choose({threads.SHARE_ENV: "2"}, cpus=2, quota=None, busy_now=0.0))
    assert "2 runs side by side (RUNNER_CPU_SHARE)" in line


def test_a_resume_keeps_the_thread_count_its_checkpoint_was_written_with():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert threads.follow_run({"count": 1, "processes": 1}).startswith("CPU threads: 1 intra-op, as the "
                                                                             "checkpoint was written with (not 2)")
        assert torch.get_num_threads() == 1
        assert threads.follow_run({"count": 1, "processes": 1}) is None  # already so
        assert threads.follow_run({"count": 2, "processes": 2}) is None and torch.get_num_threads() == 1  # world
        assert threads.follow_run({"count": 10**4, "processes": 1}) is None  # more than this machine's cores
        assert threads.follow_run(None) is None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_proc_stat_ticks_count_only_this_process_cores():
    text = ("cpu  300 0 100 900 10 0 0 0 0 0\n"
            "cpu0 100 0 50 400 5 0 0 0 0 0\n"
            "cpu1 200 0 50 500 5 0 0 0 0 0\n"
            "intr 12345\nctxt 999\n")
    assert threads.cpu_times(text, {0}) == (150, 555)
    assert threads.cpu_times(text, {0, 1}) == (400, 1310)
    assert threads.cpu_times(text, {5}) == (0, 0)


@pytest.mark.skipif(not threads.PROC_STAT.exists(), reason="needs /proc/stat")
def test_cores_busy_now_sees_real_busy_processes():
    """One spinning process per core of ours: the look counts nearly all of them; stopped, it is a valid share."""
    cores = threads.affinity_cpus()
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.5)
        assert threads.cores_busy_now() >= cores - threads.BUSY_SLACK
    finally:
        for proc in spin:
            proc.kill()
            proc.wait()
    assert 0.0 <= threads.cores_busy_now(0.1) <= cores


def test_values_a_parent_runner_set_are_chosen_again():
    # a sweep or test that imported runner starts a torchrun worker: the inherited 2 is ours, not the user's
    parent = {}
    threads.apply(threads.choose(parent, cpus=2, quota=None), parent)
    child = {**parent, "LOCAL_WORLD_SIZE": "2"}
    assert threads.choose(child, cpus=2, quota=None).threads == 1
    child["OMP_NUM_THREADS"] = "2"  # unchanged from the parent's: still ours
    assert not threads.choose(child, cpus=2, quota=None).threads_from_env
    child["OMP_NUM_THREADS"] = "1"  # set again on the way (a user's script, torchrun): theirs
    assert threads.choose(child, cpus=2, quota=None).threads_from_env


# --- in effect in a real process ----------------------------------------------------------------------------------

def test_fresh_process_uses_its_cores_and_the_policy_it_says():
    report, gomp = _probe(_clean_env())
    n = _cores(report["line"])
    assert report["torch"] == n
    assert report["env"]["OMP_NUM_THREADS"] == str(n)
    assert report["line"].startswith(f"CPU threads: {n} intra-op (affinity ")
    # libgomp itself took them in (it reads them once, as torch loads it); the policy hangs on this machine's load
    assert f"OMP_NUM_THREADS = '{n}'" in gomp
    if report["env"]["OMP_WAIT_POLICY"] == "PASSIVE":
        assert "cores busy at start: waiting threads sleep" in report["line"] and "OMP_WAIT_POLICY = 'PASSIVE'" in gomp
    else:
        assert report["env"]["OMP_WAIT_POLICY"] is None and "cores busy at start: libgomp's spin" in report["line"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to narrow the mask")
def test_fresh_process_respects_a_narrowed_affinity_mask():
    report, gomp = _probe(_clean_env(), cpus={min(os.sched_getaffinity(0))})
    assert report["torch"] == 1 and "OMP_NUM_THREADS = '1'" in gomp
    assert "(affinity 1 core, cgroup quota" in report["line"]


def test_fresh_process_keeps_the_users_settings():
    report, gomp = _probe(_clean_env(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE"))
    assert report["torch"] == 1 and report["env"]["OMP_WAIT_POLICY"] == "ACTIVE"
    assert report["line"] == ("CPU threads: 1 intra-op (OMP_NUM_THREADS from the environment), "
                              "OMP_WAIT_POLICY ACTIVE (from the environment)")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in gomp


@pytest.mark.skipif(not threads.PROC_STAT.exists(), reason="needs /proc/stat")
def test_fresh_process_beside_a_load_that_just_started_halves_its_threads_and_sleeps():
    """The issue's case: busy processes started a moment ago (the 1-minute load average does not show them yet)."""
    cores = threads.affinity_cpus()
    spin = [subprocess.Popen([sys.executable, "-c", "print('go', flush=True)\nwhile True: pass"],
                             stdout=subprocess.PIPE, text=True) for _ in range(2 * cores)]
    try:
        assert all(proc.stdout.readline().strip() == "go" for proc in spin)  # each is spinning from here on
        report, gomp = _probe(_clean_env())
    finally:
        for proc in spin:
            proc.kill()
            proc.wait()
    n = threads.intra_op_threads(cores, threads.cgroup_quota(), 1)
    assert report["torch"] == max(1, n // 2) and "the cores are crowded: half of them" in report["line"], report
    assert "cores busy at start: waiting threads sleep" in report["line"] and "OMP_WAIT_POLICY = 'PASSIVE'" in gomp


def test_fresh_process_under_a_parents_choice_shares_among_local_ranks():
    n = _cores()
    inherited = _clean_env(OMP_NUM_THREADS=str(n), OMP_WAIT_POLICY="PASSIVE", LOCAL_WORLD_SIZE="2",
                           **{threads.MARKER: f"OMP_NUM_THREADS={n} OMP_WAIT_POLICY=PASSIVE"})
    report, _ = _probe(inherited)
    assert report["torch"] == max(1, n // 2)
    assert "2 local ranks" in report["line"]


class _Threads(Dataset):
    """Each item: the intra-op thread count of the process that loads it."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        return torch.get_num_threads()


def test_dataloader_workers_use_one_thread():
    # torch's worker loop sets 1 thread per worker: workers never multiply the intra-op count
    assert [int(x) for x in DataLoader(_Threads(), batch_size=None, num_workers=2)] == [1, 1]


WORKER_LOOK = """
from runner.process.startup import prepare

choice = prepare()  # as a tool does at the top of its module, which a spawned or fork-server worker re-runs

import json, sys, time
from torch.utils.data import DataLoader, Dataset


class Looks(Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return json.dumps([choice.busy_now, time.time()])


if __name__ == "__main__":
    t0 = time.time()
    loader = DataLoader(Looks(), batch_size=None, num_workers=1, multiprocessing_context=sys.argv[1])
    worker_look, at = json.loads(next(iter(loader)))
    print(json.dumps({"main": choice.busy_now, "worker": worker_look, "first_item_s": at - t0}))
"""


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_a_loader_worker_rerunning_the_tool_takes_no_look(tmp_path: Path, start: str):
    """A worker that re-runs the tool's module (as __mp_main__) chooses without the 0.2 s look: the main process
    waits for it (its start-up data is written to the worker as the worker reads it, after that module ran)."""
    script = tmp_path / "tool.py"
    script.write_text(WORKER_LOOK)
    out = subprocess.run([sys.executable, str(script), start], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=_clean_env())
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["main"] is not None  # the tool's own process looked
    assert report["worker"] is None, report  # its worker did not


@pytest.mark.slow
def test_run_logs_the_choice_once(tmp_path: Path):
    out = subprocess.run([sys.executable, TRAIN, "--cfg", "configs/digits/test_resnet.yaml", *TINY,
                          "TRAIN.MAX_STEPS", "2", "OUTPUT_DIR", str(tmp_path / "run")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, env=_clean_env(OMP_DISPLAY_ENV="FALSE",
                                                                          PYTHONUNBUFFERED="1"))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = [line for line in (tmp_path / "run" / "log.txt").read_text().splitlines() if "CPU threads:" in line]
    assert len(lines) == 1 and f"CPU threads: {_cores(lines[0])} intra-op (affinity" in lines[0], lines
    assert "cores busy at start: waiting threads sleep" in lines[0] or "cores busy at start: libgomp's" in lines[0]


@pytest.mark.parametrize("value", ["abc", "0", "-2", "2.5"])
def test_an_invalid_thread_count_in_the_environment_is_ignored_with_one_warning(value):
    # libgomp printed its own complaint, and the start line still said "from the environment"
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=_clean_env(OMP_NUM_THREADS=value, OMP_DISPLAY_ENV="FALSE"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    lines, n = out.stderr.splitlines(), _cores(report["line"])
    assert len(lines) == 1 and "libgomp" not in out.stderr, out.stderr
    assert lines[0] == (f"warning: OMP_NUM_THREADS={value!r} in the environment is not a whole number of threads "
                        f"(at least 1); ignored: {n} threads, the cores this process may use (unset it or "
                        f"give e.g. OMP_NUM_THREADS={n})")
    assert report["torch"] == n and report["env"]["OMP_NUM_THREADS"] == str(n)
    assert "(affinity " in report["line"] and "OMP_NUM_THREADS" in report["env"][threads.MARKER]


def test_a_list_of_thread_counts_is_libgomps_and_kept():
    choice = threads.choose({"OMP_NUM_THREADS": "3,2"}, cpus=8, quota=None)
    assert (choice.threads, choice.threads_from_env, choice.ignored) == (3, True, None)


def _train(out: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    """The tiny digits run for 2 epochs into `out` with the runner's own thread choice (no OMP_NUM_THREADS)."""
    return subprocess.run([sys.executable, TRAIN, "--cfg", "configs/digits/test_resnet.yaml", *TINY,
                           "TRAIN.EPOCHS", "2", "LOG.PERIOD", "1", "LOG.TENSORBOARD", "False", "OUTPUT_DIR",
                           str(out), *extra], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=_clean_env(OMP_DISPLAY_ENV="FALSE", PYTHONUNBUFFERED="1", **env))


@pytest.mark.slow
@pytest.mark.skipif(threads.intra_op_threads(threads.affinity_cpus(), threads.cgroup_quota(), 1) < 2,
                    reason="needs two cores: one thread of two is the count a sweep's share gives")
def test_a_run_resumed_with_more_cores_free_computes_as_the_run_left_alone(tmp_path: Path):
    """Started as one of two sweep points side by side (1 thread each), paused after epoch 1, resumed alone: the
    resume takes the checkpoint's count (2 threads would give other losses: CPU reductions split by thread)."""
    share = {threads.SHARE_ENV: "2"}
    whole = _train(tmp_path / "whole", **share)
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "paused"
    assert _train(out, "--pause-after-epoch", "1", **share).returncode == 0
    again = _train(out)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    losses = [[(r["step"], r["train/loss"]) for r in read_jsonl(d / "metrics.jsonl") if "train/loss" in r]
              for d in (tmp_path / "whole", out)]
    assert losses[0] == losses[1] and len(losses[0]) == 2 * 22
    log = (out / "log.txt").read_text()
    assert "CPU threads: 1 intra-op, as the checkpoint was written with (not 2)" in log, log
