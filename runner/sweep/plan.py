"""`python -m runner.sweep plan FILE [KEY VALUE ...]`: what a search will do, with nothing trained: its scheduler and
rungs, how many trials reach each rung, and the most epochs it trains against its trials trained to the end.

The counts are successive halving's, synchronous (rung k keeps the top 1/eta of rung k - 1's trials, per group of
trials that start at the same rung): an asynchronous scheduler may promote a few more early, when a rung's board
is short, so the figures are "about" and a floor of what the study trains when nothing fails.
"""
from __future__ import annotations

import os
from collections import Counter

from runner.sweep.search import Search
from runner.sweep.study import journal_path


def reach(search: Search) -> list[int]:
    """How many trials train to each rung (rung order), synchronous successive halving per starting rung."""
    scheduler = search.schedule()
    starts = Counter(search.rungs.index(scheduler.first_rung(n)) for n in range(search.trials))
    out = [0] * len(search.rungs)
    for first, count in starts.items():
        for k in range(first, len(search.rungs)):
            out[k] += count
            count //= search.eta
    return out


def epochs(search: Search, counts: list[int]) -> int:
    """The epochs trained when `counts[k]` trials train to rung k (each rung's stretch counted once per trial)."""
    bounds = (0, *search.rungs)
    return sum(n * (bounds[k + 1] - bounds[k]) for k, n in enumerate(counts))


def render_plan(search: Search) -> str:
    """The plan, as lines of text."""
    counts = reach(search)
    full = search.trials * search.rungs[-1]
    spent = epochs(search, counts)
    seed = "none" if search.seed is None else str(search.seed)
    journal = journal_path(search)
    study = f"{journal} (exists: a run continues it)" if os.path.isfile(journal) else f"{journal} (new)"
    lines = [
        f"search {search.sweep.path}: nothing is trained by plan",
        f"  scheduler {search.scheduler}, eta {search.eta}, rungs at epochs {list(search.rungs)} (the last: "
        f"TRAIN.EPOCHS); metric {search.metric} ({search.mode}); sampler {search.sampler}, seed {seed}",
        f"  trials {search.trials}: " + ", ".join(f"{n} to epoch {r}" for n, r in zip(counts, search.rungs,
                                                                                    strict=True)),
        f"  epochs: about {spent} (synchronous successive halving; asynchronous promotions may add a few), against "
        f"{full} for the {search.trials} trials trained to the end ({100 * spent / full:.0f}%)",
        f"  keys searched: {', '.join(f'{k} {d.text()}' for k, d in search.space.items())}",
        f"  study: {study}",
    ]
    return "\n".join(lines)
