"""CPU threads: torch's intra-op thread count and the OpenMP wait policy, chosen once before torch is imported.

torch's OpenMP threads spin at every barrier for a while (libgomp's default) before they sleep. On a machine whose
cores other processes hold, the spinning thread keeps the core from the thread it waits for: a 10 s run took
152 s beside two busy processes (docs/PERFORMANCE.md, "CPU threads on a loaded machine"). So the count is the
cores this process may really use, and where other processes already fill them at start (a look at /proc/stat)
it is halved and the threads wait passively. libgomp reads OMP_NUM_THREADS and OMP_WAIT_POLICY once, when torch
loads it: `configure()` runs from `runner.process.startup.prepare()`, which every entry point calls before torch loads.
A value the user (or torchrun) put in the environment is kept as it is.
"""
from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

# The values this module put into the environment, for the processes it starts (sweeps, tests, torchrun): they
# inherit OMP_NUM_THREADS and must tell our choice, which they make again for their own cores and local ranks
# (torchrun sets OMP_NUM_THREADS=1 per worker only where it is unset), from a user's, which they keep.
MARKER = "_RUNNER_CPU_THREADS"
# PASSIVE: a waiting thread sleeps at once (futex) instead of spinning. It is a trade (measured in
# docs/PERFORMANCE.md, "CPU threads on a loaded machine"): on quiet cores it slows a tiny model, each of whose many
# short parallel regions pays a wake-up; beside busy processes it is several times faster. So it is chosen only when
# other processes fill the cores at start, as a short look at /proc/stat (taken always) sees them: at least the
# usable cores less half a core kept busy by others. The 1-minute load average lags by a minute both ways (a load
# that started seconds ago is not in it; a run that just ended still is), so it is used only where there is no
# /proc/stat. On such crowded cores the thread count is halved too: every parallel region waits for its last thread
# to get a core.
# A count chosen by load would make a run's numerics depend on the load at its start (CPU kernels split their
# reductions by thread), so a checkpoint keeps the count and a resume takes it again (follow_run).
WAIT_POLICY = "PASSIVE"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_STAT = Path("/proc/stat")
BUSY_WINDOW_S = 0.2  # /proc/stat counts in ticks of 10 ms: 20 per core in the window
BUSY_SLACK = 0.5  # cores: the look's resolution and a short-lived process's share
# Set by a launcher that starts several runs at once on one machine (a sweep's JOBS): they share the cores as
# torchrun's local ranks do, each taking its part of them
SHARE_ENV = "RUNNER_CPU_SHARE"


@dataclass(frozen=True)
class Choice:
    """What was chosen and why: the figures the start line reports."""

    threads: int
    policy: str | None  # None: libgomp's default (OMP_WAIT_POLICY unset)
    cpus: int  # cores in the affinity mask
    quota: float | None  # cgroup CPU quota in cores, None without one
    load: float | None  # the 1-minute load average at start (None where the system has none)
    busy_now: float | None  # cores of ours other processes kept busy at start (None: not looked, or no /proc/stat)
    local_ranks: int
    share: int  # runs a launcher started side by side on these cores (SHARE_ENV), 1 without one
    crowded: bool  # other processes filled the cores at start: threads halved and PASSIVE (where ours to choose)
    threads_from_env: bool
    policy_from_env: bool
    torch_first: bool  # torch was imported before runner: the environment came too late for libgomp
    ignored: str | None = None  # an OMP_NUM_THREADS from the environment that is no thread count, replaced


_choice: Choice | None = None


