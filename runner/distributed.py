"""Process topology: torchrun environment, process group, device, rank-0 helpers, metric reduction."""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as tdist

from runner.errors import Hung, UserError

log = logging.getLogger("runner")
_started = {"timeout": None}  # the timeout setup() started the process group with, for control_group()


@dataclass(frozen=True)
class Dist:
    """Where this process sits in the job: rank, world size and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on the process that writes files and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when a process group exists (always under torchrun, never otherwise)."""
        return tdist.is_available() and tdist.is_initialized()


def under_torchrun() -> bool:
    """True when launched by torchrun (or anything that sets its environment)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _pick_device(cfg, local_rank: int) -> torch.device:
    """The device from cfg.DEVICE, checked against what this machine has."""
    want = cfg.DEVICE
    if want == "cuda" and not _cuda_available():
        raise UserError("DEVICE is 'cuda' but no CUDA device is visible; use DEVICE cpu or DEVICE auto")
    if want == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise UserError(
            f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices are visible; "
            "lower --nproc_per_node or fix CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", local_rank)


def _cuda_available() -> bool:
    """torch.cuda.is_available() without its warning (a second stderr line) on machines with no driver."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.cuda.is_available()


def setup(cfg) -> Dist:
    """Read the torchrun environment, pin the device and start the process group (once, at setup)."""
    if not under_torchrun():
        device = _pick_device(cfg, 0)
        if device.type == "cuda":
            torch.cuda.set_device(device)
            _hint_multi_gpu()
        return Dist(0, 1, 0, device)
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    device = _pick_device(cfg, local)
    backend = cfg.DIST.BACKEND
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise UserError("DIST.BACKEND nccl needs CUDA devices; use DIST.BACKEND gloo (or auto) on CPU")
    kwargs = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    timeout = timedelta(seconds=cfg.DIST.TIMEOUT_S)
    _started["timeout"] = timeout
    store = _attempt_store(timeout)
    if store is not None:
        kwargs.update(store=store, rank=rank, world_size=world)
        _await_ranks(store, rank, world, cfg.DIST.TIMEOUT_S)
    tdist.init_process_group(backend, timeout=timeout, **kwargs)
    check_same_config(cfg, rank)
    return Dist(rank, world, local, device)


def check_same_config(cfg, rank: int) -> None:
    """Stop the job (one line, from rank 0) when a rank's config differs from rank 0's: ${env:...} read apart."""
    import hashlib

    from runner.config import dump_config

    text = dump_config(cfg)
    digests = [None] * tdist.get_world_size()
    tdist.all_gather_object(digests, hashlib.sha256(text.encode()).hexdigest())
    odd = [r for r, d in enumerate(digests) if d != digests[0]]
    if not odd:
        return
    store = job_store()
    if rank == odd[0]:
        store.set("runner/config_of_odd_rank", text)
    detail = f" ({_config_diff(text, store.get('runner/config_of_odd_rank').decode(), odd[0])})" if rank == 0 else ""
    more = f", and so did rank(s) {', '.join(map(str, odd[1:]))}" if odd[1:] else ""
    error = UserError(f"rank {odd[0]} resolved the config differently from rank 0{detail}{more}: each process reads "
                      "the files and ${env:...} itself; give every process the same environment and files")
    error.relayed = rank != 0  # rank 0 says it once
    raise error


def _config_diff(ours: str, theirs: str, odd: int) -> str:
    """'KEY: a on rank 0, b on rank N' for each key that differs between two dumped configs."""
    import yaml

    from runner.config import flatten

    a, b = flatten(yaml.safe_load(ours) or {}), flatten(yaml.safe_load(theirs) or {})
    keys = [k for k in {**a, **b} if a.get(k) != b.get(k)]
    return "; ".join(f"{k}: {a.get(k)!r} on rank 0, {b.get(k)!r} on rank {odd}" for k in keys[:3]) + (
        f"; and {len(keys) - 3} more" if len(keys) > 3 else "")


