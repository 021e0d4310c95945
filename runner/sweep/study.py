"""The search's Optuna study: one study in ROOT/study.journal (Optuna's JournalStorage with its file backend, so a
cluster's shared file system is enough: no database server), its space as Optuna distributions, its sampler.

The study is named after the sweep file and keeps what it was made with (metric, mode, rungs, space, the shared
config) as one user attr; opening it with other settings is refused with the first difference, in one line.
`trials` is not kept: raising it continues the same study with more trials (it counts the study's trials).

A damaged journal (a line that is no record, with lines after it) is one line naming the file and the line. A torn
last line (a writer killed mid-record) is what Optuna's reader skips itself; the next record would be appended to
it and make it a damaged line, so it is cut before each append, under Optuna's own lock (no writer is mid-record).
"""
from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler, GridSampler, RandomSampler, TPESampler
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend, JournalFileOpenLock
from optuna.trial import TrialState

from runner.errors import UserError
from runner.sweep.search import Search, refusal, stored

JOURNAL = "study.journal"
SETTINGS = "settings"  # the study user attr holding Search.settings()
TAIL_CHUNK = 1 << 12  # bytes read at a time from the journal's end to find its last line (a record: ~300 bytes)
UNSYNCED: set[str] = set()  # journals this process wrote to and has not fsynced yet (`sync_written`)
# what Optuna's replay raises on a record it cannot apply (a missing key, an unknown op_code's assert, a wrong type)
REPLAY_ERRORS = (KeyError, TypeError, ValueError, AssertionError, AttributeError, IndexError)


def journal_path(search: Search) -> str:
    """ROOT/study.journal."""
    return os.path.join(search.root, JOURNAL)


def study_name(search: Search) -> str:
    """The study's name: the sweep file's name without its extension."""
    return os.path.splitext(os.path.basename(search.sweep.path))[0]


def distributions(search: Search) -> dict[str, BaseDistribution]:
    """The space as Optuna distributions, named by config key."""
    out: dict[str, BaseDistribution] = {}
    for key, dim in search.space.items():
        if dim.kind == "choice":
            out[key] = CategoricalDistribution([stored(dim, v) for v in dim.args])
        elif isinstance(dim.args[0], int):  # int ranges, and log ranges of a whole-number key
            out[key] = IntDistribution(dim.args[0], dim.args[1], log=dim.kind == "log")
        else:
            out[key] = FloatDistribution(dim.args[0], dim.args[1], log=dim.kind == "log")
    return out


def trial_seed(seed: int, number: int) -> int:
    """Trial `number`'s sampler seed: a hash of (seed, number) that fits numpy's seed (0 to 2**32 - 1)."""
    # not seed + number: seed 1 would repeat seed 0 one trial later, and a large seed would overflow numpy's range
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


def make_sampler(search: Search, number: int) -> BaseSampler:
    """The sampler that draws trial `number`: seeded from (seed, number) when a seed is given."""
    # a sampler per trial: two workers with the same seed would otherwise draw the same first values
    seed = None if search.seed is None else trial_seed(search.seed, number)
    if search.sampler == "random":
        return RandomSampler(seed=seed)
    if search.sampler == "grid":
        grid = {k: list(d.choices) for k, d in distributions(search).items() if isinstance(d, CategoricalDistribution)}
        grid.update({k: list(range(d.low, d.high + 1)) for k, d in distributions(search).items()
                     if isinstance(d, IntDistribution)})
        return _Grid(grid, seed=search.seed)  # one order of the grid for every worker
    # constant_liar off: a trial waiting at a rung is RUNNING; the liar would count it as the worst value
    return RungTPE(seed=seed, constant_liar=False)