def affinity_set() -> set[int]:
    """The CPUs this process may run on (taskset, cpuset, Slurm narrow the mask; os.cpu_count() does not see it)."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def affinity_cpus() -> int:
    """How many CPUs this process may run on (affinity_set's size)."""
    return len(affinity_set())


def parse_cpu_max(text: str) -> float | None:
    """Cores from cgroup v2's cpu.max ("QUOTA PERIOD" in µs, "max PERIOD" without a quota)."""
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    quota, period = int(fields[0]), int(fields[1])
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """Cores from cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us (quota -1: none)."""
    quota, period = int(quota_text.strip()), int(period_text.strip())
    return quota / period if quota > 0 and period > 0 else None


def cgroup_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in cores (v2, then v1), None where there is none or none readable."""
    # a container sees its own cgroup at the mount's root (cgroup namespace), which is where Docker, Kubernetes
    # and Slurm's cgroup plugin put the limit
    try:
        return parse_cpu_max((root / "cpu.max").read_text())
    except (OSError, ValueError):
        pass
    for sub in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        try:
            return parse_cfs((root / sub / "cpu.cfs_quota_us").read_text(),
                             (root / sub / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
    return None


def load_average() -> float | None:
    """The 1-minute load average, None where the system does not keep one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def user_value(env: MutableMapping[str, str], name: str) -> str | None:
    """The value of `name` if the user (or torchrun) set it; None if unset or set by runner in a parent process."""
    value = env.get(name)
    if not value:
        return None
    ours = dict(item.split("=", 1) for item in env.get(MARKER, "").split() if "=" in item)
    return None if ours.get(name) == value else value


def usable_cores(cpus: int, quota: float | None) -> int:
    """The cores of the affinity mask, floored to the quota (a thread beyond it is throttled); at least 1."""
    return max(1, min(cpus, math.floor(quota)) if quota is not None else cpus)


def intra_op_threads(cpus: int, quota: float | None, local_ranks: int) -> int:
    """The cores this process may use (affinity, quota floored: a thread beyond it is throttled) over local ranks."""
    return max(1, usable_cores(cpus, quota) // max(1, local_ranks))


def cpu_times(text: str, cpus: set[int]) -> tuple[int, int]:
    """(busy, total) ticks of `cpus` in /proc/stat's text (idle and iowait are not busy; guest time is in user)."""
    busy = total = 0
    for line in text.splitlines():
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def cores_busy_now(window: float = BUSY_WINDOW_S, stat: Path = PROC_STAT) -> float | None:
    """Cores of this process's affinity mask that other processes kept busy over `window` seconds (this one
    sleeps meanwhile); None where there is no /proc/stat."""
    cpus = affinity_set()
    try:
        before = cpu_times(stat.read_text(), cpus)
        time.sleep(window)
        after = cpu_times(stat.read_text(), cpus)
    except (OSError, ValueError):
        return None
    ticks = after[1] - before[1]
    return None if ticks <= 0 else len(cpus) * (after[0] - before[0]) / ticks


def loaded(load: float | None, cpus: int, quota: float | None) -> bool:
    """True when the 1-minute load average says other processes' threads fill the cores this process may use."""
    return load is not None and load >= usable_cores(cpus, quota)


def busy(load: float | None, cpus: int, quota: float | None, busy_now: float | None = None) -> bool:
    """True when other processes fill the cores this process may use: the look at the cores now decides; the
    lagging load average only where no look could be taken."""
    if busy_now is not None:
        return busy_now >= usable_cores(cpus, quota) - BUSY_SLACK
    return loaded(load, cpus, quota)


def cpu_share(env: MutableMapping[str, str]) -> int:
    """How many runs a launcher started side by side on these cores (SHARE_ENV; 1 when unset or no count)."""
    value = env.get(SHARE_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def thread_count(text: str) -> int | None:
    """The count an OMP_NUM_THREADS value gives the outermost level ("4", or libgomp's nested list "4,2");
    None when it is no list of whole numbers of at least 1 (libgomp would ignore it, with its own complaint)."""
    if not re.fullmatch(r"\s*[0-9]+\s*(,\s*[0-9]+\s*)*", text) or min(int(p) for p in text.split(",")) < 1:
        return None
    return int(text.split(",")[0])


def choose(env: MutableMapping[str, str], cpus: int, quota: float | None, torch_first: bool = False,
           load: float | None = None, busy_now: float | None = None) -> Choice:
    """The thread count and wait policy for this environment and load; the user's own values win."""
    local_ranks, share = int(env.get("LOCAL_WORLD_SIZE") or 1), cpu_share(env)
    user_threads, user_policy = user_value(env, "OMP_NUM_THREADS"), user_value(env, "OMP_WAIT_POLICY")
    # an invalid count is ignored with one warning rather than refused: this runs as runner is imported (every
    # tool, before any command line is read), and libgomp itself ignores such a value
    ignored = user_threads if user_threads is not None and thread_count(user_threads) is None else None
    if ignored is not None:
        user_threads = None
    crowded = busy(load, cpus, quota, busy_now)
    ours = intra_op_threads(cpus, quota, local_ranks * share)
    threads = thread_count(user_threads) if user_threads else (max(1, ours // 2) if crowded else ours)
    policy = user_policy or (WAIT_POLICY if crowded else None)
    return Choice(threads=threads, policy=policy, cpus=cpus, quota=quota, load=load, busy_now=busy_now,
                  local_ranks=local_ranks, share=share, crowded=crowded, threads_from_env=user_threads is not None,
                  policy_from_env=user_policy is not None, torch_first=torch_first, ignored=ignored)


def apply(choice: Choice, env: MutableMapping[str, str]) -> None:
    """Put the choice into the environment (libgomp, MKL and OpenBLAS read it when they load) and mark it ours."""
    ours = {}
    if not choice.threads_from_env:
        ours["OMP_NUM_THREADS"] = str(choice.threads)
    if not choice.policy_from_env and choice.policy:
        ours["OMP_WAIT_POLICY"] = choice.policy
    env.update(ours)
    env[MARKER] = " ".join(f"{k}={v}" for k, v in ours.items())


def configure(env: MutableMapping[str, str] | None = None, look: bool = True) -> Choice:
    """Choose and apply once per process (runner.process.startup.prepare); later calls return the first choice.
    `look` False: no look at the cores (the load average stands in)."""
    global _choice
    if _choice is None:
        env = os.environ if env is None else env
        cpus, quota, load = affinity_cpus(), cgroup_quota(), load_average()
        # the look costs its 0.2 s window of start-up (docs/PERFORMANCE.md): taken wherever a choice is ours
        look = look and (user_value(env, "OMP_WAIT_POLICY") is None or user_value(env, "OMP_NUM_THREADS") is None)
        _choice = choose(env, cpus, quota, torch_first="torch" in sys.modules, load=load,
                         busy_now=cores_busy_now() if look else None)
        apply(_choice, env)  # an ignored value is replaced: libgomp never sees it, children never warn again
        if _choice.ignored is not None and env.get("RANK", "0") == "0":  # once per job, not once per rank
            print(ignored_line(_choice), file=sys.stderr, flush=True)
        if _choice.torch_first and not _choice.threads_from_env:  # too late for the environment, not for the count
            import torch

            torch.set_num_threads(_choice.threads)
    return _choice


def ignored_line(choice: Choice) -> str:
    """The one warning for an OMP_NUM_THREADS that is no thread count."""
    return (f"warning: OMP_NUM_THREADS={choice.ignored!r} in the environment is not a whole number of threads (at "
            f"least 1); ignored: {choice.threads} threads, the cores this process may use (unset it or give e.g. "
            f"OMP_NUM_THREADS={choice.threads})")


def describe(choice: Choice | None = None) -> str:
    """The start line: the count torch uses now, where it came from, and the wait policy."""
    choice = choice or configure()
    import torch

    quota = "none" if choice.quota is None else f"{choice.quota:g} cores"
    why = ("OMP_NUM_THREADS from the environment" if choice.threads_from_env else
           f"affinity {choice.cpus} core{'s' if choice.cpus != 1 else ''}, cgroup quota {quota}"
           + (f", {choice.local_ranks} local ranks" if choice.local_ranks > 1 else "")
           + (f", {choice.share} runs side by side ({SHARE_ENV})" if choice.share > 1 else "")
           + ("; the cores are crowded: half of them" if choice.crowded else "")
           + (f"; OMP_NUM_THREADS {choice.ignored!r} ignored" if choice.ignored is not None else ""))
    policy = _policy_text(choice)
    if choice.torch_first and not choice.policy_from_env:
        policy = "OMP_WAIT_POLICY libgomp's default (torch was imported before runner)"
    return f"CPU threads: {torch.get_num_threads()} intra-op ({why}), {policy}"


def _seen(choice: Choice) -> str:
    """What the choice saw of the other processes: the look at the cores, else the load average."""
    if choice.busy_now is not None:
        return f"{choice.busy_now:.1f} of {usable_cores(choice.cpus, choice.quota)} cores busy at start"
    return f"load average {'unknown' if choice.load is None else f'{choice.load:.1f}'}"


def _policy_text(choice: Choice) -> str:
    """The wait policy and why: the user's, or chosen from what the cores were doing at start."""
    if choice.policy_from_env:
        return f"OMP_WAIT_POLICY {choice.policy} (from the environment)"
    if choice.policy:
        return f"OMP_WAIT_POLICY {choice.policy} ({_seen(choice)}: waiting threads sleep)"
    return f"OMP_WAIT_POLICY unset ({_seen(choice)}: libgomp's spin-wait)"


def in_use() -> dict:
    """What a checkpoint records of the threads: torch's count now and the job's number of processes."""
    import torch

    return {"count": torch.get_num_threads(), "processes": int(os.environ.get("WORLD_SIZE") or 1)}


def follow_run(saved: dict | None) -> str | None:
    """A resumed run computes with the thread count its checkpoint was written with (a count chosen by the load
    at its start, or by a sweep's share of the cores) where that is no more than this process would take and the
    job has as many processes: CPU kernels split their reductions by thread, so another count would give other
    numbers than the run left alone. Returns the log line when it changed the count, None otherwise."""
    choice = configure()
    import torch

    now, world = torch.get_num_threads(), in_use()["processes"]
    count = (saved or {}).get("count")
    ceiling = intra_op_threads(choice.cpus, choice.quota, choice.local_ranks * choice.share)
    if (not count or count == now or count > ceiling or choice.threads_from_env
            or saved.get("processes") != world):
        return None
    torch.set_num_threads(count)
    return (f"CPU threads: {count} intra-op, as the checkpoint was written with (not {now}): a resumed run keeps "
            "its thread count, so that it computes what the run left alone would (set OMP_NUM_THREADS to choose)")