def _await_ranks(store, rank: int, world: int, seconds: float) -> None:
    """Wait until every rank has reached set-up, else one line naming those that did not (Hung, exit 76)."""
    # init_process_group would wait as long, then raise a store timeout (a traceback and c10d's socket warnings)
    # that names no rank; polling our own keys says which ranks never came
    store.set(f"runner/joined/{rank}", f"{socket.gethostname()} {os.getpid()}")
    keys = [f"runner/joined/{r}" for r in range(world)]
    deadline = time.monotonic() + seconds
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if not store.check([keys[r]])]
            error = Hung(f"hung: rank {', '.join(map(str, missing))} did not reach the process group within "
                         f"DIST.TIMEOUT_S ({seconds:g} s): frozen, or still starting; nothing was trained or "
                         "written, the same command starts the job again")
            error.relayed = rank != 0  # rank 0 says it once
            raise error
        time.sleep(0.05)


def _attempt_store(timeout: timedelta):
    """torchrun's store under a prefix of this restart attempt, or None where torchrun does not share one."""
    # torchrun shares its rendezvous store with the workers and keeps it across --max-restarts: restarted gloo
    # workers could read the dead workers' addresses from it and fail to connect. One namespace per attempt.
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = tdist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                           timeout=timeout)
    return tdist.PrefixStore(f"runner/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def _hint_multi_gpu() -> None:
    """Say once how to use every visible GPU; DataParallel is deliberately not offered."""
    n = torch.cuda.device_count()
    if n > 1:
        log.warning(
            "%d GPUs are visible but this run uses one; to train on all of them: "
            "torchrun --standalone --nproc_per_node=%d tools/train.py --cfg ...", n, n
        )


def control_group(timeout: timedelta | None = None):
    """A gloo group for small CPU-side control messages (stop flags) that must not touch the GPU.

    `timeout` defaults to the one setup() started the process group with (DIST.TIMEOUT_S): without it torch
    would give the new group its own default (30 minutes), whatever the config says.
    """
    if not (tdist.is_available() and tdist.is_initialized()):
        return None
    if tdist.get_backend() == "gloo":
        return tdist.group.WORLD
    timeout = timeout or _started["timeout"]
    return tdist.new_group(backend="gloo", **({"timeout": timeout} if timeout else {}))


def all_reduce_(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """In-place all-reduce when distributed; identity otherwise."""
    if tdist.is_available() and tdist.is_initialized():
        tdist.all_reduce(tensor, op=getattr(tdist.ReduceOp, op.upper()), group=group)
    return tensor


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if tdist.is_available() and tdist.is_initialized():
        tdist.barrier()


def teardown() -> None:
    """Destroy the process group if one was started."""
    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


def job_store():
    """The process group's key-value store (torchrun's TCPStore under this attempt's prefix), or None alone.

    Heartbeats and failures travel through it because it answers while a collective is stuck.
    """
    if not (tdist.is_available() and tdist.is_initialized()):
        return None
    return tdist.distributed_c10d._get_default_store()


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the process group, (0, 1) without one."""
    if not (tdist.is_available() and tdist.is_initialized()):
        return 0, 1
    return tdist.get_rank(), tdist.get_world_size()


def broadcast_object(obj, group):
    """Rank 0's `obj` on every rank, over `group` (control_group(): CPU, made once); identity alone."""
    if not (tdist.is_available() and tdist.is_initialized()):
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def gather_object(obj, group) -> list | None:
    """Every rank's `obj` on rank 0, as a list indexed by rank (None on the others), over `group`; [obj] alone."""
    if not (tdist.is_available() and tdist.is_initialized()):
        return [obj]
    box = [None] * tdist.get_world_size() if tdist.get_rank() == 0 else None
    tdist.gather_object(obj, box, dst=0, group=group)
    return box
