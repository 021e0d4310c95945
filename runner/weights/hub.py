"""Pretrained weights as timm loads them: the Hugging Face Hub through huggingface_hub, or timm's URL cache.

`fetch(name)` puts the file that `timm.create_model(name, pretrained=True)` reads into the cache (the Hub's:
HF_HOME / HF_HUB_CACHE, HF_ENDPOINT and HF_TOKEN honoured by the client; a URL's: torch hub's) and says which
file it is: repo, revision (the commit the Hub answered), sha256. A broken transfer is resumed by the client and
retried here; the client writes into a temporary file and renames it, so a cut download is never read as whole.
Offline (HF_HUB_OFFLINE=1 or no network) the cache alone is read, and a file missing there is one line naming
the cache and `tools/fetch_weights.py`. `fetch_for_run` makes one process per node download (local rank 0);
the others wait on the job's store, then read the cache. `create(...)` builds the model from the cache only.
"""
from __future__ import annotations

import difflib
import hashlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from runner.errors import UserError

log = logging.getLogger("runner")

BACKOFF_S = 2.0  # the wait before the second try, doubled before each next one
RETRIES = 3  # whole tries of one file, each resumed by the client itself up to 5 times while bytes still arrive
FETCH_HINT = "python tools/fetch_weights.py"


@dataclass(frozen=True)
class Pretrained:
    """The weights file a pretrained model was (or will be) built from."""

    model: str  # MODEL.NAME as written
    repo: str  # the Hub repo (timm/resnet18.a1_in1k) or the URL
    revision: str  # the commit of the repo the file belongs to ("" for a URL)
    file: str  # the file in the local cache
    sha256: str
    size: int

    def record(self) -> dict[str, Any]:
        """What results.json keeps (the local path left out: it differs per machine)."""
        return {k: v for k, v in asdict(self).items() if k != "file"}

    def env_line(self) -> str:
        """env.txt's line."""
        at = f"@{self.revision}" if self.revision else ""
        return (f"pretrained: {self.model} = {self.repo}{at} {Path(self.file).name} sha256 {self.sha256} "
                f"({self.size / 2**20:.1f} MiB, {self.file})")


_FETCHED: dict[str, Pretrained] = {}  # per process: a model built twice (eval, EMA) fetches once


def hub_cache() -> str:
    """The Hugging Face cache folder the client reads and writes (HF_HUB_CACHE, else HF_HOME/hub)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def is_offline() -> bool:
    """True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) forbids the client any request."""
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


@contextmanager
def offline() -> Iterator[None]:
    """The Hub client in offline mode for the block: files come from the cache, no request is made."""
    from huggingface_hub import constants

    was = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = was


@contextmanager
def _client_logs() -> Iterator[None]:
    """The client's own warnings (a resumed download) as the run's log lines; its progress bars on terminals
    only, so that a piped run's stderr holds its own lines."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hub_log = logging.getLogger("huggingface_hub")
    saved = hub_log.handlers, hub_log.propagate
    hub_log.handlers, hub_log.propagate = list(log.handlers) or list(logging.getLogger().handlers), False
    bars_were_off = are_progress_bars_disabled()
    if not sys.stderr.isatty():
        disable_progress_bars()
    try:
        yield
    finally:
        hub_log.handlers, hub_log.propagate = saved
        if not bars_were_off:
            enable_progress_bars()


# ---- where timm's weights for a name live ------------------------------------------------------------------
@dataclass(frozen=True)
class Location:
    """Where timm reads a model's pretrained weights: a Hub repo (and the files to try, in order) or a URL."""

    name: str
    repo: str = ""
    revision: str | None = None
    files: tuple[str, ...] = ()
    url: str = ""
    config_json: bool = False  # an hf-hub: name: the repo's config.json names the architecture first


