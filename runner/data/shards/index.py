"""Where the shards are and what they hold: DATA.ROOT/{train,val}/index.json (shard names and sample counts, so
steps per epoch are known before step 1), DATA.ROOT/class_map.json, and the URL of each shard
(DATA.SHARD_URL: a path, an http(s) URL or a `pipe:COMMAND`, opened by webdataset's gopen).

Small reads only (webdataset is imported once a stream is opened): the source's check (shards/source.py) calls
check_source before anything is written to OUTPUT_DIR. A fault that passes (5xx, a refused connection, no answer)
is ridden out for DATA.RETRY_S here as in a shard's stream (Patience, ride_out), then the run stops as preempted
(exit 75: the same command again once the server is back); a 404 or a damaged file is a UserError (exit 2).
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import select as _select
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from runner.errors import DataUnavailable, UserError

log = logging.getLogger("runner")

INDEX = "index.json"
CLASS_MAP = "class_map.json"
SPLITS = ("train", "val")
DEFAULT_URL = "{root}/{split}/{name}"
MAX_FETCH_S = 30.0  # the index and class map are small: a server that does not answer in this is down
# One /-separated part of a shard or split name. A served index is data, not code, yet its names go into paths,
# URLs and (DATA.SHARD_URL pipe:) shell commands: no shell syntax, no leading '-' (an option to the command), and
# '.' or '..' are refused apart (a way out of DATA.ROOT)
NAME_PART = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class ShardSplit:
    """One split's shards: their URLs and sample counts, in the index's order."""

    split: str
    urls: list[str]
    counts: list[int]

    @property
    def total(self) -> int:
        """Samples in the split."""
        return sum(self.counts)


def is_remote(root: str) -> bool:
    """DATA.ROOT names an http(s) base URL rather than a local folder."""
    return root.startswith(("http://", "https://"))


class Fault(OSError):
    """A failed read of a URL; `transient` when the server may come back (5xx, refused, reset, no answer)."""

    def __init__(self, reason: str, transient: bool):
        super().__init__(reason)
        self.reason, self.transient = reason, transient


# curl's exit codes of faults that pass: resolve, connect, HTTP/2 framing, partial body, timeout, TLS handshake,
# empty reply, send/receive (reset), HTTP/2 stream
CURL_TRANSIENT = {5, 6, 7, 16, 18, 28, 35, 52, 55, 56, 92}
# words of other commands' (pipe:) errors that say the same, and the HTTP statuses that pass (408, 429, 5xx)
# (a status stands alone: "HTTP 503", "error: 503"; never a piece of a path or a name such as /tmp/pytest-503/ or
# shard-500.tar, which would make a missing file look like an outage worth waiting DATA.RETRY_S for)
TRANSIENT_WORDS = re.compile(r"connection refused|connection reset|timed out|temporarily unavailable|"
                             r"service unavailable|broken pipe|(?<![\w/.-])(408|429|5\d\d)(?![\w/.-])",
                             re.IGNORECASE)
STALL_S = 60.0  # a read that gets no byte for this long (or DATA.RETRY_S, if less) is a fault: the server hangs


def classify(status: int, message: str) -> Fault:
    """The fault of a command that exited `status` with `message` (its last stderr line)."""
    curl = re.search(r"curl: \((\d+)\)", message)
    code = int(curl.group(1)) if curl else None
    if code == 22:  # curl -f: an HTTP error status; only 408, 429 and 5xx pass
        transient = re.search(r"\b(408|429|5\d\d)\b", message) is not None
    else:
        transient = code in CURL_TRANSIENT or (code is None and TRANSIENT_WORDS.search(message) is not None)
    return Fault(f"exit {status}" + (f": {message}" if message else ""), transient)


class ShardPipe:
    """A command's stdout as a binary stream (curl for http(s), or a pipe:COMMAND), owned until close().

    Reads wait at most `stall_s` for a byte (a server that accepts and never answers is a transient Fault, not a
    hang); the end of the output checks the command's exit status (Fault); close() kills the command if it still
    runs and reaps it, so no reader outlives its stream and none is left a zombie.
    """

    def __init__(self, url: str, stall_s: float = STALL_S):
        self.url, self.stall_s = url, stall_s
        self.err = tempfile.TemporaryFile()  # the command's stderr, for the one-line message
        if url.startswith("pipe:"):
            args, shell = url[len("pipe:"):], True
        else:  # webdataset's curl call, without its 30 retries of 2 s (read_shard retries instead)
            args, shell = ["curl", "--connect-timeout", str(max(1, round(min(stall_s, 30)))), "-f", "-s", "-S",
                           "-L", url], False
        self.proc = subprocess.Popen(args, shell=shell, stdout=subprocess.PIPE, stderr=self.err, bufsize=0)
        self.fd = self.proc.stdout.fileno()
        self.closed = False

    def __repr__(self) -> str:
        return f"<{self.url}>"  # webdataset appends str(stream) to errors it passes on

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all with -1), b'' at the end; Fault when the command failed or the source stalls."""
        if n < 0:
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        ready, _, _ = _select.select([self.fd], [], [], self.stall_s)
        if not ready:
            raise Fault(f"no byte for {self.stall_s:g} s (the server accepted and does not answer)", True)
        data = os.read(self.fd, n)
        if not data:
            fault = self.failure()
            if fault is not None:
                raise fault
        return data

    def failure(self) -> Fault | None:
        """The command's fault once it has exited non-zero (141: SIGPIPE from our close), else None."""
        try:
            status = self.proc.wait(timeout=self.stall_s)
        except subprocess.TimeoutExpired:
            return Fault(f"the command did not exit {self.stall_s:g} s after its output ended", True)
        if status in (0, 141, -signal.SIGPIPE):
            return None
        self.err.seek(0)
        lines = self.err.read().decode(errors="replace").strip().splitlines()
        return classify(status, lines[-1] if lines else "")

    def close(self) -> None:
        """Stop the command if it still runs and reap it (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self.err.close()


def gopen_url(url: str, stall_s: float = STALL_S):
    """A binary stream of `url`: a local file through webdataset's gopen; http(s) and pipe: as a ShardPipe."""
    if not is_remote(url) and not url.startswith("pipe:"):
        from webdataset import gopen  # imports torch: only once a shard is opened

        return gopen(url, "rb")
    return ShardPipe(url, stall_s)


