"""runner.sweep's search: `search:` checked before anything trains, the ASHA rungs and promotions on a real Optuna
journal, the lock between workers, continuing and refusing a study, the worker loop with a stand-in trainer
(tests/sweep/fake_train.py, no torch), and one end-to-end search on the digits."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from optuna.trial import TrialState

from runner.errors import UserError
from runner.sweep import asha, worker
from runner.sweep.asha import Job, next_job, rungs
from runner.sweep.report import write_report
from runner.sweep.search import load_search
from runner.sweep.study import distributions, open_study, trial_handle
from runner.sweep.table import render

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs/digits/test_resnet.yaml"
FAKE = Path(__file__).resolve().parent / "fake_train.py"
SPACE = "    TRAIN.LR: {log: [1.0e-4, 1.0]}\n"


def search_file(tmp_path: Path, search: str = "", space: str = SPACE, name: str = "s.yaml",
                epochs: int = 3) -> Path:
    """A sweep file on the digits config with a search: section (`search` lines, then `space`)."""
    body = (f"cfg: {DIGITS}\nroot: out\nset: {{TRAIN.EPOCHS: {epochs}, DATA.IMG_SIZE: 16}}\nsearch:\n"
            + textwrap.indent(textwrap.dedent(search), "  ") + "  space:\n" + space)
    path = tmp_path / name
    path.write_text(body)
    return path


def refused(path: Path, *match: str, extra: tuple[str, ...] = ()) -> str:
    """load_search's one-line UserError for `path`, checked to contain each of `match`."""
    with pytest.raises(UserError) as e:
        load_search(str(path), extra)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"sweep {path}"), text
    for m in match:
        assert m in text, text
    return text


# ---------------------------------------------------------------------------------------------------------------
# search: checked before anything trains
# ---------------------------------------------------------------------------------------------------------------
def test_defaults_and_kinds(tmp_path):
    space = ("    TRAIN.LR: {log: [1.0e-4, 1.0]}\n    TRAIN.WEIGHT_DECAY: {int: [0, 1]}\n"
             "    DATA.BATCH_SIZE: {log: [16, 128]}\n    AUG.SCALE: {choice: [[0.08, 1.0], [0.5, 1.0]]}\n")
    s = load_search(str(search_file(tmp_path, "trials: 5\n", space)))
    assert (s.metric, s.mode, s.sampler, s.trials, s.rungs) == ("val/top1", "max", "tpe", 5, (3,))
    dists = distributions(s)
    assert dists["DATA.BATCH_SIZE"].log and dists["TRAIN.WEIGHT_DECAY"].high == 1
    argv = s.argv({"TRAIN.LR": 0.01, "TRAIN.WEIGHT_DECAY": 1, "DATA.BATCH_SIZE": 32, "AUG.SCALE": "[0.5, 1.0]"},
                  s.trial_dir(7))
    assert argv[-10:] == ["TRAIN.LR", "0.01", "TRAIN.WEIGHT_DECAY", "1.0", "DATA.BATCH_SIZE", "32",
                          "AUG.SCALE", "[0.5, 1.0]", "OUTPUT_DIR", str(tmp_path / "out" / "trial_7")]
    loss = load_search(str(search_file(tmp_path, "trials: 2\nmetric: val/loss\n")))
    assert loss.mode == "min"


def test_a_range_takes_exponents_without_a_dot(tmp_path):
    # PyYAML (YAML 1.1) reads 1e-5 as text; a config file's TRAIN.LR takes it as a number, and so does a range
    space = "    TRAIN.LR: {log: [1e-5, 1]}\n    TRAIN.WEIGHT_DECAY: {uniform: [+1E-6, 2e+1]}\n"
    s = load_search(str(search_file(tmp_path, "trials: 2\n", space)))
    assert s.space["TRAIN.LR"].args == (1e-5, 1.0) and s.space["TRAIN.WEIGHT_DECAY"].args == (1e-6, 20.0)
    refused(search_file(tmp_path, "trials: 2\n", "    TRAIN.LR: {log: [1e-5, 1e-x]}\n"), "two numbers")