class RungTPE(TPESampler):
    """Optuna's TPE that learns from the trials waiting at a rung, as it learns from pruned ones: each is seen as
    PRUNED at its last reported rung (TPE ranks those by the rung reached, then the value there). Optuna's TPE
    alone learns only from finished trials and starts after 10 of them, and a search's trials stay RUNNING at
    their rungs until promoted, so it would draw like the random sampler for most of a study."""

    def sample_relative(self, study, trial, search_space):
        """TPE's, over the study as `_RungView` shows it."""
        return super().sample_relative(_RungView(study), trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        """TPE's, over the study as `_RungView` shows it."""
        return super().sample_independent(_RungView(study), trial, param_name, param_distribution)


class _RungView:
    """A study whose RUNNING trials with a rung value read as PRUNED there (copies: the journal is untouched)."""

    def __init__(self, study: optuna.Study):
        self._study = study

    def __getattr__(self, name: str):
        """Everything else is the study's."""
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states=None, use_cache: bool = False) -> list:
        """The study's trials, paused ones as PRUNED, filtered by `states` after that."""
        trials = [_as_pruned(t) for t in self._study._get_trials(deepcopy=False, use_cache=use_cache)]
        return [t for t in trials if states is None or t.state in states]

    def get_trials(self, deepcopy: bool = True, states=None) -> list:
        """As _get_trials."""
        return self._get_trials(deepcopy, states)


def _as_pruned(trial: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial:
    """A RUNNING trial that reported a rung value, as a PRUNED copy; any other trial as it is."""
    if trial.state != TrialState.RUNNING or not trial.intermediate_values:
        return trial
    view = copy.copy(trial)
    view.state = TrialState.PRUNED
    return view


class _Grid(GridSampler):
    """Optuna's grid sampler without its stop at the grid's end (study.stop works only inside study.optimize)."""

    def after_trial(self, study, trial, state, values) -> None:
        """Nothing: the workers count the study's trials themselves."""


def open_study(search: Search, create: bool = True) -> optuna.Study | None:
    """The study in ROOT/study.journal, made when missing (create), checked against `search` (call under the lock)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = journal_path(search)
    if not create and not os.path.isfile(path):
        return None
    os.makedirs(search.root, exist_ok=True)
    storage = _storage(search, path)
    names = [s.study_name for s in storage.get_all_studies()]
    name = study_name(search)
    if names and name not in names:
        raise refusal(search.sweep, f"{path} holds the study {names[0]!r}, not {name!r} (was the sweep file renamed?); "
                                 "give root: another folder for a new study")
    if name not in names and not create:
        return None
    study = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                direction="maximize" if search.maximize else "minimize")
    if SETTINGS not in study.user_attrs:
        study.set_user_attr(SETTINGS, search.settings())
    check_settings(search, study)
    return study


def check_settings(search: Search, study: optuna.Study) -> None:
    """Refuse a study made with another metric, mode, space, rungs or shared config: the first difference."""
    was, now = study.user_attrs.get(SETTINGS) or {}, search.settings()
    for key in sorted(set(was) | set(now)):
        if not same_setting(key, was.get(key), now.get(key), now.get("config MODEL.PRETRAINED") == "true"):
            raise UserError(f"sweep {search.sweep.path}: search: the study in {journal_path(search)} was made with "
                            f"{key}: {was.get(key, '(none)')}, now {now.get(key, '(none)')}; change it back, or give "
                            "root: another folder for a new study")


def same_setting(key: str, was: str | None, now: str | None, pretrained: bool = False) -> bool:
    """Whether a stored study setting and today's agree: equal, or a config key the runner added since the study
    began (absent then, its default now), or a key whose default became "auto" (its old default then, auto now,
    which a run without pretrained weights resolves to that same value)."""
    from runner.config.keypath import inline_yaml, lookup
    from runner.config.schema import AUTO, AUTO_KEYS

    if was == now:
        return True
    if not key.startswith("config ") or now is None:
        return False
    name = key[len("config "):]
    if was is None:
        return now == inline_yaml(lookup(name))
    return not pretrained and name in AUTO_KEYS and now == AUTO and was == inline_yaml(AUTO_KEYS[name])


def trial_handle(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> optuna.Trial:
    """A live Trial for a trial another worker may have asked for (to report its rung values)."""
    return optuna.Trial(study, trial._trial_id)  # Optuna has no public lookup of a trial's id by its number


def _storage(search: Search, path: str) -> JournalStorage:
    """The journal as Optuna's storage; a line it cannot read or replay is one UserError naming it."""
    backend = _Journal(path, search)
    try:
        return JournalStorage(backend)  # replays the whole journal
    except REPLAY_ERRORS as e:
        raise backend.damaged(backend.line, f"is a record Optuna cannot replay ({type(e).__name__}: {e})") from None


class _Journal(BaseJournalBackend):
    """Optuna's file journal that names a damaged line, and cuts a torn last line before it appends."""

    def __init__(self, path: str, search: Search) -> None:
        self.path, self.search = path, search
        self.lock = FlockLock(path)  # the backend's own lock, held here too while the tail is cut
        self.file = JournalFileBackend(path, lock_obj=self.lock)
        self.line = 0  # the line of the last record read (1-based; one record per line)
        self.seen = (-1, -1)  # (records, file size) after the last read to the end: nothing new while both hold

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        """Optuna's records from `log_number_from` on; a bad line with lines after it is a UserError."""
        size = os.stat(self.path).st_size  # Optuna syncs before every call: a decision read the file ~15 times
        if (log_number_from, size) == self.seen:
            return
        self.line = log_number_from
        try:
            for log in self.file.read_logs(log_number_from):
                self.line += 1
                yield log
        except ValueError:  # Optuna raises a bad line's decode error once a line follows it: the bad one is next
            raise self.damaged(self.line + 1, "is not a journal record") from None
        # the size was taken before the read (a record appended meanwhile is read next time); kept only when the read
        # ended at it: records never change below a whole last line (a cut takes a torn one), so the same size
        # is the same records (Optuna's own table of where each record ends says so)
        whole = self.file._log_number_offset.get(self.line) == size
        self.seen = (self.line, size) if whole else (-1, -1)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Append `logs` in one write, after cutting a torn last line (Optuna would append to it); synced to disk
        by `sync_written` (once per decision), not per record as Optuna's backend does."""
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        with _held(self.lock):
            cut = cut_torn_tail(self.path)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, text)  # other readers see it now (same host: the page cache; NFS: at close)
            finally:
                os.close(fd)
        UNSYNCED.add(self.path)
        if cut:
            print(f"search: {self.path}: cut its torn last line ({cut} bytes; a writer stopped mid-record)",
                  file=sys.stderr, flush=True)

    def damaged(self, line: int, what: str) -> UserError:
        """The one line for a damaged journal line."""
        return refusal(self.search.sweep, f"{self.path} line {line} {what}, damaged by a crash or an edit: delete that "
                                       f"line (sed -i '{line}d' {self.path}) to keep the rest of the study, or give "
                                       "root: another folder for a new study")