def locate(name: str) -> Location:
    """Where timm would load `name`'s pretrained weights from; a UserError for a name that has none."""
    import timm
    from timm.models import get_pretrained_cfg, split_model_name_tag

    if name.startswith("hf-hub:"):
        repo, revision = _split_revision(name[len("hf-hub:"):])
        return Location(name, repo, revision, config_json=True)
    arch = split_model_name_tag(name)[0]
    if not timm.is_model(arch):
        close = difflib.get_close_matches(name, timm.list_models() + timm.list_pretrained(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see timm.list_pretrained() for the names"
        raise UserError(f"{name!r} is not a timm model{hint}")
    try:
        cfg = get_pretrained_cfg(name)
    except RuntimeError:
        cfg = None
    if cfg is not None and cfg.hf_hub_id:
        repo, revision = _split_revision(cfg.hf_hub_id)
        return Location(name, repo, revision, _weights_files(cfg.hf_hub_filename))
    if cfg is not None and cfg.url:
        return Location(name, url=cfg.url)
    raise UserError(f"MODEL.PRETRAINED true but timm has no pretrained weights for MODEL.NAME {name}; "
                    f"see timm.list_pretrained('{arch}*') for those with weights, or set MODEL.PRETRAINED false")


def _split_revision(repo_id: str) -> tuple[str, str | None]:
    """('org/name', 'rev' or None) from timm's 'org/name@rev'."""
    repo, _, revision = repo_id.partition("@")
    return repo, revision or None


def _weights_files(filename: str | None) -> tuple[str, ...]:
    """The files timm tries, in its order: a named file, else its safetensors alternative, then pytorch_model.bin."""
    from timm.models._hub import HF_WEIGHTS_NAME, _get_safe_alternatives

    if filename and filename.endswith(".safetensors"):
        return (filename,)
    base = filename or HF_WEIGHTS_NAME
    return (*_get_safe_alternatives(base), base)


# ---- fetching -------------------------------------------------------------------------------------------------
def fetch(name: str, local_only: bool = False) -> Pretrained:
    """The weights of `name` in the local cache, downloaded first unless `local_only` or offline; memoized."""
    if name in _FETCHED:
        return _FETCHED[name]
    where = locate(name)
    with _client_logs():
        found = _fetch_url(where, local_only) if where.url else _fetch_hub(where, local_only)
    _FETCHED[name] = found
    return found


def _fetch_hub(where: Location, local_only: bool) -> Pretrained:
    """Download (or find) a Hub repo's weights file; hf-hub: names read the repo's config.json first."""
    files = where.files
    if where.config_json:
        config = _hub_file(where, "config.json", local_only)
        files = _weights_files(_config_filename(config))
    for i, filename in enumerate(files):
        try:
            path = _hub_file(where, filename, local_only, last=i == len(files) - 1, label=" or ".join(files))
        except _Absent:
            continue
        return _describe(where.name, where.repo, path)
    raise UserError(f"MODEL.NAME {where.name}: the Hub repo {where.repo} holds none of {', '.join(files)} "
                    "(timm's weights files)")


class _Absent(Exception):
    """This file is not in the repo: timm would try the next one."""


def _hub_file(where: Location, filename: str, local_only: bool, last: bool = True, label: str = "") -> Path:
    """One file of the repo in the cache, with retries of a broken transfer; one-line UserErrors otherwise."""
    return _retried(partial(_download, where, filename, local_only or is_offline(), last, label),
                    f"MODEL.NAME {where.name}: downloading {where.repo} {filename} from {_endpoint()}",
                    f"run the command again, or fetch the weights elsewhere: {FETCH_HINT} {where.name}")


def _download(where: Location, filename: str, local_only: bool, last: bool, label: str) -> Path:
    """hf_hub_download of one file, the Hub's answers that no retry changes as one-line UserErrors."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(hf_hub_download(where.repo, filename, revision=where.revision, local_files_only=local_only,
                                    library_name="timm"))
    except GatedRepoError:
        raise UserError(f"MODEL.NAME {where.name}: the Hub repo {where.repo} is gated: accept its terms on "
                        "the Hub and set HF_TOKEN (or run `hf auth login`)") from None
    except RepositoryNotFoundError:
        raise UserError(f"MODEL.NAME {where.name}: the Hub has no repo {where.repo} at "
                        f"{_endpoint()} (or it is private: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise UserError(f"MODEL.NAME {where.name}: the Hub repo {where.repo} has no revision "
                        f"{where.revision!r}") from None
    except LocalEntryNotFoundError:
        if not last and local_only:  # offline: the next file may be the one an earlier download kept
            raise _Absent() from None
        raise UserError(missing_line(where, label or filename, local_only)) from None
    except EntryNotFoundError:
        if not last:
            raise _Absent() from None
        raise UserError(f"MODEL.NAME {where.name}: the Hub repo {where.repo} has no file {filename}") from None


def _retried(call: Callable[[], Path], what: str, hint: str) -> Path:
    """call() again while it fails in transit (a broken transfer the client gave up resuming), waiting longer
    each time; after RETRIES tries one line: `what` failed, why, and `hint`."""
    for attempt in range(1, RETRIES + 1):
        try:
            return call()
        except Exception as e:
            if not _is_network_error(e):
                raise
            if attempt == RETRIES:
                raise UserError(f"{what} failed {RETRIES} times ({_reason(e)}); {hint}") from None
            log.warning("%s: %s; trying again (%d of %d)", what, _reason(e), attempt + 1, RETRIES)
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def _is_network_error(e: Exception) -> bool:
    """True for a transport error a new try may get past: the HTTP client's (httpx and its forks), or the OS's."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(e, HfHubHTTPError):  # the Hub answered (a 4xx/5xx): its own retries covered the 5xx
        return False
    return isinstance(e, (OSError, TimeoutError)) or any(
        c.__module__.startswith(("httpx", "httpcore", "requests", "urllib3", "h11")) for c in type(e).__mro__)


def _reason(e: BaseException) -> str:
    """The first line of an exception, with its type."""
    text = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _endpoint() -> str:
    """The Hub the client talks to (HF_ENDPOINT, else huggingface.co)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def missing_line(where: Location, filename: str, local_only: bool) -> str:
    """The one line for weights that are neither in the cache nor reachable."""
    why = "HF_HUB_OFFLINE is set" if is_offline() else ("the cache alone was read" if local_only else
                                                        f"{_endpoint()} cannot be reached")
    return (f"MODEL.PRETRAINED true: the weights of {where.name} ({where.repo} {filename}) are not in the "
            f"Hugging Face cache {hub_cache()} and {why}; on a machine with internet (a login node, with the same "
            f"HF_HOME) run: {FETCH_HINT} {where.name}, or set MODEL.CHECKPOINT to a weights file")


def _config_filename(config_path: Path) -> str | None:
    """The weights file an hf-hub: repo's config.json names (pretrained_cfg.hf_hub_filename), if any."""
    import json

    cfg = json.loads(config_path.read_text())
    return (cfg.get("pretrained_cfg") or cfg).get("hf_hub_filename")


def _fetch_url(where: Location, local_only: bool) -> Pretrained:
    """A URL's weights in timm's (torch hub's) cache, downloaded there unless offline."""
    from urllib.parse import urlparse

    from timm.models._hub import download_cached_file, get_cache_dir

    cached = Path(get_cache_dir()) / os.path.basename(urlparse(where.url).path)
    if not cached.is_file() and (local_only or is_offline()):
        raise UserError(f"MODEL.PRETRAINED true: the weights of {where.name} ({where.url}) are not in timm's cache "
                        f"{cached.parent}; on a machine with internet run: {FETCH_HINT} {where.name}")
    # torch hub writes a temporary file and renames it when whole; urllib's errors are OSErrors
    path = _retried(lambda: Path(download_cached_file(where.url)), f"MODEL.NAME {where.name}: downloading "
                    f"{where.url}", "run the command again")
    return _describe(where.name, where.url, path, revision="")


def _describe(name: str, repo: str, path: Path, revision: str | None = None) -> Pretrained:
    """The record of a cached file: a Hub snapshot's folder name is the commit it belongs to."""
    if revision is None:
        revision = path.parent.name if path.parent.parent.name == "snapshots" else ""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return Pretrained(name, repo, revision, str(path), digest.hexdigest(), path.stat().st_size)


# ---- one download per node --------------------------------------------------------------------------------
def fetch_for_run(name: str, local_rank: int, store: Any, timeout_s: float) -> Pretrained:
    """Local rank 0 fetches; the node's other ranks wait for its word on the job's `store`, then read the cache.

    They wait while rank 0 shows signs of life (a counter it bumps every 2 s) and give up after `timeout_s`
    (DIST.TIMEOUT_S) without one. Rank 0's one-line mistake is raised on every rank (printed once, by rank 0).
    """
    if store is None:
        return fetch(name)
    key = f"runner/weights/{os.environ.get('GROUP_RANK') or socket.gethostname()}/{name}"
    if local_rank == 0:
        return _fetch_and_tell(name, store, key)
    verdict = _wait_word(store, key, timeout_s)
    if verdict != "ok":
        error = UserError(verdict)
        error.relayed = True  # rank 0 says it
        raise error
    return fetch(name, local_only=True)


def _fetch_and_tell(name: str, store: Any, key: str) -> Pretrained:
    """Fetch, bumping a heartbeat for the waiting ranks, and set the key to 'ok' or the mistake's line."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(2.0):
            store.add(key + "/beat", 1)

    threading.Thread(target=beat, daemon=True, name="weights-heartbeat").start()
    try:
        found = fetch(name)
    except UserError as e:
        store.set(key, str(e))
        raise
    except BaseException as e:
        store.set(key, f"local rank 0 failed to fetch the weights of {name}: {_reason(e)}")
        raise
    finally:
        done.set()
    store.set(key, "ok")
    return found


def _wait_word(store: Any, key: str, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> str:
    """Rank 0's word under `key`; a UserError when its heartbeat stops for `timeout_s` seconds."""
    last_beat, seen = clock(), -1
    while not store.check([key]):
        beats = store.add(key + "/beat", 0)
        if beats != seen:
            last_beat, seen = clock(), beats
        elif clock() - last_beat > timeout_s:
            raise UserError(f"local rank 0 gave no sign of fetching the pretrained weights for {timeout_s:g} s "
                            "(DIST.TIMEOUT_S); nothing was trained or written")
        time.sleep(0.1)
    return store.get(key).decode()


def create(build: Callable[..., Any], **kwargs: Any) -> Any:
    """`build(pretrained=True, **kwargs)` (timm's create_model) reading the fetched file from the cache only."""
    with offline(), _client_logs():
        return build(pretrained=True, **kwargs)