@pytest.mark.parametrize("search, space, match", [
    ("trials: 2\n", "    TRAIN.LRR: {log: [0.1, 1]}\n", ["unknown config key TRAIN.LRR", "TRAIN.LR"]),
    ("trials: 2\n", "    TRAIN.LR: {log: [0, 1]}\n", ["TRAIN.LR: log: lo must be above 0"]),
    ("trials: 2\n", "    TRAIN.LR: {log: [1, 0.1]}\n", ["lo must be below hi"]),
    ("trials: 2\n", "    DATA.BATCH_SIZE: {uniform: [16, 64]}\n", ["DATA.BATCH_SIZE (int", "int or log", "uniform"]),
    ("trials: 2\n", "    DATA.BATCH_SIZE: {int: [16.5, 64]}\n", ["whole numbers"]),
    ("trials: 2\n", "    MODEL.NAME: {uniform: [1, 2]}\n", ["MODEL.NAME (str", "choice"]),
    ("trials: 2\n", "    TRAIN.EMA: {choice: [true, maybe]}\n", ["TRAIN.EMA: choice:", "maybe"]),
    ("trials: 2\n", "    TRAIN.LR: {normal: [0, 1]}\n", ["TRAIN.LR: give one of"]),
    ("trials: 2\n", "    TRAIN.EPOCHS: {int: [1, 3]}\n", ["TRAIN.EPOCHS sets the trials' length"]),
    ("trials: 2\n", "    TRAIN.OPTIMIZER: {choice: [adamw, nosuchopt]}\n", ["TRAIN.OPTIMIZER = nosuchopt"]),
    ("trials: 2\n", "    TRAIN.LR: {uniform: [-1, 1]}\n", ["TRAIN.LR = -1.0"]),
    ("trials: 2\nmetric: val/acc\n", SPACE, ["metric 'val/acc' is not logged", "val/top1", "TRAIN.EMA"]),
    ("trials: 2\nmetric: val_ema/top1\n", SPACE, ["metric 'val_ema/top1'"]),
    ("trials: 2\nmode: up\n", SPACE, ["mode 'up'"]),
    ("trials: 2\nasha: {eta: 1}\n", SPACE, ["asha: eta must be a whole number of at least 2"]),
    ("trials: 2\nasha: {min_epochs: 0}\n", SPACE, ["min_epochs must be a whole number of at least 1"]),
    ("trials: 2\nasha: {min_epochs: 4}\n", SPACE, ["min_epochs 4 is above TRAIN.EPOCHS 3"]),
    ("trials: 2\nasha: {eta: 3, grace: 1}\n", SPACE, ["asha: give {eta: 3, min_epochs: E}"]),
    ("trials: 2\nsampler: grid\n", SPACE, ["sampler grid takes choice and int ranges only; TRAIN.LR"]),
    ("trials: 5\nsampler: grid\n", "    MODEL.NAME: {choice: [a, b]}\n", ["trials 5 is more than the grid's 2"]),
    ("trials: 0\n", SPACE, ["trials must be a whole number of at least 1"]),
    ("", SPACE, ["trials: give the number of trials"]),
    ("trials: 2\nbudget: 3\n", SPACE, ["unknown key 'budget'"]),
    ("trials: 2\nseed: 4294967296\n", SPACE, ["seed 4294967296 is above 4294967295"]),
    ("trials: 2\nseed: -1\n", SPACE, ["seed must be a whole number of at least 0, got -1"]),
    ("trials: 2\nseed: 0.5\n", SPACE, ["seed must be a whole number"]),
])
def test_mistakes_are_one_line(tmp_path, search, space, match):
    refused(search_file(tmp_path, search, space), *match)


