"""Asynchronous Hyperband (Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys 2020,
section 3.3; Syne Tune's and Ray Tune's async Hyperband): the rungs of ASHA, and brackets that start at each of
them. Bracket b trains its trials to rungs[b] first and promotes the top 1/eta of its own trials at each rung
above; the last bracket trains its trials to the full length at once. New trials are dealt over the brackets in
Hyperband's proportions (bracket b of R rungs gets about (s + 1) / R x eta^(R - 1) trials per round, s + 1 the
number of brackets), by the trial's number alone, so the deal is the same on every worker and after a re-run.

It hedges ASHA's one bet, that the first rung ranks trials as their end would: a first rung mid-way through a long
cosine schedule ranks mostly noise, and there the brackets that start later find what ASHA drops.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial

from runner.sweep.asha import Job, finish_best, owed, promotable


def shares(brackets: int, eta: int) -> list[int]:
    """Hyperband's trials per bracket in one round: bracket b (of brackets - b rungs) gets ceil(n / R x eta^(R-1))."""
    return [math.ceil(brackets / (brackets - b) * eta ** (brackets - b - 1)) for b in range(brackets)]


def deal(shares_: Sequence[int]) -> list[int]:
    """One round of brackets, interleaved in proportion (smooth weighted round robin): e.g. [9, 5, 3] -> 17 slots."""
    total, credit, order = sum(shares_), [0] * len(shares_), []
    for _ in range(total):
        credit = [c + w for c, w in zip(credit, shares_, strict=True)]
        pick = max(range(len(shares_)), key=lambda b: (credit[b], -b))
        credit[pick] -= total
        order.append(pick)
    return order


@dataclass(frozen=True)
class Hyperband:
    """The scheduler for `search: scheduler: hyperband`."""

    rungs: tuple[int, ...]
    eta: int
    maximize: bool
    budget: int
    order: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        """The round of brackets, once."""
        object.__setattr__(self, "order", tuple(deal(shares(len(self.rungs), self.eta))))

    def bracket(self, number: int) -> int:
        """The bracket of trial `number`: the index of the rung it starts at."""
        return self.order[number % len(self.order)]

    def first_rung(self, number: int) -> int:
        """The epoch to which trial `number` trains first: its bracket's first rung."""
        return self.rungs[self.bracket(number)]

    def least_trials(self) -> int:
        """The fewest trials of which one is sure to reach the last rung: the first one dealt to the last bracket."""
        return self.order.index(len(self.rungs) - 1) + 1

    def next_job(self, trials: Sequence[FrozenTrial], live: Callable[[FrozenTrial], bool]) -> Job | None:
        """A left job first; then a promotion within a bracket, from the top rung down; then a new trial."""
        left = owed(trials, live, self.first_rung)
        if left is not None:
            return left
        for k in reversed(range(len(self.rungs) - 1)):
            for b in range(k + 1):
                mine = [t for t in trials if self.bracket(t.number) == b]
                found = promotable(mine, self.rungs, k, self.eta, self.maximize)
                if found:
                    return Job(found[0].number, self.rungs[k + 1], "promote")
        if len(trials) < self.budget:
            return Job(None, self.first_rung(len(trials)), "new")
        return finish_best(trials, self.rungs, self.maximize, live)


def build(rungs: tuple[int, ...], eta: int, maximize: bool, budget: int) -> Hyperband:
    """The scheduler (runner.sweep.schedulers)."""
    return Hyperband(tuple(rungs), eta, maximize, budget)
