"""The search's schedulers (runner/sweep/schedulers.py): ASHA and asynchronous Hyperband behind one interface, a
scheduler of the user's own registered with one line, and the checks made before a search with either. The
trainer is tests/sweep/fake_train.py (no torch), on a real Optuna journal."""
from __future__ import annotations

from collections import Counter

import pytest
from optuna.trial import TrialState

from runner.sweep import schedulers, worker
from runner.sweep.hyperband import Hyperband, deal, shares
from runner.sweep.search import load_search
from runner.sweep.study import open_study
from tests.sweep.test_search import refused, search_file


def hyperband_search(tmp_path, trials: int, more: str = ""):
    """Hyperband over rungs 1, 3, 9 (eta 3, 9 epochs), seeded."""
    text = f"trials: {trials}\nseed: 3\nscheduler: hyperband\nasha: {{eta: 3, min_epochs: 1}}\n{more}"
    return load_search(str(search_file(tmp_path, text, epochs=9)))


def test_the_deal_follows_hyperbands_proportions():
    assert shares(3, 3) == [9, 5, 3] and shares(2, 2) == [2, 2] and shares(1, 3) == [1]
    order = deal([9, 5, 3])
    assert Counter(order) == {0: 9, 1: 5, 2: 3} and order[:4] == [0, 1, 0, 2]
    band = Hyperband((1, 3, 9), 3, True, 17)
    assert [band.first_rung(n) for n in range(4)] == [1, 3, 1, 9]
    assert band.first_rung(17) == band.first_rung(0)  # the next round deals the same way
    assert band.least_trials() == 4


def test_hyperband_promotes_within_each_bracket(tmp_path, fake):
    search = hyperband_search(tmp_path, 17)
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    trials = open_study(search, create=False).get_trials()
    band = schedulers.build("hyperband", search.rungs, search.eta, True, search.trials)
    assert len(trials) == 17
    for t in trials:  # each trial first reports at its bracket's first rung
        assert min(t.intermediate_values) == band.first_rung(t.number), (t.number, t.intermediate_values)
    for k, (low, high) in enumerate(zip(search.rungs, search.rungs[1:], strict=False)):
        for b in range(k + 1):
            mine = [t for t in trials if band.bracket(t.number) == b and low in t.intermediate_values]
            top = sorted(mine, key=lambda t: (-t.intermediate_values[low], t.number))[: len(mine) // search.eta]
            promoted = {t.number for t in mine if high in t.intermediate_values}
            # asynchronous: a trial promoted while the bracket's board was short may have dropped out of its top
            # since, but at the end every trial in the top 1/eta of its own bracket has been promoted
            assert {t.number for t in top} <= promoted, (b, low, promoted)
    straight = [t for t in trials if band.bracket(t.number) == 2]
    assert len(straight) == 3 and all(sorted(t.intermediate_values) == [9] for t in straight)
    assert all(t.state == TrialState.COMPLETE for t in straight)


def test_too_few_trials_for_the_last_bracket_are_refused(tmp_path):
    path = search_file(tmp_path, "trials: 3\nscheduler: hyperband\nasha: {eta: 3, min_epochs: 1}\n", epochs=9)
    refused(path, "trials 3 may end with no trial at the full length", "from 4 trials on")
    refused(search_file(tmp_path, "trials: 4\nscheduler: pbt\n"), "scheduler 'pbt'", "asha, hyperband")


def test_the_scheduler_is_kept_by_the_study(tmp_path, fake):
    search = hyperband_search(tmp_path, 4)
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    path = search_file(tmp_path, "trials: 9\nseed: 3\nasha: {eta: 3, min_epochs: 1}\n", epochs=9)
    with pytest.raises(Exception, match="was made with scheduler: hyperband, now"):
        with worker.locked(search.root):
            open_study(load_search(str(path)))


TOY = '''
from runner.sweep import schedulers
from runner.sweep.asha import Asha, Job


class Straight(Asha):
    """Every trial to the full length at once (no early rung)."""

    def first_rung(self, number):
        return self.rungs[-1]

    def least_trials(self):
        return 1

    def next_job(self, trials, live):
        if len(trials) < self.budget:
            return Job(None, self.rungs[-1], "new")
        return None


def build(rungs, eta, maximize, budget):
    return Straight(tuple(rungs), eta, maximize, budget)


schedulers.register("straight", __name__)
'''


def test_a_scheduler_of_ones_own_is_one_module_and_one_line(tmp_path, fake):
    (tmp_path / "straight.py").write_text(TOY)
    search = load_search(str(search_file(
        tmp_path, "trials: 2\nseed: 1\nscheduler: straight\nasha: {eta: 3, min_epochs: 1}\n", epochs=3)),
        ["IMPORTS", f"[{tmp_path / 'straight.py'}]"])
    assert search.scheduler == "straight"
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    trials = open_study(search, create=False).get_trials()
    assert [sorted(t.intermediate_values) for t in trials] == [[3], [3]]