def first_draws(search, trials: int = 4) -> list[dict]:
    """The params of a study's first `trials` trials, each asked with its own sampler as a worker asks it."""
    import optuna

    from runner.sweep.study import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    draws = []
    for number in range(trials):
        study.sampler = make_sampler(search, number)
        trial = study.ask(distributions(search))
        study.tell(trial, float(number))  # a finished trial: the next draw may depend on it (TPE), as in a study
        draws.append(trial.params)
    return draws


def test_the_largest_seed_draws_every_trial(tmp_path):
    # seed + number was the trial's seed: numpy refused trial 1 of seed 2**32 - 1, after trial 0 had trained
    for sampler in ("tpe", "random", "grid"):
        space = SPACE if sampler != "grid" else "    DATA.BATCH_SIZE: {int: [16, 19]}\n"
        path = search_file(tmp_path, f"trials: 4\nsampler: {sampler}\nseed: 4294967295\n", space,
                           name=f"{sampler}.yaml")
        assert len(first_draws(load_search(str(path)))) == 4
    assert not (tmp_path / "out").exists()


def test_two_seeds_are_two_studies_and_one_seed_one_study(tmp_path):
    # trial n was seeded seed + n: seed 1 repeated seed 0 one trial later (29 of 30 trials the same)
    space = SPACE + "    TRAIN.WEIGHT_DECAY: {uniform: [0.0, 0.1]}\n"
    for sampler in ("tpe", "random"):
        draws = {seed: first_draws(load_search(str(search_file(
            tmp_path, f"trials: 6\nsampler: {sampler}\nseed: {seed}\n", space, name=f"{sampler}{seed}.yaml"))), 6)
            for seed in (0, 1)}
        values = [{v for d in draws[seed] for v in d.values()} for seed in (0, 1)]
        assert not values[0] & values[1], sampler  # no trial's draw is shared, shifted or not
        again = first_draws(load_search(str(search_file(tmp_path, f"trials: 6\nsampler: {sampler}\nseed: 0\n",
                                                        space, name=f"{sampler}again.yaml"))), 6)
        assert again == draws[0], sampler  # the same seed: the same study (a re-run asks the same trials)


def test_mistakes_in_the_file_and_the_command_line(tmp_path):
    path = search_file(tmp_path, "trials: 2\n")
    refused(path, "TRAIN.LR is searched", extra=("TRAIN.LR", "0.1"))
    refused(path, "OUTPUT_DIR is the search's", extra=("OUTPUT_DIR", "x"))
    refused(path, "the config without the space", "TRAIN.EPOCS", extra=("TRAIN.EPOCS", "2"))
    both = tmp_path / "both.yaml"
    both.write_text(path.read_text() + "grid: {TRAIN.WEIGHT_DECAY: [0.1, 0.2]}\n")
    refused(both, "drop grid:/points:")
    period = search_file(tmp_path, "trials: 2\nasha: {eta: 2, min_epochs: 1}\n", epochs=4, name="p.yaml")
    refused(period, "the rung at epoch 1 has no evaluation with EVAL.PERIOD 2", extra=("EVAL.PERIOD", "2"))
    refused(path, "TRAIN.EARLY_STOP_PATIENCE would end trials before them", extra=("TRAIN.EARLY_STOP_PATIENCE", "2"))
    assert not (tmp_path / "out").exists()  # nothing was written