class Patience:
    """How long transient faults are retried (DATA.RETRY_S, with exponential backoff and jitter) and how many
    tries other fetch failures get (DATA.SHARD_RETRIES)."""

    BASE_S, MAX_S = 0.25, 15.0  # the first backoff and the longest

    def __init__(self, retries: int, retry_s: float):
        self.retries, self.retry_s = max(1, retries), retry_s

    @property
    def stall_s(self) -> float:
        """A read that gets no byte for this long is a fault: the server hangs."""
        return min(STALL_S, self.retry_s) if self.retry_s > 0 else STALL_S

    def backoff(self, attempt: int, left: float) -> float:
        """Seconds before try `attempt` + 1: doubling, full jitter (workers and ranks do not retry in step),
        never past the time left."""
        return min(left, random.SystemRandom().uniform(0.5, 1.0) * min(self.MAX_S, self.BASE_S * 2**attempt))


def ride_out(what: str, reason: str, patience: Patience, since: float | None, attempt: int) -> float:
    """A transient fault of `what` (a shard, an index): back off, then return when the outage began;
    DataUnavailable once it has lasted DATA.RETRY_S."""
    since = time.monotonic() if since is None else since
    left = since + patience.retry_s - time.monotonic()
    if left <= 0:
        raise DataUnavailable(
            f"{what} is unavailable: {reason}, for {time.monotonic() - since:.0f} s (DATA.RETRY_S "
            f"{patience.retry_s:g}); stopped as preempted: rerun the same command to continue once the data "
            "server is back") from None
    if attempt == 0:
        log.warning("%s: %s; retrying for up to DATA.RETRY_S %g s", what, reason, patience.retry_s)
    time.sleep(patience.backoff(attempt, left))
    return since


