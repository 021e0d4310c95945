"""The search's schedulers: what to train next (start a trial, promote one, resume one a stopped worker left),
decided from the study's trials alone; the worker runs the segments. A scheduler is a module with
`build(rungs, eta, maximize, budget) -> Scheduler` and one line here that registers it (a user's module, named in
the config's IMPORTS, can call `register` too).

    asha        asynchronous successive halving (Li et al., MLSys 2020): one bracket from the first rung
    hyperband   asynchronous Hyperband: trials dealt over brackets that start at each rung, ASHA within each, so
                some trials train to the full length with no early rung (a hedge against a first rung that ranks
                noise, as early epochs of a long cosine schedule do)
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Protocol

from optuna.trial import FrozenTrial

from runner.sweep.asha import Job

SCHEDULERS: dict[str, str] = {}  # name -> module


def register(name: str, module: str) -> None:
    """Make `search: scheduler: NAME` mean the module's build()."""
    SCHEDULERS[name] = module


class Scheduler(Protocol):
    """What a scheduler answers, from the study's trials (a pure function of them: workers decide under a lock)."""

    rungs: tuple[int, ...]  # every epoch at which a trial may pause and report (the last: the full length)

    def next_job(self, trials: Sequence[FrozenTrial], live: Callable[[FrozenTrial], bool]) -> Job | None:
        """The next job, or None when nothing is due now."""

    def first_rung(self, number: int) -> int:
        """The epoch to which new trial `number` trains before its first report."""

    def least_trials(self) -> int:
        """The fewest trials with which one is sure to reach the last rung (fewer are refused before a search)."""


def build(name: str, rungs: tuple[int, ...], eta: int, maximize: bool, budget: int) -> Scheduler:
    """The registered scheduler `name` for these rungs, eta, direction and number of trials."""
    return importlib.import_module(SCHEDULERS[name]).build(rungs, eta, maximize, budget)


register("asha", "runner.sweep.asha")
register("hyperband", "runner.sweep.hyperband")
