"""Asynchronous successive halving (ASHA; Li et al., "A System for Massively Parallel Hyperparameter Tuning",
MLSys 2020, Algorithm 2), on the trials of an Optuna study.

Rungs are at min_epochs * eta^k epochs below TRAIN.EPOCHS, and the last rung is TRAIN.EPOCHS itself. A trial's
value at a rung is its intermediate value at that epoch (trial.report(value, step=epoch)). next_job, from the top
rung down: promote a trial that is in the top 1/eta of the trials recorded at that rung and not promoted yet;
else start a new trial while the study has fewer than `budget` trials. A trial waiting at a rung stays RUNNING
in the study, so it can be promoted whenever enough trials arrive below it (the paper's promotion; a stop-only
pruner cannot do this). Pure functions of the trials: the worker decides under its lock and marks the job taken.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial, TrialState

JOB = "job"  # trial user attr while a segment is owed: {"epoch": rung, "worker": "host:pid" or None, "since": time}


@dataclass(frozen=True)
class Job:
    """Train trial `number` (None: a new trial) to the end of epoch `epoch`."""

    number: int | None
    epoch: int
    why: str  # "new", "promote", "resume" (a job a stopped worker left) or "finish" (asha.finish_best)


def rungs(min_epochs: int, eta: int, epochs: int) -> tuple[int, ...]:
    """The rung epochs: min_epochs * eta^k below `epochs`, then `epochs` (the full length)."""
    out, rung = [], min_epochs
    while rung < epochs:
        out.append(rung)
        rung *= eta
    return (*out, epochs)


def reached(trial: FrozenTrial, rung_epochs: Sequence[int]) -> int:
    """The highest rung at which the trial reported a value (0: none yet)."""
    return max((r for r in rung_epochs if r in trial.intermediate_values), default=0)


def ranked(trials: Sequence[FrozenTrial], epoch: int, maximize: bool) -> list[FrozenTrial]:
    """The trials recorded at rung `epoch`, best first (ties: the earlier trial first)."""
    recorded = [t for t in trials if epoch in t.intermediate_values]
    sign = -1.0 if maximize else 1.0
    return sorted(recorded, key=lambda t: (sign * t.intermediate_values[epoch], t.number))


def promotable(trials: Sequence[FrozenTrial], rung_epochs: Sequence[int], k: int, eta: int,
               maximize: bool) -> list[FrozenTrial]:
    """Trials in the top 1/eta of rung k, waiting there (RUNNING, no job): best first."""
    board = ranked(trials, rung_epochs[k], maximize)
    top = board[: len(board) // eta]
    return [t for t in top if t.state == TrialState.RUNNING and reached(t, rung_epochs) == rung_epochs[k]
            and not t.user_attrs.get(JOB)]


def owed(trials: Sequence[FrozenTrial], live: Callable[[FrozenTrial], bool],
         first_rung: Callable[[int], int]) -> Job | None:
    """A job a worker left (its worker gone: `live` False), or a trial asked whose worker died before marking it."""
    for trial in trials:
        job = trial.user_attrs.get(JOB)
        if trial.state == TrialState.RUNNING and job and not live(trial):
            return Job(trial.number, job["epoch"], "resume")
        if trial.state == TrialState.RUNNING and not job and not trial.intermediate_values:
            return Job(trial.number, first_rung(trial.number), "resume")
    return None


def next_job(trials: Sequence[FrozenTrial], rung_epochs: Sequence[int], eta: int, maximize: bool, budget: int,
             live: Callable[[FrozenTrial], bool]) -> Job | None:
    """The next job (see the module's docstring); a job whose worker is gone (`live` False) comes first."""
    left = owed(trials, live, lambda number: rung_epochs[0])
    if left is not None:
        return left
    for k in reversed(range(len(rung_epochs) - 1)):
        found = promotable(trials, rung_epochs, k, eta, maximize)
        if found:
            return Job(found[0].number, rung_epochs[k + 1], "promote")
    if len(trials) < budget:
        return Job(None, rung_epochs[0], "new")
    return finish_best(trials, rung_epochs, maximize, live)


def finish_best(trials: Sequence[FrozenTrial], rung_epochs: Sequence[int], maximize: bool,
                live: Callable[[FrozenTrial], bool]) -> Job | None:
    """The budget is spent, nobody trains and no trial reached the full length (trials failed, so a rung's board
    stayed too short to promote): the best trial of the highest rung reached trains on to the next rung, until one
    trial reaches the full length. A study never ends without a full-length trial while one can get there."""
    if busy(trials, live) or any(t.state == TrialState.COMPLETE for t in trials):
        return None
    for k in reversed(range(len(rung_epochs) - 1)):
        waiting = [t for t in ranked(trials, rung_epochs[k], maximize)
                   if t.state == TrialState.RUNNING and reached(t, rung_epochs) == rung_epochs[k]
                   and not t.user_attrs.get(JOB)]
        if waiting:
            return Job(waiting[0].number, rung_epochs[k + 1], "finish")
    return None


def busy(trials: Sequence[FrozenTrial], live: Callable[[FrozenTrial], bool]) -> bool:
    """True while some worker trains a trial (it may still reach a rung and make a promotion due)."""
    return any(t.state == TrialState.RUNNING and t.user_attrs.get(JOB) and live(t) for t in trials)


@dataclass(frozen=True)
class Asha:
    """ASHA as a scheduler (runner.sweep.schedulers): one bracket, every trial from the first rung."""

    rungs: tuple[int, ...]
    eta: int
    maximize: bool
    budget: int

    def next_job(self, trials: Sequence[FrozenTrial], live: Callable[[FrozenTrial], bool]) -> Job | None:
        """next_job over this study's rungs."""
        return next_job(trials, self.rungs, self.eta, self.maximize, self.budget, live)

    def first_rung(self, number: int) -> int:
        """Every trial starts at the first rung."""
        return self.rungs[0]

    def least_trials(self) -> int:
        """The fewest trials of which one is sure to reach the last rung."""
        # rung k promotes the top len(board) // eta: in the worst order of values rung k gets trials // eta**k
        # trials (fewer than eta never promote at all; between, it depends on the order the values arrive in)
        return self.eta ** (len(self.rungs) - 1)


def build(rungs: tuple[int, ...], eta: int, maximize: bool, budget: int) -> Asha:
    """The scheduler for `search: scheduler: asha` (the default)."""
    return Asha(tuple(rungs), eta, maximize, budget)