def fetch(url: str, patience: Patience) -> bytes:
    """The whole content of `url`: a transient fault (5xx, refused, no answer) ridden out for DATA.RETRY_S, then
    DataUnavailable (exit 75, as a shard's in training); other failures tried DATA.SHARD_RETRIES times, then a
    UserError naming it."""
    tries, attempt, since = 0, 0, None
    while True:
        try:
            return _read_all(url, min(MAX_FETCH_S, patience.stall_s))
        except FileNotFoundError as e:  # a missing local file is not worth retrying
            raise UserError(f"{url} does not exist ({e.strerror})") from None
        except Fault as e:
            if e.transient:
                since = ride_out(url, e.reason, patience, since, attempt)
                attempt += 1
                continue
            last = e.reason
        except (OSError, ValueError) as e:
            last = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        tries += 1
        if tries >= patience.retries:
            raise UserError(f"{url} cannot be fetched after {tries} tries ({last})")
        time.sleep(0.2 * 2**tries)


def _read_all(url: str, stall_s: float) -> bytes:
    """One read of the whole of `url` (a local path, an http(s) URL or a pipe: command)."""
    if not is_remote(url) and not url.startswith("pipe:"):
        with open(url, "rb") as f:
            return f.read()
    stream = ShardPipe(url, stall_s)
    try:
        return stream.read()
    finally:
        stream.close()


def check_name(name: str, what: str, where: str) -> None:
    """Refuse a shard or split name outside the safe pattern, in one line naming `where` (the index) and it."""
    if all(NAME_PART.fullmatch(part) and part not in (".", "..") for part in name.split("/")):
        return
    raise UserError(f"{where} names {what} {name!r}, which is not a safe name: names are letters, digits, '.', '_' "
                    "and '-', with '/' between sub-folders (no part empty, '.', '..' or starting with '-'); fix the "
                    "index or write the shards again with tools/make_shards.py")


def shard_urls(template: str, root: str, split: str, names: list[str]) -> list[str]:
    """DATA.SHARD_URL filled in for each name; in a pipe: command each placeholder is one quoted shell word."""
    quote = shlex.quote if template.startswith("pipe:") else str  # names are checked too: quoting is the 2nd wall
    try:
        return [template.format(root=quote(root.rstrip("/")), split=quote(split), name=quote(n)) for n in names]
    except (KeyError, IndexError, ValueError) as e:
        raise UserError(f"DATA.SHARD_URL {template!r} takes only {{root}}, {{split}} and {{name}} ({e})") from None


def split_url(root: str, split: str, name: str) -> str:
    """DATA.ROOT/split/name as a path or a URL."""
    return f"{root.rstrip('/')}/{split}/{name}"


def patience_of(cfg: Any) -> Patience:
    """DATA.SHARD_RETRIES and DATA.RETRY_S: how the index, the class map and the shards are retried."""
    return Patience(cfg.DATA.SHARD_RETRIES, cfg.DATA.RETRY_S)


def read_json(url: str, what: str, patience: Patience) -> Any:
    """A small JSON file of the shard layout; UserError naming it when missing or malformed."""
    raw = fetch(url, patience)
    try:
        return json.loads(raw)
    except ValueError as e:
        raise UserError(f"{url} is not valid JSON ({e}); {what} is written by tools/make_shards.py") from None


def read_classes(cfg: Any) -> list[str]:
    """Class names by index from DATA.ROOT/class_map.json ({"0": "cat", ...})."""
    url = f"{cfg.DATA.ROOT.rstrip('/')}/{CLASS_MAP}"
    raw = read_json(url, "the class map", patience_of(cfg))
    try:
        return [str(raw[str(i)]) for i in range(len(raw))]
    except (KeyError, TypeError):
        raise UserError(f"{url} is not a class map ({{\"0\": \"name\", ...}} with indices 0..n-1)") from None


