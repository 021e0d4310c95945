"""The search's table: one row per trial (its sampled keys, the rung it reached, its metric there, its state), best
first, and the best trial's command, ready to copy.

One answer and one vocabulary for this table, ROOT/report.html and tools/summarize.py (through `trial_views`):
- the best trial is one trained to the full length (COMPLETE), by its metric at the last rung (TRAIN.EPOCHS), the
  earlier trial first on a tie (as asha.ranked ranks a rung); a non-finite metric never wins;
- a trial's state is one of STATES: done, training, paused (waits at a rung while the search goes on: it may still be
  promoted), stopped (left at its rung: the search has nothing more to do, Optuna's PRUNED in studies settled by
  earlier versions), failed, to resume (its worker stopped: the next worker goes on with it), to start.
  The table knows the budget (`trials`) and says stopped when no job is left (no next_job, nobody training);
  tools/summarize.py, which reads the study alone, says it when nothing of the study is training or owed.
"""
from __future__ import annotations

import functools
import itertools
import math
import os
import re
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from runner.rundir.layout import CONFIG, ENV
from runner.sweep import asha, worker
from runner.sweep.search import TRIAL_PREFIX, Search
from runner.sweep.summary import TrialView
from runner.sweep.worker import live

STATES = ("done", "training", "paused", "stopped", "failed", "to resume", "to start")
_NPROC = re.compile(r" --nproc_per_node=(\d+) ")
AGAIN = "_again"  # ROOT/trial_N_again: where the printed command trains trial N again
# env.txt's line of the intra-op thread count the run computed with (written after a resume took its checkpoint's)
_THREADS_LINE = re.compile(r"^torch threads\s+(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class StudyRoot:
    """A search read from its root folder alone (tools/summarize.py has no sweep file): the study's settings."""

    root: str
    metric: str
    mode: str
    rungs: tuple[int, ...]

    @property
    def maximize(self) -> bool:
        """True when a larger metric is better."""
        return self.mode == "max"

    def trial_dir(self, number: int) -> str:
        """The run folder of trial `number`."""
        return os.path.join(self.root, f"{TRIAL_PREFIX}{number}")


def trial_state(trial: FrozenTrial, rungs: Sequence[int], is_live: Callable[[FrozenTrial], bool],
                ended: bool) -> tuple[str, str]:
    """(state, detail): one of STATES and what it waits for or why (the words every view of a search uses);
    `ended`: the search has nothing more to do (a trial waiting at a rung then stays there)."""
    epoch = asha.reached(trial, rungs)
    if trial.state == TrialState.COMPLETE:
        return "done", ""
    if trial.state == TrialState.FAIL:
        return "failed", str(trial.user_attrs.get("error", "no reason recorded"))
    job = trial.user_attrs.get(asha.JOB)
    if trial.state == TrialState.RUNNING and job:
        return ("training" if is_live(trial) else "to resume"), f"to epoch {job['epoch']}"
    if trial.state == TrialState.RUNNING and not trial.intermediate_values:
        return "to start", ""
    if trial.state == TrialState.PRUNED or ended:
        return "stopped", f"at epoch {epoch}, not promoted" if epoch else "before its first rung"
    return "paused", f"at epoch {epoch}, may be promoted"


def ended_with_budget(search: Search, trials: Sequence[FrozenTrial], is_live: Callable[[FrozenTrial], bool]) -> bool:
    """True when the search has nothing more to do: no job to hand out (its scheduler's), nobody training."""
    return not asha.busy(trials, is_live) and search.schedule().next_job(trials, is_live) is None


def idle(trials: Sequence[FrozenTrial]) -> bool:
    """True when nothing of the study is training or owed: no trial holds a job or waits to start (the budget
    unknown, as for tools/summarize.py: a finished search looks so)."""
    return not any(t.state == TrialState.RUNNING and (t.user_attrs.get(asha.JOB) or not t.intermediate_values)
                   for t in trials)


def state_text(state: str, detail: str) -> str:
    """A state and its detail as one cell: 'stopped (at epoch 1, not promoted)'."""
    return f"{state} ({detail})" if detail else state


def row(search: Search, trial: FrozenTrial, is_live: Callable[[FrozenTrial], bool], ended: bool) -> dict[str, str]:
    """One trial's cells."""
    epoch, value = rung_value(search, trial)
    cells = {"trial": str(trial.number)}
    cells.update({key: _text(trial.params.get(key)) for key in search.space})
    cells.update({"epoch": str(epoch or "-"), search.metric: "-" if value is None else f"{value:.4f}",
                  "state": state_text(*trial_state(trial, search.rungs, is_live, ended))})
    return cells


def rung_value(search: Search | StudyRoot, trial: FrozenTrial) -> tuple[int, float | None]:
    """(the highest rung the trial reached, its metric there; 0 and None before its first rung)."""
    epoch = asha.reached(trial, search.rungs)
    return epoch, trial.intermediate_values.get(epoch) if epoch else None


def ordered(search: Search | StudyRoot, trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Highest rung first, then the best metric there (non-finite ones last), then the earlier trial."""
    sign = -1.0 if search.maximize else 1.0

    def key(t: FrozenTrial) -> tuple:
        epoch, value = rung_value(search, t)
        finite = value is not None and math.isfinite(value)
        return (-epoch, not finite, sign * value if finite else 0.0, t.number)

    return sorted(trials, key=key)


def best(search: Search | StudyRoot, trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The search's answer: the best trial trained to the full length with a finite metric there, or None."""
    done = [t for t in trials if t.state == TrialState.COMPLETE and rung_value(search, t)[0] == search.rungs[-1]
            and math.isfinite(rung_value(search, t)[1])]
    return ordered(search, done)[0] if done else None


def render(search: Search, study: optuna.Study) -> str:
    """The table as aligned text, then the best trial's command."""
    trials = ordered(search, study.get_trials(deepcopy=False))
    top = best(search, trials)
    is_live = functools.partial(live, search, now=time.time())
    ended = ended_with_budget(search, trials, is_live)
    rows = [row(search, t, is_live, ended) for t in trials]
    header = list(rows[0]) if rows else ["trial", *search.space, "epoch", search.metric, "state"]
    for cells, trial in zip(rows, trials, strict=True):
        cells["trial"] += " *" if top is not None and trial.number == top.number else ""
    widths = [max([len(h), *(len(r[h]) for r in rows)]) for h in header]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(r[h].ljust(w) for h, w in zip(header, widths, strict=True)).rstrip() for r in rows]
    lines.append(_summary(search, trials, top))
    return "\n".join(lines)


def _summary(search: Search, trials: list[FrozenTrial], top: FrozenTrial | None) -> str:
    """The closing lines: trials done of the budget, rungs, and the best trial's command."""
    epochs = sum(asha.reached(t, search.rungs) for t in trials)
    head = (f"{len(trials)} of {search.trials} trials; rungs at epochs {list(search.rungs)}; about {epochs} epochs "
            f"trained (rungs reached)")
    if top is None:
        return f"{head}\nno trial has trained to the full length yet"
    return f"{head}\n{best_line(search, top)}"


def best_line(search: Search | StudyRoot, top: FrozenTrial) -> str:
    """'best: trial N, METRIC V at epoch E (the full length)' and the command that trains it again, bit-identical."""
    value = rung_value(search, top)[1]
    return (f"best: trial {top.number}, {search.metric} {value:.4f} at epoch {search.rungs[-1]} (the full length); "
            f"train it again (bit-identical, into a new folder) with:\n  {reproduce_command(search, top.number)}")


def reproduce_command(search: Search | StudyRoot, number: int) -> str:
    """tools/train.py on the trial's config.yaml into a fresh folder, with the CPU thread count the trial used."""
    # CPU kernels split their reductions by thread: another count gives other numbers (runner/process/threads.py)
    threads = trial_threads(search.trial_dir(number))
    nproc = trial_nproc(search.trial_dir(number))  # the global batch is DATA.BATCH_SIZE x processes
    launch = ["torchrun", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else ["python"]
    argv = [*launch, "tools/train.py", "--cfg", os.path.join(search.trial_dir(number), CONFIG),
            "OUTPUT_DIR", again_dir(search, number)]
    return (f"OMP_NUM_THREADS={threads} " if threads else "") + shlex.join(argv)


def trial_nproc(folder: str) -> int:
    """The processes per segment the trial trained with (`search --nproc`): its latest segment's header in
    ROOT/logs/trial_N.log names torchrun's --nproc_per_node; 1 without one."""
    log = Path(folder).parent / "logs" / f"{Path(folder).name}.log"
    try:
        headers = [x for x in log.read_text(errors="replace").splitlines() if x.startswith(worker.HEADER)]
    except OSError:
        return 1
    found = _NPROC.search(headers[-1]) if headers else None
    return int(found.group(1)) if found else 1


def again_dir(search: Search | StudyRoot, number: int) -> str:
    """ROOT/trial_N_again, or _again2, _again3, ...: the first that does not exist (a done one would train nothing)."""
    base = search.trial_dir(number) + AGAIN
    names = (base if i == 1 else f"{base}{i}" for i in itertools.count(1))
    return next(name for name in names if not os.path.exists(name))


def trial_threads(folder: str) -> int | None:
    """The intra-op CPU thread count a trial computed with, from its env.txt; None where it has none."""
    try:
        found = _THREADS_LINE.search(Path(folder, ENV).read_text(errors="replace"))
    except OSError:
        return None
    return int(found.group(1)) if found else None


def read_study(root: str) -> tuple[StudyRoot, list[FrozenTrial]]:
    """The study in ROOT/study.journal, read from the folder alone: its settings and trials (raises on a bad one)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from runner.sweep.study import JOURNAL, SETTINGS

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(os.path.join(root, JOURNAL)))
    names = [s.study_name for s in storage.get_all_studies()]
    if len(names) != 1:
        raise ValueError(f"it holds {len(names)} studies, not one")
    study = optuna.load_study(study_name=names[0], storage=storage)
    settings = study.user_attrs.get(SETTINGS) or {}
    rungs = yaml.safe_load(str(settings.get("rungs", "")))
    if not settings.get("metric") or not isinstance(rungs, list) or not rungs:
        raise ValueError("its study keeps no metric or rungs (not a study of runner.sweep)")
    found = StudyRoot(root, settings["metric"], settings.get("mode", "max"), tuple(int(r) for r in rungs))
    return found, study.get_trials(deepcopy=False)


def trial_views(root: str, now: float | None = None) -> dict[str, TrialView]:
    """Trial folder name -> what the study says of it (state, rung, metric, rank, best): tools/summarize.py's view."""
    found, trials = read_study(root)
    now = time.time() if now is None else now
    is_live = functools.partial(live, found, now=now)
    top, ended = best(found, trials), idle(trials)
    views = {}
    for rank, trial in enumerate(ordered(found, trials)):
        epoch, value = rung_value(found, trial)
        state, detail = trial_state(trial, found.rungs, is_live, ended)
        views[os.path.basename(found.trial_dir(trial.number))] = TrialView(
            state, detail, epoch, value, found.metric, rank, top is not None and trial.number == top.number,
            best_line(found, trial) if top is not None and trial.number == top.number else "")
    return views


def _text(value) -> str:
    """A sampled value as a cell (floats to 4 significant digits)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
