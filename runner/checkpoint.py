"""Checkpoints: what one holds, atomic saving (on the caller's thread, or off the training step: a host copy, then
one background write at a time), finding the newest valid one, safe loading, per-rank RNG state."""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import random
import re
import signal
import threading
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from runner import distributed
from runner.distributed import Dist
from runner.errors import UserError
from runner.fsutil import atomic_link, atomic_write, fsync_dir, remove_stale_temps
from runner.rundir.checkpoints import candidates, step_files
from runner.rundir.layout import BEST, LAST, checkpoints, step_name

log = logging.getLogger("runner")


def atomic_save(obj: dict, path: str | os.PathLike, intact: str = "") -> None:
    """torch.save through the one atomic writer (temporary file, fsync, rename; a full disk is one line that ends
    with `intact`, what the failed write left whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: torch.save(obj, f), intact)


@contextlib.contextmanager
def held_sigint():
    """Hold Ctrl-C until the block ends: a KeyboardInterrupt inside torch.save surfaces as a RuntimeError."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if got and callable(old):
            old(signal.SIGINT, None)  # the handler it would have reached: save-and-stop, or KeyboardInterrupt


def save_checkpoint(state: dict, output_dir: str | os.PathLike, step: int, keep: int, best: bool) -> Path:
    """Write step_N.pth, point last.pth (and best.pth) at it, and prune to the newest `keep` step files."""
    d = checkpoints(output_dir)
    path = d / step_name(step)
    previous = step_files(d)
    intact = (f"the previous checkpoint ({d / LAST}, step {previous[0][0]}) is intact" if previous
              else "no earlier checkpoint exists in this folder (a rerun starts where this run started)")
    with held_sigint():
        atomic_save(state, path, intact)
        if not looks_whole(path):  # never let pruning leave a damaged file as the only checkpoint
            raise RuntimeError(f"checkpoint {path} was written but does not read back as a torch file")
        atomic_link(path, d / LAST)
        if best:
            atomic_link(path, d / BEST)
        prune(d, step, keep)
        remove_stale_temps(d)
        if SHARDS_KEY in state:
            prune_shards(d)
    return path


# ---------------------------------------------------------------------------------------------------------
# Sharded checkpoints (DIST.STRATEGY fsdp): step_N.pth holds everything but the model, optimizer and EMA, which
# every process writes into a folder beside it (runner.fsdp.Shards, torch.distributed.checkpoint). The folder is
# written under a temporary name and renamed once whole, and step_N.pth, written after it, is what makes it a
# checkpoint: a folder no .pth names is never resumed from, and is removed by the next save's pruning. On the step
# (write_shards) or off it (start_shards: DCP stages the shards on the step; the rest runs in the writer's thread).
# ---------------------------------------------------------------------------------------------------------
SHARDS_KEY = "shards"  # a sharded checkpoint's entry: its folder's name, beside it (a path once loaded)
SHARDS_SUFFIX = ".dcp"
_PARTIAL = ".partial"  # a folder being written: .<name>.partial (not fsutil's temp-file pattern: never unlinked)


def write_shards(save, output_dir: str | os.PathLike, step: int, group=None) -> str:
    """Every process: `save(folder)` into a new folder for `step`; rank 0 renames it into place once every process
    has written. Returns the folder's name (the same on every rank)."""
    d, name = _new_shards(output_dir, step, group)
    with held_sigint():
        save(d / f".{name}{_PARTIAL}")
        _place_shards(d, name)
    return name


def start_shards(save_async, output_dir: str | os.PathLike, step: int, group=None,
                 write_group=None) -> tuple[str, Callable[[], None]]:
    """Every process: `save_async(folder)` stages its shards for a new folder of `step` and returns the future of
    their write. Returns the folder's name and the rest of the write, for the writer thread: wait for the shards,
    then rank 0 renames the folder once every process has written (a barrier over `write_group`, the writes'
    own process group: the training's collectives go on meanwhile)."""
    d, name = _new_shards(output_dir, step, group)
    future = save_async(d / f".{name}{_PARTIAL}")

    def finish() -> None:
        """The shards on disk on every process, then the folder in place."""
        future.result()
        _place_shards(d, name, write_group)

    return name, finish


def _new_shards(output_dir: str | os.PathLike, step: int, group=None) -> tuple[Path, str]:
    """The checkpoint folder and a new shard folder's name for `step`, the same on every rank."""
    d = checkpoints(output_dir)
    d.mkdir(parents=True, exist_ok=True)
    token = distributed.broadcast_object(f"{time.time_ns():x}", group)  # one name, even across a clock skew
    return d, f"{step_name(step)[:-4]}.{token}{SHARDS_SUFFIX}"


