"""CPU threads (runner/threads.py): cgroup quota files, the precedence of affinity, quota, local ranks and the user's
environment, and the choice in effect in a real process whose entry point prepares before torch loads."""
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

from runner import threads
from tests.utils import ROOT, TINY, TRAIN

# a fresh process: its choice, torch's count and what libgomp itself read (OMP_DISPLAY_ENV prints its settings)
PROBE = ("import json, os; from runner.startup import prepare; prepare(); import torch; from runner import threads; "
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


def _cores() -> int:
    """The cores a fresh process here would choose (affinity and quota), to compare against."""
    return threads.intra_op_threads(threads.affinity_cpus(), threads.cgroup_quota(), 1)


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
    choice = threads.choose(env, cpus=8, quota=6.0, load=7.5)
    assert (choice.threads, choice.policy, choice.threads_from_env, choice.policy_from_env) == (3, "PASSIVE", False,
                                                                                                 False)
    threads.apply(choice, env)
    assert env["OMP_NUM_THREADS"] == "3" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert ("(affinity 8 cores, cgroup quota 6 cores, 2 local ranks), OMP_WAIT_POLICY PASSIVE (load average 7.5"
            in threads.describe(choice))


@pytest.mark.parametrize("cpus, quota, load, policy", [
    (2, None, 0.3, None),  # quiet: libgomp's spin-wait (PASSIVE doubled a tiny model's run time here)
    (2, None, 1.9, None),
    (2, None, 2.0, "PASSIVE"),  # others' runnable threads fill both cores: spinning would steal them
    (2, None, 5.2, "PASSIVE"),
    (8, 2.0, 2.5, "PASSIVE"),  # the quota's cores are what this process may use
    (8, None, 2.5, None),
    (2, None, None, None),  # no load average on this system: as libgomp does
])
def test_wait_policy_follows_the_load_at_start_and_the_count_does_not(cpus, quota, load, policy):
    env: dict[str, str] = {}
    choice = threads.choose(env, cpus=cpus, quota=quota, load=load)
    assert choice.policy == policy
    assert choice.threads == threads.choose({}, cpus=cpus, quota=quota).threads  # numerics never follow the load
    threads.apply(choice, env)
    assert env.get("OMP_WAIT_POLICY") == policy


@pytest.mark.parametrize("load, busy_now, policy", [
    (2.2, 0.1, None),  # the load average still counts a run that just ended (a sweep's last job): cores idle now
    (2.2, 1.4, None),
    (2.2, 1.6, "PASSIVE"),  # others hold the cores now too
    (2.2, None, "PASSIVE"),  # no look taken (no /proc/stat): the load average decides
    (1.0, 2.0, None),  # the look is only taken, and only counts, where the load average says busy
])
def test_a_look_at_the_cores_now_overrules_a_lagging_load_average(load, busy_now, policy):
    choice = threads.choose({}, cpus=2, quota=None, load=load, busy_now=busy_now)
    assert choice.policy == policy
    line = threads._policy_text(choice)
    assert ("cores busy now" in line) == (busy_now is not None)
    assert busy_now is None or f"{busy_now:.1f} of 2 cores busy now" in line


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
    n = _cores()
    assert report["torch"] == n
    assert report["env"]["OMP_NUM_THREADS"] == str(n)
    assert report["line"].startswith(f"CPU threads: {n} intra-op (affinity ")
    # libgomp itself took them in (it reads them once, as torch loads it); the policy hangs on this machine's load
    assert f"OMP_NUM_THREADS = '{n}'" in gomp
    if report["env"]["OMP_WAIT_POLICY"] == "PASSIVE":
        assert "OMP_WAIT_POLICY PASSIVE (load average" in report["line"] and "OMP_WAIT_POLICY = 'PASSIVE'" in gomp
    else:
        assert report["env"]["OMP_WAIT_POLICY"] is None and "OMP_WAIT_POLICY unset (load average" in report["line"]


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


@pytest.mark.slow
def test_run_logs_the_choice_once(tmp_path: Path):
    out = subprocess.run([sys.executable, TRAIN, "--cfg", "configs/digits/test_resnet.yaml", *TINY,
                          "TRAIN.MAX_STEPS", "2", "OUTPUT_DIR", str(tmp_path / "run")], capture_output=True,
                         text=True, timeout=300, cwd=ROOT, env=_clean_env(OMP_DISPLAY_ENV="FALSE",
                                                                          PYTHONUNBUFFERED="1"))
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = [line for line in (tmp_path / "run" / "log.txt").read_text().splitlines() if "CPU threads:" in line]
    assert len(lines) == 1 and f"CPU threads: {_cores()} intra-op (affinity" in lines[0], lines
    assert "OMP_WAIT_POLICY PASSIVE (load average" in lines[0] or "OMP_WAIT_POLICY unset (load average" in lines[0]


@pytest.mark.parametrize("value", ["abc", "0", "-2", "2.5"])
def test_an_invalid_thread_count_in_the_environment_is_ignored_with_one_warning(value):
    # libgomp printed its own complaint, and the start line still said "from the environment"
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env=_clean_env(OMP_NUM_THREADS=value, OMP_DISPLAY_ENV="FALSE"))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "libgomp" not in out.stderr, out.stderr
    assert lines[0] == (f"warning: OMP_NUM_THREADS={value!r} in the environment is not a whole number of threads "
                        f"(at least 1); ignored: {_cores()} threads, the cores this process may use (unset it or "
                        f"give e.g. OMP_NUM_THREADS={_cores()})")
    assert report["torch"] == _cores() and report["env"]["OMP_NUM_THREADS"] == str(_cores())
    assert "(affinity " in report["line"] and "OMP_NUM_THREADS" in report["env"][threads.MARKER]


def test_a_list_of_thread_counts_is_libgomps_and_kept():
    choice = threads.choose({"OMP_NUM_THREADS": "3,2"}, cpus=8, quota=None)
    assert (choice.threads, choice.threads_from_env, choice.ignored) == (3, True, None)