class FlockLock(JournalFileOpenLock):  # its public base class: Optuna's lock interface is private
    """Optuna's journal lock as an fcntl.flock on PATH.flock, which the OS drops when its holder dies: Optuna's
    symlink and open locks are files that a writer SIGKILLed mid-append leaves behind, and every later writer then
    waits out their 30 s grace period (holding the search's lock meanwhile). Exact on one machine and on NFSv4,
    Lustre and GPFS with locking on, as ROOT/search.lock is."""

    def __init__(self, path: str) -> None:  # not Optuna's: none of its state is used
        self.path, self.fd = f"{path}.flock", None

    def acquire(self) -> bool:
        """Block until this process holds the lock."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self.fd = fd
        return True

    def release(self) -> None:
        """Let it go."""
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def sync_written() -> None:
    """fsync the journals this process appended to since the last call (a decision's records reach the disk
    together, before its lock is let go: an fsync per record cost 4 per new trial, 3 ms each, under the lock)."""
    while UNSYNCED:
        path = UNSYNCED.pop()
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


@contextlib.contextmanager
def _held(lock: FlockLock) -> Iterator[None]:
    """Optuna's journal lock held (its writers append under it)."""
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def cut_torn_tail(path: str) -> int:
    """Cut the journal's last line when it is not whole JSON (no newline, or garbage); the bytes cut (0: none)."""
    try:
        f = open(path, "rb+")
    except FileNotFoundError:
        return 0
    with f:
        size = f.seek(0, os.SEEK_END)
        start = _last_line_start(f, size)
        f.seek(start)
        last = f.read()
        if not last or last.endswith(b"\n") and _is_json(last):
            return 0
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
        return size - start


def _last_line_start(f: Any, size: int) -> int:
    """The offset where the file's last line (its final newline excluded) begins."""
    end = size - 1  # a final newline ends the last line; it does not start an empty one
    while end > 0:
        start = max(0, end - TAIL_CHUNK)
        f.seek(start)
        at = f.read(end - start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        end = start
    return 0


def _is_json(line: bytes) -> bool:
    """True when `line` decodes as JSON (what Optuna's reader asks of a line)."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
