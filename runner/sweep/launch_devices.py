"""The devices and ports of `python -m runner.sweep run`: which GPUs there are, each slot's share of them, how many
processes run at once by default, and a free rendezvous port per torchrun point."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable

from runner.sweep.launch_pool import say


def gpu_list(num_gpus: int | None) -> list[str]:
    """The device ids: CUDA_VISIBLE_DEVICES (set but empty: none), else nvidia-smi's; NUM_GPUS caps (or, where
    nvidia-smi is missing, sets) the count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [x for x in re.split(r"[,\s]+", visible) if x]
    else:
        found = _nvidia_smi_count()
        ids = [str(i) for i in range(num_gpus if num_gpus is not None else found)]
    gpus = ids[:num_gpus] if num_gpus is not None else ids
    if not gpus:
        say("sweep: no GPU found: points run on the CPU")
    return gpus


def _nvidia_smi_count() -> int:
    """How many GPUs `nvidia-smi -L` lists (0 where it is missing or fails)."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return 0
    try:
        out = subprocess.run([program, "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU") for line in out.splitlines())


def slot_env(gpus: list[str], slot: int, count: int) -> dict[str, str]:
    """The environment of a process in `slot`: `count` GPUs of its own, wrapping around the list (none without)."""
    env = dict(os.environ)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[(slot * count + i) % len(gpus)] for i in range(count))
    return env


def default_jobs(gpus: list[str], nproc: int) -> int:
    """One process per `nproc` GPUs where there are at least two such groups; else one at a time."""
    return len(gpus) // nproc if len(gpus) >= 2 * nproc else 1


def free_port(taken: Callable[[], set[int]]) -> int:
    """A TCP port free now and not given to a running process of this sweep."""
    while True:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        if port not in taken():
            return port
