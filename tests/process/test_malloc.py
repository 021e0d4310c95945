"""runner/process/malloc.py: a prepared process (and the loader workers its fork server starts) keeps the memory a step
frees instead of faulting it in again next step; the user's own malloc settings win. Page faults are counted by the
kernel (getrusage) around real torch allocations."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.process import malloc
from tests.utils import ROOT, forked_worker_script

# The digits step (resnet18, 32 px, batch 64, SGD with momentum): its activations are freed at each step's
# end and asked for again at the next. glibc left alone hands some of them back to the kernel at every step (3,000-
# 9,000 page faults each here); kept, most steps fault nothing, and an odd step still grows the heap a little (up
# to ~2,700 faults once, more often under load: 4,400 in all once in CI), so the tests judge the median step.
STEPS = 12
STEP = """
import json, resource, statistics, sys
import timm
import torch


def faults():
    torch.manual_seed(0)
    model = timm.create_model("resnet18", num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))

    def step():
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def minflt():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    for _ in range(3):  # the first steps fault their pages in whatever malloc does (the heap grows)
        step()
    each = []
    for _ in range(STEPS):
        before = minflt()
        step()
        each.append(minflt() - before)
    return {"median": statistics.median(each), "total": sum(each), "each": each}
""".replace("STEPS", str(STEPS))

PROBE = STEP + """
from runner.process import malloc
print(json.dumps({**faults(), "line": malloc.describe()}))
"""
PREPARED = "from runner.process.startup import prepare\nprepare()\n" + PROBE

WORKER = forked_worker_script(["torch", "timm"], STEP + """

def report(queue):
    from runner.process import malloc
    queue.put({**faults(), "line": malloc.describe()})
""")


def _env(**extra: str) -> dict[str, str]:
    """os.environ without malloc settings of its own, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in (*malloc.USER_VARIABLES, "GLIBC_TUNABLES", "LD_PRELOAD")}
    return {**env, **extra}


def _run(code: str, tmp_path: Path, **env: str) -> dict:
    """Run `code` as a script in a fresh process; its last stdout line, parsed."""
    script = tmp_path / "probe.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env={**_env(**env), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


glibc = pytest.mark.skipif(malloc.platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")


@glibc
def test_a_prepared_process_keeps_what_a_step_frees(tmp_path: Path):
    unprepared, prepared = _run(PROBE, tmp_path), _run(PREPARED, tmp_path)
    assert unprepared["median"] > 1000, unprepared  # glibc alone hands some back at every step
    assert prepared["median"] < 50, (prepared, unprepared)  # kept: most steps fault nothing
    assert prepared["total"] < unprepared["total"] // 4, (prepared, unprepared)
    assert prepared["line"].startswith("freed memory kept for reuse")
    assert "prepare() was not called" in unprepared["line"]


SHARDED = ("from runner.process.startup import prepare\nprepare()\nfrom runner.process import malloc\n"
           "malloc.for_sharded_training()\n" + PROBE)


@glibc
def test_sharded_training_hands_freed_memory_back_again(tmp_path: Path):
    """DIST.STRATEGY fsdp on the CPU (runner.fsdp.shard): the kept memory is handed back again, so every step
    faults its activations in anew, as glibc alone does; a user's own setting is still left as it is."""
    got = _run(SHARDED, tmp_path)
    assert got["median"] > 1000, got
    assert got["line"].startswith("freed memory handed back (glibc trim and mmap thresholds 128 KiB"), got
    users = _run(SHARDED, tmp_path, MALLOC_TRIM_THRESHOLD_="0")
    assert users["line"].startswith("as the environment sets it"), users


@glibc
@pytest.mark.parametrize("env", [{"MALLOC_MMAP_THRESHOLD_": "131072"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}])
def test_the_users_own_malloc_setting_wins(tmp_path: Path, env: dict[str, str]):
    # a 128 KB mmap threshold maps every larger activation anew: the user's choice, kept as given
    got = _run(PREPARED, tmp_path, **env)
    assert got["median"] > 1000, got
    assert got["line"].startswith("as the environment sets it"), got


@glibc
def test_a_loader_worker_from_the_fork_server_keeps_it_too(tmp_path: Path):
    got = _run(WORKER, tmp_path)
    # a worker forked from the server also copies the server's pages on its first writes: a few thousand faults
    # more than the run's process in all, but its median step still faults nothing
    assert got["median"] < 50 and got["line"].startswith("freed memory kept for reuse"), got


@pytest.mark.parametrize("env, why", [
    ({}, None),
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, "MALLOC_TRIM_THRESHOLD_ from the environment"),
    # set empty: glibc reads it as 0 (it then trims at every free: 12x the page faults of glibc alone here)
    ({"MALLOC_TRIM_THRESHOLD_": ""}, "MALLOC_TRIM_THRESHOLD_ from the environment"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1:glibc.cpu.x86_rep_movsb_threshold=2048"},
     "glibc.malloc.trim_threshold from GLIBC_TUNABLES"),
    ({"GLIBC_TUNABLES": "glibc.cpu.x86_rep_movsb_threshold=2048"}, None),
    ({"MALLOC_ARENA_MAX": "2"}, None),  # another malloc setting: the thresholds are still the runner's
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "jemalloc from LD_PRELOAD"),
    ({"LD_PRELOAD": "/opt/lib/libtcmalloc_minimal.so.4 /x/libfoo.so"}, "tcmalloc from LD_PRELOAD"),
])
def test_what_in_the_environment_decides(env: dict[str, str], why: str | None):
    assert malloc.users_choice(env) == why
