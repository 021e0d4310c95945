"""glibc's malloc told to keep the memory a training step frees for the next step, instead of handing it back to
the kernel and faulting it in again; applied once per process by `runner.process.startup.prepare()` (and in the loader
workers' fork server). Torch-free.

By default glibc returns the free memory at the top of its heap to the kernel once more than its trim threshold
is free there, and serves each allocation over its mmap threshold with a mapping of its own, unmapped when freed;
it raises both thresholds as it sees large blocks freed, up to 32 and 64 MB. A step frees its activations at its
end and asks for as much again at the next one, so the kernel maps and zeroes those pages anew every step: on the
CPU, resnet50 at 224 px, batch 16, took 2.5-2.9 million page faults and 4.1-4.9 s of system time in a 24 s
`tools/benchmark.py` run; with the memory kept, 1.4-1.5 million and 2.4-2.7 s, 3-4% faster (docs/PERFORMANCE.md). How
often glibc's own adjustment trims also depends on what the process freed first: the same digits run faulted
2.5 million pages once and 0.2 million other times; kept, 0.2 million every time.

Setting either threshold turns glibc's adjustment off, so both are set: allocations up to 1 GiB come from the
heap (larger ones still get a mapping of their own, returned when freed), and up to 2 GiB of free memory (the most
mallopt takes) stays in the process for the next step. The process's peak memory is the same (3.67-3.85 GB either
way in those runs); it just does not fall between steps.

The user's choice wins: MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ in the environment, either as a
glibc.malloc tunable in GLIBC_TUNABLES, or another allocator in LD_PRELOAD (jemalloc, tcmalloc, mimalloc) leaves
malloc as it is. Outside glibc (macOS, musl) nothing changes.
"""
from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 2**30
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int

USER_VARIABLES = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")
USER_TUNABLES = ("glibc.malloc.trim_threshold", "glibc.malloc.mmap_threshold")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

KEPT = "freed memory kept for reuse (glibc trim threshold 2 GiB, mmap threshold 1 GiB)"  # configure()'s own choice
_state: str | None = None  # what configure() did in this process


def users_choice(env: Mapping[str, str]) -> str | None:
    """What in the environment already decides how malloc returns memory, or None."""
    for name in USER_VARIABLES:
        if name in env:  # set empty too: glibc reads "" as 0
            return f"{name} from the environment"
    tunables = env.get("GLIBC_TUNABLES", "")
    for name in USER_TUNABLES:
        if name in tunables:
            return f"{name} from GLIBC_TUNABLES"
    preload = env.get("LD_PRELOAD", "")
    for name in OTHER_ALLOCATORS:
        if name in preload:
            return f"{name} from LD_PRELOAD"
    return None


def configure(env: Mapping[str, str] | None = None) -> str:
    """Keep freed memory in this process unless the environment decides otherwise; idempotent. Returns what it
    did, as describe() says it."""
    global _state
    if _state is None:
        _state = _apply(os.environ if env is None else env)
    return _state


def _apply(env: Mapping[str, str]) -> str:
    """Set both thresholds through glibc's mallopt, or say why not."""
    why = users_choice(env)
    if why is not None:
        return f"as the environment sets it ({why})"
    if platform.libc_ver()[0] != "glibc":
        return "the C library's default (not glibc)"
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "glibc's default (mallopt refused the thresholds)"
    return KEPT


SMALL_THRESHOLD = 128 * 1024  # glibc's starting thresholds


def for_sharded_training() -> None:
    """Where configure() kept freed memory: hand it back again, for DIST.STRATEGY fsdp on the CPU. FSDP's
    all-gather buffers come and go once per block and step; kept, each process's peak RSS rose above DDP's
    (docs/PERFORMANCE.md, "FSDP: memory"). Both thresholds at glibc's starting 128 KiB, fixed."""
    global _state
    if _state != KEPT:
        return  # the user's choice, another C library, or never configured: left as it is
    libc = ctypes.CDLL(None)
    if libc.mallopt(M_MMAP_THRESHOLD, SMALL_THRESHOLD) and libc.mallopt(M_TRIM_THRESHOLD, SMALL_THRESHOLD):
        _state = "freed memory handed back (glibc trim and mmap thresholds 128 KiB: DIST.STRATEGY fsdp on the CPU)"


def describe() -> str:
    """env.txt's line: what this process's malloc does with freed memory (changes nothing)."""
    return _state or "the C library's default (runner.process.startup.prepare() was not called)"