def select(names: list[str], pattern: str, where: str) -> list[str]:
    """The index's shard names that DATA.TRAIN_SHARDS (a brace pattern, '::' between several) keeps, in the
    index's order; all when the pattern is empty."""
    if not pattern:
        return names
    from braceexpand import braceexpand  # webdataset's brace expansion

    try:
        wanted = {os.path.basename(u) for part in pattern.split("::") for u in braceexpand(part)}
    except ValueError as e:
        raise UserError(f"DATA.TRAIN_SHARDS {pattern!r} is not a brace pattern ({e})") from None
    kept = [n for n in names if n in wanted]
    if not kept:
        raise UserError(f"DATA.TRAIN_SHARDS {pattern!r} matches none of the {len(names)} shards in {where} "
                        f"(names like {names[0]!r}); use a pattern such as 'train-{{000000..000009}}.tar'")
    return kept


def read_index(cfg: Any, split: str) -> ShardSplit:
    """The split's shards from DATA.ROOT/split/index.json, located by DATA.SHARD_URL."""
    url = split_url(cfg.DATA.ROOT, split, INDEX)
    check_name(split, "split", url)
    raw = read_json(url, "the index", patience_of(cfg))
    try:
        pairs = [(str(name), int(count)) for name, count in raw["shards"]]
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{url} is not a shard index ({{\"shards\": [[name, samples], ...]}}); "
                        "tools/make_shards.py writes it") from None
    if not pairs:
        raise UserError(f"{url} lists no shards: the {split} split is empty")
    if any(count < 0 for _, count in pairs):
        raise UserError(f"{url}: a shard has a negative sample count")
    for name, _ in pairs:
        check_name(name, "shard", url)
    counts = dict(pairs)
    names = select([n for n, _ in pairs], cfg.DATA.TRAIN_SHARDS, url) if split == "train" else [n for n, _ in pairs]
    urls = shard_urls(cfg.DATA.SHARD_URL or DEFAULT_URL, cfg.DATA.ROOT, split, names)
    return ShardSplit(split, urls, [counts[n] for n in names])


def check_local_files(shards: ShardSplit, index: str) -> None:
    """Every shard the index names that is a local path exists: said before the claim, not at the step that
    reads it (http(s) and pipe: shards are not asked for: a request each would cost more than it tells)."""
    local = [u for u in shards.urls if not is_remote(u) and not u.startswith("pipe:")]
    missing = [u for u in local if not os.path.isfile(u)]
    if missing:
        raise UserError(f"{index} lists a shard {missing[0]} that does not exist ({len(missing)} of the "
                        f"{len(shards.urls)} {shards.split} shards used are missing): copy them back, or write the "
                        "shards and index again with tools/make_shards.py")


def check_source(cfg: Any, world_size: int) -> None:
    """Everything about DATA.NAME shards that can be refused before a run writes anything: the layout's files,
    their shard names, the local shards' presence, the selection, and the stream count against the number of
    processes."""
    streams = cfg.DATA.SHARD_STREAMS
    if streams % world_size:
        fits = [w for w in range(1, streams + 1) if streams % w == 0]
        raise UserError(f"DATA.SHARD_STREAMS {streams} cannot be split evenly among {world_size} processes: "
                        f"run on {', '.join(map(str, fits))} processes (SHARD_STREAMS fixes the training order: "
                        "changing it restarts the order, a resume refuses it)")
    classes = read_classes(cfg)
    train, val = read_index(cfg, "train"), read_index(cfg, "val")
    for shards in (train, val):
        check_local_files(shards, split_url(cfg.DATA.ROOT, shards.split, INDEX))
    if train.total < streams:
        raise UserError(f"the train shards hold {train.total} samples, fewer than DATA.SHARD_STREAMS {streams}")
    if not classes:
        raise UserError(f"{cfg.DATA.ROOT}/{CLASS_MAP} names no class")