def _place_shards(d: Path, name: str, group=None) -> None:
    """Once every process has written its shards into .<name>.partial, rank 0 renames it to `name`."""
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.barrier(group=group)  # DCP's rank 0 writes the metadata last; every rank's files are there too
    if distributed.rank_and_world()[0] == 0:
        partial = d / f".{name}{_PARTIAL}"
        if not (partial / ".metadata").is_file():
            raise RuntimeError(f"sharded checkpoint {partial} was written without its .metadata")
        partial.rename(d / name)
        fsync_dir(d)


def shards_whole(folder: Path) -> bool:
    """A sharded checkpoint's folder is there with its metadata (DCP writes it after every shard)."""
    return (folder / ".metadata").is_file()


def _referenced_shards(d: Path) -> set[str]:
    """The folders that the .pth files in `d` (step files, last.pth, best.pth) name."""
    names = set()
    for p in d.glob("*.pth"):
        try:
            name = load_file(p).get(SHARDS_KEY)
        except Exception:  # noqa: BLE001 - a damaged file names nothing: its folder goes with it
            continue
        if isinstance(name, str):
            names.add(Path(name).name)
    return names


def prune_shards(d: Path) -> None:
    """Remove the shard folders no checkpoint names any more, and those a killed save left half written."""
    import shutil

    keep = _referenced_shards(d)
    for p in d.iterdir():
        if p.is_dir() and (p.name.endswith(_PARTIAL) or (p.name.endswith(SHARDS_SUFFIX) and p.name not in keep)):
            shutil.rmtree(p, ignore_errors=True)


def with_shard_path(state: dict, path: Path) -> dict:
    """`state` of the checkpoint at `path` with its shard folder's full path; ValueError when that folder is
    missing or was never finished (a resume then falls back to the previous checkpoint)."""
    name = state.get(SHARDS_KEY)
    if name is None:
        return state
    folder = Path(path).parent / Path(str(name)).name
    if not shards_whole(folder):
        raise ValueError(f"its shard folder {folder.name} is missing or incomplete")
    return {**state, SHARDS_KEY: str(folder)}


def read_sharded(obj: dict, path: Path) -> dict:
    """A sharded checkpoint's dict with its model (and EMA) read whole from its folder, for the tools (eval,
    predict, export, MODEL.CHECKPOINT); any other dict as it is."""
    if not isinstance(obj.get(SHARDS_KEY), str):
        return obj
    from runner import fsdp

    folder = with_shard_path(obj, path)[SHARDS_KEY]
    out = {**obj, "model": fsdp.read_model(folder)}
    if obj.get("ema", False) is None and fsdp.has_part(folder, "ema"):
        out["ema"] = fsdp.read_model(folder, "ema")
    return out


# ---------------------------------------------------------------------------------------------------------
# Off the training step: the step waits for a host copy of the state; one thread writes it (save_checkpoint)
# ---------------------------------------------------------------------------------------------------------
def host_copy(state: dict) -> dict:
    """A copy of `state` in host memory that later steps cannot change: CPU tensors cloned (a state_dict's share
    storage with the live weights and optimizer state, which the next step updates in place), device tensors
    copied into pinned memory without blocking and synchronized once. Tensors sharing a storage still share one."""
    copier = _HostCopier()
    out = copier.copy(state)
    for device in copier.devices:
        torch.cuda.synchronize(device)
    return out


