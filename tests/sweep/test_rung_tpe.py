"""The search's TPE learns from trials waiting at a rung (RUNNING, with a rung value), which Optuna's TPE alone
ignores until 10 trials have finished: on a real journal, the draws of `runner.sweep.study.RungTPE` after 12 paused
trials move to where the rung values are good, while Optuna's TPE still draws what its random sampler draws."""
from __future__ import annotations

import math

from optuna.samplers import RandomSampler, TPESampler

from runner.sweep import worker
from runner.sweep.search import load_search
from runner.sweep.study import RungTPE, distributions, open_study
from tests.sweep.test_search import search_file


def paused_study(tmp_path):
    """A search's study with 12 trials paused at rung 1: val/top1 best at TRAIN.LR 1e-2 (log scale)."""
    search = load_search(str(search_file(tmp_path, "trials: 40\nasha: {eta: 3, min_epochs: 1}\n", epochs=9)))
    with worker.locked(search.root):
        study = open_study(search)
    study.sampler = RandomSampler(seed=0)
    for _ in range(12):
        trial = study.ask(distributions(search))
        trial.report(90.0 - 10.0 * abs(math.log10(trial.params["TRAIN.LR"]) + 2.0), step=1)
    return search, study


def draw(search, study, sampler) -> float:
    """The TRAIN.LR that `sampler` draws for the study's next trial (the trial is left asked)."""
    study.sampler = sampler
    return study.ask(distributions(search)).params["TRAIN.LR"]


def test_tpe_learns_from_paused_trials(tmp_path):
    search, study = paused_study(tmp_path)
    seeds = range(12)
    random = [draw(search, study, RandomSampler(seed=s)) for s in seeds]
    plain = [draw(search, study, TPESampler(seed=s)) for s in seeds]
    rung = [draw(search, study, RungTPE(seed=s)) for s in seeds]
    assert plain == random  # the precondition: Optuna's TPE alone sees no finished trial and draws at random
    assert rung != random

    def miss(lrs: list[float]) -> float:
        """Mean distance of the draws from the best LR, in decades."""
        return sum(abs(math.log10(x) + 2.0) for x in lrs) / len(lrs)

    assert miss(rung) < 0.6 * miss(random), (miss(rung), miss(random))
    assert all(t.state.name == "RUNNING" for t in study.get_trials())  # the journal itself is untouched
