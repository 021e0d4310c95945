"""The search's table: one row per trial (its sampled keys, the rung it reached, its metric there, its state), best
first, and the best trial's command, ready to copy."""
from __future__ import annotations

import os
import time

import optuna
from optuna.trial import FrozenTrial, TrialState

from runner.rundir.layout import CONFIG
from runner.sweep import asha
from runner.sweep.search import Search
from runner.sweep.worker import live


def state_word(search: Search, trial: FrozenTrial, now: float) -> str:
    """done, training, paused, to resume, stopped (never promoted), failed (with why)."""
    if trial.state == TrialState.COMPLETE:
        return "done"
    if trial.state == TrialState.PRUNED:
        return "stopped"
    if trial.state == TrialState.FAIL:
        return f"failed ({trial.user_attrs.get('error', 'no reason recorded')})"
    job = trial.user_attrs.get(asha.JOB)
    if job:
        return f"training to {job['epoch']}" if live(search, trial, now) else f"to resume (to {job['epoch']})"
    return "paused" if trial.intermediate_values else "to start"


def row(search: Search, trial: FrozenTrial, now: float) -> dict[str, str]:
    """One trial's cells."""
    epoch = asha.reached(trial, search.rungs)
    value = trial.intermediate_values.get(epoch) if epoch else None
    cells = {"trial": str(trial.number)}
    cells.update({key: _text(trial.params.get(key)) for key in search.space})
    cells.update({"epoch": str(epoch or "-"), search.metric: "-" if value is None else f"{value:.4f}",
                  "state": state_word(search, trial, now)})
    return cells


def ordered(search: Search, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Highest rung first, then the best metric there; trials without a value last."""
    sign = -1.0 if search.maximize else 1.0

    def key(t: FrozenTrial) -> tuple:
        epoch = asha.reached(t, search.rungs)
        return (-epoch, sign * t.intermediate_values[epoch] if epoch else 0.0, t.number)

    return sorted(trials, key=key)


def best(search: Search, study: optuna.Study) -> FrozenTrial | None:
    """The best trial trained to the full length, or None."""
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    return ordered(search, done)[0] if done else None


def render(search: Search, study: optuna.Study) -> str:
    """The table as aligned text, then the best trial's command."""
    trials = ordered(search, study.get_trials(deepcopy=False))
    top = best(search, study)
    rows = [row(search, t, time.time()) for t in trials]
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
    config = os.path.join(search.trial_dir(top.number), CONFIG)
    return (f"{head}\nbest: trial {top.number}, {search.metric} {top.value:.4f}; train it again with:\n"
            f"  python tools/train.py --cfg {config}")


def _text(value) -> str:
    """A sampled value as a cell (floats to 4 significant digits)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