def test_reading_a_search_imports_no_torch(tmp_path):
    path = search_file(tmp_path, "trials: 3\nasha: {eta: 3, min_epochs: 1}\n")
    code = ("import sys; from runner.sweep import cli, report; from runner.sweep.search import load_search; "
            f"load_search({str(path)!r}); print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.stdout.strip() == "False", p.stderr


def test_cli_mistake_exits_2_with_one_line(tmp_path):
    path = search_file(tmp_path, "trials: 2\nasha: {eta: 1}\n")
    p = subprocess.run([sys.executable, "-m", "runner.sweep", "search", str(path)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and "asha: eta must be" in p.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------
# Rungs and ASHA's promotions, on a real journal
# ---------------------------------------------------------------------------------------------------------------
def test_rungs():
    assert rungs(1, 3, 3) == (1, 3)
    assert rungs(1, 3, 27) == (1, 3, 9, 27)
    assert rungs(1, 3, 20) == (1, 3, 9, 20)  # the last rung is the full length
    assert rungs(2, 2, 10) == (2, 4, 8, 10)
    assert rungs(3, 3, 3) == (3,)


def make_study(tmp_path: Path, trials: int = 9, epochs: int = 9, mode: str = "max"):
    """(search, study) for ASHA with eta 3 from epoch 1 (rungs 1, 3, 9) and `trials` trials in ROOT=tmp/out."""
    path = search_file(tmp_path, f"trials: {trials}\nmode: {mode}\nasha: {{eta: 3, min_epochs: 1}}\n",
                       epochs=epochs)
    search = load_search(str(path))
    with worker.locked(search.root):
        return search, open_study(search)


def record(search, study, values: dict[int, float]) -> list[int]:
    """New trials, one per value, each reported at the rungs up to the value's... epoch -> value map per trial."""
    numbers = []
    for by_epoch in values:
        trial = study.ask(distributions(search))
        for epoch, value in by_epoch.items():
            trial.report(value, step=epoch)
        numbers.append(trial.number)
    return numbers


def job(search, study, alive=lambda t: True) -> Job | None:
    """next_job on the study as it is in the journal (re-read through a fresh storage)."""
    with worker.locked(search.root):
        fresh = open_study(search)
    return next_job(fresh.get_trials(), search.rungs, search.eta, search.maximize, search.trials, alive)


def test_top_third_of_a_rung_is_promoted(tmp_path):
    search, study = make_study(tmp_path)
    record(search, study, [{1: 50.0}, {1: 80.0}])
    assert job(search, study) == Job(None, 1, "new")  # 2 recorded: the top third is nobody
    record(search, study, [{1: 60.0}, {1: 70.0}])
    assert job(search, study) == Job(1, 3, "promote")  # 4 recorded: the best one (80) goes to epoch 3


def test_min_mode_promotes_the_lowest(tmp_path):
    search, study = make_study(tmp_path, mode="min")
    record(search, study, [{1: 0.5}, {1: 0.2}, {1: 0.9}])
    assert job(search, study) == Job(1, 3, "promote")


def test_a_trial_that_paused_earlier_is_promoted_late(tmp_path):
    search, study = make_study(tmp_path)
    record(search, study, [{1: 90.0}, {1: 10.0}])
    assert job(search, study).why == "new"  # trial 0 waits at rung 1: 2 trials have no top third
    record(search, study, [{1: 20.0}])
    assert job(search, study) == Job(0, 3, "promote")  # the third arrival makes trial 0, paused long ago, the top


def test_higher_rungs_first_and_no_promotion_twice(tmp_path):
    search, study = make_study(tmp_path)
    record(search, study, [{1: 90.0, 3: 91.0}, {1: 80.0, 3: 70.0}, {1: 85.0, 3: 60.0}, {1: 10.0}, {1: 20.0},
                           {1: 30.0}, {1: 40.0}, {1: 50.0}, {1: 60.0}])
    # rung 3 holds 3 trials: its top third (trial 0) goes to 9 before anything of rung 1
    assert job(search, study) == Job(0, 9, "promote")
    trial_handle(study, study.trials[0]).set_user_attr(asha.JOB, {"epoch": 9, "worker": worker.worker_id()})
    # trial 0 is taken; rung 1's top third (9 // 3 = 3: trials 0, 2, 1) are all promoted already: the study is full
    assert job(search, study) is None
    assert asha.busy(study.get_trials(), lambda t: True)


def test_a_job_whose_worker_is_gone_is_resumed_first(tmp_path):
    search, study = make_study(tmp_path)
    record(search, study, [{1: 10.0}, {1: 20.0}, {1: 90.0}])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    trial_handle(study, study.trials[0]).set_user_attr(
        asha.JOB, {"epoch": 3, "worker": f"{worker.socket.gethostname()}:{gone.stdout.strip()}", "since": 0})
    trial_handle(study, study.trials[1]).set_user_attr(asha.JOB, {"epoch": 3, "worker": None, "since": 0})
    fresh = study.get_trials()
    assert not worker.live(search, fresh[0]) and not worker.live(search, fresh[1])
    assert job(search, study, lambda t: worker.live(search, t)) == Job(0, 3, "resume")


def test_done_when_full_and_nothing_promotable(tmp_path):
    search, study = make_study(tmp_path, trials=3, epochs=3)  # rungs 1, 3: 3 trials bring one to the end
    record(search, study, [{1: 10.0}, {1: 20.0, 3: 25.0}, {1: 5.0}])
    study.tell(1, 25.0)  # the top third of rung 1 (trial 1) trained to the end
    assert job(search, study) is None
    assert not asha.busy(study.get_trials(), lambda t: worker.live(search, t))
    # nothing closes them: a trial waiting at a rung can still be promoted if `trials` is raised
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING, TrialState.COMPLETE, TrialState.RUNNING]


TAKER = """
import json, os, sys, time
from runner.sweep import worker
from runner.sweep.report import write_report
from runner.sweep.search import load_search
from runner.sweep.study import open_study
search = load_search(sys.argv[1])
with worker.locked(search.root):
    study = open_study(search)
open(sys.argv[2] + ".ready", "w").close()
while not os.path.exists(sys.argv[3] + ".ready"):  # both start taking at once
    time.sleep(0.01)
taken = []
while True:
    job, others = worker.take(search, study)
    if job is None:
        break
    taken.append([job.number, job.epoch, job.why])
    time.sleep(0.05)  # a worker starts its trial: the other takes meanwhile
open(sys.argv[2] + ".done", "w").close()
while not os.path.exists(sys.argv[3] + ".done"):  # alive until both are done: a dead worker's jobs are resumed
    time.sleep(0.01)
print(json.dumps(taken))
"""


def test_two_workers_never_take_the_same_job(tmp_path):
    search, study = make_study(tmp_path, trials=15)
    record(search, study, [{1: float(v)} for v in range(9)])  # 9 at rung 1: 3 promotions due, and 6 new trials
    names = [str(tmp_path / "a"), str(tmp_path / "b")]
    procs = [subprocess.Popen([sys.executable, "-c", TAKER, search.sweep.path, me, other], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT) for me, other in (names, names[::-1])]
    taken = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    jobs = [tuple(j) for t in taken for j in t]
    assert len(jobs) == len(set(jobs)) == 9, taken
    assert sorted(j[0] for j in jobs if j[2] == "promote") == [6, 7, 8]
    assert sorted(j[0] for j in jobs if j[2] == "new") == list(range(9, 15))
    assert all(t for t in taken), "one worker took everything: the race was not run"


# ---------------------------------------------------------------------------------------------------------------
# The worker loop with a stand-in trainer; continuing and refusing a study
# ---------------------------------------------------------------------------------------------------------------
def calls(root: Path) -> dict[str, list[str]]:
    """Each trial folder's fake_train calls (the epoch ranges it trained)."""
    return {d.name: (d / "calls.txt").read_text().split() for d in sorted(root.glob("trial_*"))
            if (d / "calls.txt").exists()}


def fake_search(tmp_path: Path, trials: int = 4, space: str = SPACE):
    """A search of `trials` trials, eta 3 from epoch 1 over 3 epochs, seeded."""
    # seed 1: the 4th trial is below the best of the first 3 at epoch 1, so it does not promote itself
    return load_search(str(search_file(tmp_path, f"trials: {trials}\nseed: 1\nasha: {{eta: 3, min_epochs: 1}}\n",
                                       space)))


def test_worker_runs_the_study_and_a_rerun_trains_nothing(tmp_path, fake):
    search = fake_search(tmp_path)
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    study = open_study(search, create=False)
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 1 and states.count(TrialState.RUNNING) == 3
    best = next(t for t in study.trials if t.state == TrialState.COMPLETE)
    assert best.intermediate_values[1] == max(t.intermediate_values[1] for t in study.trials)
    assert sorted(best.intermediate_values) == [1, 3] and best.value == best.intermediate_values[3]
    before = calls(Path(search.root))
    assert before[f"trial_{best.number}"] == ["1-1", "2-3"]  # paused at 1, resumed to the end
    assert sum(len(v) for v in before.values()) == 5
    table = render(search, study)
    assert f"python tools/train.py --cfg {search.trial_dir(best.number)}/config.yaml" in table
    assert "4 of 4 trials; rungs at epochs [1, 3]" in table and table.count("stopped") == 3
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    assert calls(Path(search.root)) == before  # a finished study trains nothing
    page = Path(write_report(search, study)).read_text()
    assert page.count("<svg") == 4 and "<script" not in page and "src=" not in page  # self-contained
    assert "EDF of val/top1" in page and "epoch 3" in page and f"trial {best.number}" in page


def test_more_trials_continue_the_study(tmp_path, fake):
    search = fake_search(tmp_path, trials=3)
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    more = fake_search(tmp_path, trials=5)
    assert worker.run_worker(more, poll_s=0.1, log=lambda s: None) == 0
    study = open_study(more, create=False)
    assert len(study.trials) == 5  # trials counts the study's trials: 2 more, not 5 more


def test_a_changed_space_or_metric_is_refused(tmp_path, fake):
    search = fake_search(tmp_path, trials=3)
    with worker.locked(search.root):
        open_study(search)
    changed = fake_search(tmp_path, trials=3, space="    TRAIN.LR: {log: [1.0e-3, 1.0]}\n")
    with pytest.raises(UserError, match=r"made with space TRAIN.LR: log \[0.0001, 1.0\], now log \[0.001, 1.0\]"):
        open_study(changed)
    metric = load_search(str(search_file(tmp_path, "trials: 3\nmetric: val/loss\nseed: 0\n"
                                                   "asha: {eta: 3, min_epochs: 1}\n")))
    with pytest.raises(UserError, match="made with metric: val/top1, now val/loss") as e:
        open_study(metric)
    assert "\n" not in str(e.value)


def test_a_preempted_worker_leaves_its_trial_to_the_next(tmp_path, fake):
    search = fake_search(tmp_path, trials=3)
    fake.setenv("FAKE_EXIT", "75:1")
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 75
    study = open_study(search, create=False)
    assert study.trials[0].user_attrs[asha.JOB]["worker"] is None  # released, to epoch 1
    fake.delenv("FAKE_EXIT")
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    assert calls(Path(search.root))["trial_0"][0] == "1-1"  # the next worker trained it, once
    # the trial's log holds every segment, each after its own header (issue 46, item 12: appended, never truncated)
    headers = [x for x in (Path(search.root) / "logs" / "trial_0.log").read_text().splitlines() if x.startswith("===")]
    to = [h.split(" to epoch ")[1].split(",")[0] for h in headers]
    assert to[:2] == ["1", "1"] and to[2:] in ([], ["3"]), headers  # a promotion to epoch 3 adds its own segment


def test_a_failed_trial_is_told_fail_and_shown(tmp_path, fake):
    fake.setenv("FAKE_FAIL_ABOVE", "0.3")
    search = fake_search(tmp_path, trials=3, space="    TRAIN.LR: {choice: [0.001, 0.5, 0.003]}\n")
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    study = open_study(search, create=False)
    failed = [t for t in study.trials if t.state == TrialState.FAIL]
    assert failed and all(t.params["TRAIN.LR"] == 0.5 for t in failed)
    assert "failed (exit 1: RuntimeError: boom)" in render(search, study)


def test_grid_sampler_visits_each_point_once(tmp_path, fake):
    space = "    TRAIN.LR: {choice: [0.001, 0.003]}\n    DATA.BATCH_SIZE: {int: [16, 17]}\n"
    search = load_search(str(search_file(tmp_path, "sampler: grid\n", space)))
    assert search.trials == 4  # the grid's size when trials is not given
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    points = {(t.params["TRAIN.LR"], t.params["DATA.BATCH_SIZE"]) for t in open_study(search, create=False).trials}
    assert points == {(lr, b) for lr in (0.001, 0.003) for b in (16, 17)}


def test_cli_prints_the_table(tmp_path):
    path = search_file(tmp_path, "trials: 2\n")
    p = subprocess.run([sys.executable, "-m", "runner.sweep", "search", "--table", str(path)], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 0 and "no study in" in p.stdout, p.stderr


# ---------------------------------------------------------------------------------------------------------------
# End to end: the digits, a promoted trial equal to its config trained straight through
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_search_end_to_end_on_digits(tmp_path):
    import torch

    from tests.engine.test_resume import assert_same

    path = search_file(tmp_path, "trials: 4\nseed: 0\nasha: {eta: 3, min_epochs: 1}\n",
                       "    TRAIN.LR: {log: [1.0e-4, 1.0e-1]}\n")
    extra = ["DATA.BATCH_SIZE", "128", "DATA.NUM_WORKERS", "0", "LOG.PERIOD", "5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "runner.sweep", "search", str(path), *extra], capture_output=True,
                       text=True, cwd=ROOT, timeout=900, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    search = load_search(str(path), extra)
    study = open_study(search, create=False)
    done = sorted((t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: -t.value)
    # 3 trials at epoch 1 promote their best; the 4th promotes itself only if it beats that one
    assert len(study.trials) == 4 and len(done) in (1, 2)
    assert all(sorted(t.intermediate_values) == [1, 3] for t in done)
    assert all(sorted(t.intermediate_values) == [1] and t.state == TrialState.RUNNING
               for t in study.trials if t not in done)
    trial = Path(search.trial_dir(done[0].number))
    assert f"--cfg {trial}/config.yaml" in p.stdout
    assert (trial / "run.json").is_file() and json.loads((trial / "run.json").read_text())["status"] == "done"
    ref = tmp_path / "straight"
    q = subprocess.run([sys.executable, "tools/train.py", "--cfg", str(trial / "config.yaml"), "OUTPUT_DIR", str(ref)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert q.returncode == 0, q.stderr
    got, want = (torch.load(d / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
                 for d in (trial, ref))
    assert got["model"].keys() == want["model"].keys()
    assert all(torch.equal(got["model"][k], want["model"][k]) for k in want["model"])
    assert_same(got["optimizer"], want["optimizer"], "optimizer")


def test_a_study_continues_across_config_keys_added_or_made_auto_since():
    """A study stored before the runner gained a key (absent then, its default now) or before a key's default
    became "auto" (its old default then) continues; any other difference, or auto with pretrained weights, does not."""
    from runner.sweep.study import same_setting

    assert same_setting("config DATA.SET", None, "''")  # added since, at its default
    assert not same_setting("config DATA.SET", None, "cifar10")
    assert same_setting("config DATA.MEAN", "[0.485, 0.456, 0.406]", "auto")
    assert not same_setting("config DATA.MEAN", "[0.485, 0.456, 0.406]", "auto", pretrained=True)
    assert not same_setting("config DATA.MEAN", "[0.5, 0.5, 0.5]", "auto")
    assert not same_setting("config TRAIN.LR", "0.1", "0.2") and not same_setting("metric", "val/top1", "val/loss")
    assert not same_setting("config TRAIN.LR", "0.1", None)