class _HostCopier:
    """The walk of host_copy: containers rebuilt, each storage copied once, other leaves deep-copied."""

    def __init__(self):
        self.storages: dict[tuple, torch.UntypedStorage] = {}
        self.devices: set[torch.device] = set()

    def copy(self, obj):
        """`obj` with every tensor in it copied to the host."""
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, dict):  # a module's OrderedDict keeps its type and _metadata (load_state_dict reads it)
            new = copy.copy(obj)
            for k, v in obj.items():
                new[k] = self.copy(v)
            return new
        if isinstance(obj, list):
            return [self.copy(v) for v in obj]
        if isinstance(obj, tuple):
            items = [self.copy(v) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        return copy.deepcopy(obj)

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor over a copy of `t`'s storage (its offset and strides kept)."""
        if type(t) is not torch.Tensor or t.layout != torch.strided or t.is_quantized or t.is_nested:
            return t.detach().to("cpu", copy=True)  # rare kinds: copied as a whole, blocking
        src = t.untyped_storage()
        key = (t.device, src.data_ptr(), src.nbytes())
        dst = self.storages.get(key)
        if dst is None:
            dst = self.storages[key] = self._storage(src, t.device)
        return torch.empty(0, dtype=t.dtype).set_(dst, t.storage_offset(), t.size(), t.stride())

    def _storage(self, src: torch.UntypedStorage, device: torch.device) -> torch.UntypedStorage:
        """A host copy of one storage; from a GPU into pinned memory, synchronized later (host_copy)."""
        if device.type == "cpu":
            return src.clone()
        cuda = device.type == "cuda"
        dst = torch.empty(src.nbytes(), dtype=torch.uint8, pin_memory=cuda).untyped_storage()
        dst.copy_(src, non_blocking=cuda)
        if cuda:
            self.devices.add(device)
        return dst


class CheckpointWriter:
    """save_checkpoint in a background thread, one write at a time; a failed write's error is raised by the next
    wait() (the next save, or the run's end), as the synchronous save would have raised it."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.started = 0.0  # when the write in flight began (time.monotonic)
        self.longest = 0.0  # the longest write so far, in seconds
        self.step = 0  # the step of the latest write

    def submit(self, state: dict, output_dir: str | os.PathLike, step: int, keep: int, best: bool) -> None:
        """Write `state` (a host copy nothing else changes) once the write in flight, if any, is on disk."""
        self.start(lambda: save_checkpoint(state, output_dir, step, keep, best), step)

    def start(self, job: Callable[[], None], step: int) -> None:
        """Run `job` (a whole write of the checkpoint of `step`) once the write in flight, if any, is on disk."""
        self.wait()
        self.started, self.step = time.monotonic(), step
        # not a daemon: the interpreter's exit waits for it, so no process ends with a checkpoint half written
        self.thread = threading.Thread(target=self._write, args=(job,), name="runner-checkpoint-writer")
        self.thread.start()

    def _write(self, job: Callable[[], None]) -> None:
        """The thread: the whole synchronous save (temp, fsync, rename, read-back, links, pruning, stale temps)."""
        try:
            job()
        except BaseException as e:  # handed to the loop's thread by wait()
            self.error = e
        finally:
            self.longest = max(self.longest, time.monotonic() - self.started)

    @property
    def pending(self) -> bool:
        """True from submit() until wait(): a write nobody has waited for yet (it may have ended)."""
        return self.thread is not None

    def in_flight(self) -> float:
        """Seconds the write in flight has taken so far (0.0 with none)."""
        return time.monotonic() - self.started if self.pending and self.thread.is_alive() else 0.0

    def wait(self) -> None:
        """Block until the write in flight is on disk; raise its error (once) if it failed."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        error, self.error = self.error, None
        if error is not None:
            raise error


def zip_entries(path: Path) -> list[str] | None:
    """The entry names of the zip archive at `path` (torch.save's format), or None when it is no readable zip."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return None


def is_torch_archive(entries: list[str] | None) -> bool:
    """True for the entries of a torch file: its pickle (data.pkl) is among them."""
    return entries is not None and any(name.endswith("data.pkl") for name in entries)


def looks_whole(path: Path) -> bool:
    """A cheap read-back: torch's zip archive opens and lists its entries (no tensor is loaded)."""
    return is_torch_archive(zip_entries(path))


def prune(directory: Path, step: int, keep: int) -> None:
    """Remove the oldest step files beyond `keep`, counting only those up to `step` (never a newer file)."""
    ours = [(s, p) for s, p in step_files(directory) if s <= step]
    for _, old in ours[max(keep, 1):]:
        old.unlink(missing_ok=True)


class NotADict(ValueError):
    """A torch file that holds something other than a dict (a list, a tensor): no checkpoint, no state_dict."""

    def __init__(self, found: str):
        super().__init__(f"expected a dict, found {found}")
        self.found = found


def load_file(path: str | os.PathLike) -> dict:
    """torch.load with weights_only=True (no pickled code runs); raises on a bad file, NotADict on a non-dict."""
    with warnings.catch_warnings():  # torch warns about pickle protocols before failing with its own error
        warnings.simplefilter("ignore")
        obj = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(obj, dict):
        raise NotADict(type(obj).__name__)
    return obj


def describe(e: Exception) -> str:
    """A short reason for a failed load."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}"[:200]


SAVE_WEIGHTS = "save only the weights: torch.save(model.state_dict(), path)"
OWN_CHECKPOINT = "the runner's own checkpoints hold none: name one it wrote (OUTPUT_DIR/checkpoints/last.pth)"


def load_reason(e: Exception, fix: str = SAVE_WEIGHTS) -> str | None:
    """torch.load's long messages (many lines, which describe cuts) shortened to what the file is, with `fix`
    (what would be right) for a pickle holding code; None for other errors."""
    text = str(e)
    if "Weights only load failed" in text:
        glob = re.search(r"GLOBAL ([\w.]+)", text)
        found = f" ({glob.group(1)})" if glob else ""
        return f"a pickle holding Python objects other than tensors{found}, which weights_only loading refuses; {fix}"
    if "central directory" in text or "PytorchStreamReader" in text:
        return "a damaged torch file: cut short or changed after saving"
    return None


def find_resumable(output_dir: str | os.PathLike) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, warning about (and skipping) any newer one that does not."""
    for path in candidates(output_dir):
        try:
            state = load_file(path)
            if "model" not in state or "step" not in state:
                raise ValueError("not a runner checkpoint (no 'model' or 'step')")
            return path, with_shard_path(state, path)
        except Exception as e:  # a truncated, empty or foreign file: fall back to an older one
            log.warning("checkpoint %s is unusable (%s); trying the previous one", path, describe(e))
    return None


def load_explicit(path: str) -> dict:
    """A checkpoint the user named: one clear error line if it cannot be used."""
    if not Path(path).is_file():
        raise UserError(f"checkpoint '{path}' does not exist")
    try:
        state = load_file(path)
    except Exception as e:
        reason = load_reason(e, OWN_CHECKPOINT) or describe(e)
        raise UserError(f"checkpoint '{path}' cannot be loaded ({reason})") from None
    if "model" not in state or "step" not in state:
        raise UserError(f"checkpoint '{path}' is not a runner checkpoint (no 'model'/'step'); "
                        "to start from plain weights use MODEL.CHECKPOINT")
    try:
        return with_shard_path(state, Path(path))
    except ValueError as e:
        raise UserError(f"checkpoint '{path}' cannot be used: {e}; name an earlier checkpoint") from None


# ---------------------------------------------------------------------------------------------------------
# RNG state: each rank's own, gathered to rank 0 and saved as a list indexed by rank
# ---------------------------------------------------------------------------------------------------------
def capture_rng(dist: Dist, group=None) -> list[dict] | None:
    """Every rank's RNG state (python, numpy, torch CPU, its own GPU's) on rank 0, indexed by rank; None elsewhere.

    A collective: every rank calls it at the same point. `group`: the run's CPU control group.
    """
    return distributed.gather_object(_own_rng(dist.device), group)


def restore_rng(saved: list[dict] | dict, dist: Dist) -> None:
    """Give this rank its own RNG state back from a checkpoint's `rng` (capture_rng's list, or an older dict).

    Resumed on another number of processes, the ranks that have a saved state restore it, the others keep the
    seeded generators, and rank 0 says so in one log line.
    """
    if isinstance(saved, dict):  # before per-rank states: rank 0's only, restored on every rank as then
        _set_own_rng(saved, dist.device)
        return
    if dist.rank < len(saved):
        _set_own_rng(saved[dist.rank], dist.device)
    if dist.is_main and len(saved) != dist.world_size:
        log.info("%s", rng_mismatch(len(saved), dist.world_size))


def rng_mismatch(saved: int, world: int) -> str:
    """The log line of a resume on another number of processes than the checkpoint holds RNG states of."""
    kept = min(saved, world)
    restored = f"{_ranks(0, kept - 1)} restored {'its' if kept == 1 else 'their'} own"
    rest = (f"the other {saved - world} saved states are unused" if saved > world else
            f"{_ranks(saved, world - 1)} {'keeps its' if world - saved == 1 else 'keep their'} seeded generators")
    return (f"the checkpoint holds the RNG states of {saved} process{'es' if saved != 1 else ''} and this run has "
            f"{world}: {restored}, {rest}; random draws (dropout, drop-path, mixup, augmentation) are seeded per "
            "step, chunk of the global batch and sample, so they are those of an uninterrupted run")


def _ranks(first: int, last: int) -> str:
    """'rank 3' or 'ranks 3-7'."""
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def _own_rng(device: torch.device) -> dict:
    """This process's RNGs as tensors and plain lists (loadable with weights_only); its own GPU's only."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_own_rng(state: dict, device: torch.device) -> None:
    """Restore what _own_rng() captured (or an older checkpoint's state) on this process and its own GPU."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    cuda = state.get("cuda")
    if isinstance(cuda, list):  # older checkpoints: every visible GPU's state, saved by rank 0
        index = device.index or 0
        cuda = cuda[index] if device.type == "cuda" and index < len(cuda) else None
    if cuda is not None and device.type == "cuda":
        torch.cuda.set_rng_state(cuda, device)
