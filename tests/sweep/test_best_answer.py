"""One answer for a search's best and one vocabulary of states (issue 46, item 7): the search's table, its
ROOT/report.html and tools/summarize.py on the search's root agree; the printed command trains the best trial again,
bit-identical, into a new folder."""
from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from optuna.trial import TrialState

from runner.sweep import asha, summary, worker
from runner.sweep.report import write_report
from runner.sweep.search import TRIAL_PREFIX, load_search
from runner.sweep.study import JOURNAL, open_study, trial_handle
from runner.sweep.table import STATES, render
from tests.sweep.test_search import record, search_file
from tests.sweep.test_summary import done, make_run, summarize_cli
from tests.utils import env as pinned_env

ROOT = Path(__file__).resolve().parents[2]
ASHA = "trials: 3\nasha: {eta: 3, min_epochs: 1}\n"


def made_search(tmp_path: Path):
    """(search, study) over rungs 1 and 3 (eta 3) in ROOT=tmp/out, with no trials yet."""
    search = load_search(str(search_file(tmp_path, ASHA)))
    with worker.locked(search.root):
        return search, open_study(search)


def trial_folder(search, number: int, top1: list[float], final: dict | None = None, status: str = "paused") -> Path:
    """Trial `number`'s folder as training leaves it: config.yaml, metrics.jsonl (one val/top1 per epoch), run.json,
    and results.json when `final` is given."""
    rows = [{"step": 10 * e, "epoch": e, "val/top1": v} for e, v in enumerate(top1, 1)]
    return make_run(Path(search.trial_dir(number)), {"TRAIN.LR": 0.01 * (number + 1)}, results=final, metrics=rows,
                    state={"status": "done" if final else status})


def csv_of(root: Path) -> list[dict]:
    """tools/summarize.py ROOT --format csv, as dicts in its order."""
    out = summarize_cli(root, "--format", "csv")
    assert out.returncode == 0, out.stderr
    return list(csv.DictReader(io.StringIO(out.stdout)))


def table_states(text: str) -> dict[str, str]:
    """Trial folder name -> its state cell, from the table's text."""
    lines = text.splitlines()
    start = lines[0].index("state")
    rows = [line for line in lines[1:] if re.match(r"^\d+( \*)?  ", line)]  # not the closing lines
    return {f"{TRIAL_PREFIX}{line.split()[0]}": line[start:].strip() for line in rows}


def test_the_names_summarize_spells_agree_with_the_search():
    assert summary.STUDY_JOURNAL == JOURNAL and summary._TRIAL_FOLDER.fullmatch(f"{TRIAL_PREFIX}12")


def test_table_report_and_summarize_name_one_best(tmp_path):
    """The filed case: summarize starred the trial whose best evaluation mid-run was highest (98.89) while the table
    named the one best at the full length (98.61); a tie at the full length goes to the earlier trial everywhere."""
    search, study = made_search(tmp_path)
    record(search, study, [{1: 95.0, 3: 97.0}, {1: 96.0, 3: 98.61}, {1: 50.0}, {1: 94.0, 3: 98.61}])
    for number in (0, 1, 3):
        study.tell(number, study.trials[number].intermediate_values[3])
    trial_folder(search, 0, [95.0, 98.89, 97.0], done(97.0, **{"best/val/top1": 98.89}))
    trial_folder(search, 1, [96.0, 97.0, 98.61], done(98.61, **{"best/val/top1": 98.61}))
    trial_folder(search, 2, [50.0])
    trial_folder(search, 3, [94.0, 96.0, 98.61], done(98.61, **{"best/val/top1": 98.61}))
    table = render(search, study)
    assert re.search(r"^1 \*", table, re.MULTILINE) and "best: trial 1, val/top1 98.6100 at epoch 3" in table
    assert "stopped (at epoch 1, not promoted)" in table  # the study has nothing more to do
    page = Path(write_report(search, study)).read_text()
    assert "best: trial 1, val/top1 98.6100" in page
    rows = csv_of(Path(search.root))
    assert [r["run"] for r in rows] == ["trial_1", "trial_3", "trial_0", "trial_2"]  # the search's order
    assert [r["run"] for r in rows if r["best"] == "1"] == ["trial_1"]
    assert (rows[0]["rung"], float(rows[0]["rung/val/top1"])) == ("3", 98.61)
    stopped = rows[-1]
    assert (stopped["status"], stopped["note"]) == ("stopped", "at epoch 1, not promoted")
    md = summarize_cli(Path(search.root))
    assert "| * | **trial_1** |" in md.stdout
    command = next(x for x in table.splitlines() if "tools/train.py" in x).strip()
    assert command in md.stdout  # the same command, from the same answer
    assert f"OUTPUT_DIR {search.trial_dir(1)}_again" in command


def test_one_word_per_state_in_the_table_and_summarize(tmp_path):
    """training, to resume, paused, failed, to start and done: the same words and details in both views; a paused
    trial is never 'interrupted ... re-run'."""
    search, study = made_search(tmp_path)
    record(search, study, [{1: 90.0}, {1: 80.0}, {1: 70.0}, {}, {}, {1: 85.0, 3: 91.0}])
    handle = {n: trial_handle(study, study.trials[n]) for n in range(6)}
    handle[0].set_user_attr(asha.JOB, {"epoch": 3, "worker": worker.worker_id(), "since": 0})  # this process: live
    handle[1].set_user_attr(asha.JOB, {"epoch": 3, "worker": None, "since": 0})  # released by a stopped worker
    handle[3].set_user_attr("error", "exit 1: RuntimeError: boom")
    study.tell(3, state=TrialState.FAIL)
    study.tell(5, 91.0)
    for number, top1 in ((0, [90.0]), (1, [80.0]), (2, [70.0]), (3, []), (4, []), (5, [85.0, 88.0, 91.0])):
        trial_folder(search, number, top1, done(91.0) if number == 5 else None)
    cells = table_states(render(search, study))
    rows = {r["run"]: r for r in csv_of(Path(search.root))}
    assert cells == {"trial_0": "training (to epoch 3)", "trial_1": "to resume (to epoch 3)",
                     "trial_2": "paused (at epoch 1, may be promoted)",
                     "trial_3": "failed (exit 1: RuntimeError: boom)", "trial_4": "to start", "trial_5": "done"}
    for name, cell in cells.items():
        status, note = rows[name]["status"], rows[name]["note"].split("; ")[0]
        assert status in STATES and (f"{status} ({note})" if note else status) == cell, (name, rows[name])
        assert "re-run" not in rows[name]["note"] and "interrupted" not in rows[name]["note"]


def test_summarize_without_the_study_still_says_paused(tmp_path):
    """A trial folder beside a study.journal that cannot be read: plain columns, but its state is the search's
    (paused), and the note says why the study is not shown."""
    root = tmp_path / "search"
    make_run(root / "trial_0", {"TRAIN.LR": 0.1}, metrics=[{"step": 10, "epoch": 1, "val/top1": 50.0}],
             state={"status": "paused"})
    (root / JOURNAL).write_text("not a journal\n")
    (row,) = csv_of(root)
    assert row["status"] == "paused" and "study.journal unreadable" in row["note"], row
    assert "re-run" not in row["note"]


def test_a_non_finite_metric_never_is_the_best(tmp_path):
    search, study = made_search(tmp_path)
    record(search, study, [{1: 95.0, 3: float("inf")}, {1: 90.0, 3: 80.0}, {1: 10.0}])
    for number in (0, 1):
        study.tell(number, study.trials[number].intermediate_values[3])
    table = render(search, study)
    assert "best: trial 1," in table and "inf" not in table.split("best:")[1]
    Path(write_report(search, study))  # the charts skip what they cannot place


@pytest.mark.slow
def test_the_printed_command_trains_the_best_trial_again_bit_identical(tmp_path):
    """A tiny search on the digits (3 trials, the best paused at epoch 1 and resumed to 3); the table's command,
    run as printed in a shell without OMP_NUM_THREADS, trains a new folder to the trial's very weights."""
    import torch

    from tests.engine.test_resume import assert_same

    path = search_file(tmp_path, "trials: 3\nseed: 0\nasha: {eta: 3, min_epochs: 1}\n",
                       "    TRAIN.LR: {log: [1.0e-3, 1.0e-1]}\n")
    extra = ["MODEL.NAME", "resnet10t", "DATA.BATCH_SIZE", "128", "DATA.NUM_WORKERS", "0", "LOG.PERIOD", "5"]
    env = pinned_env()  # one thread, pinned as the user's (not the marker this pytest process chose)
    p = subprocess.run([sys.executable, "-m", "runner.sweep", "search", str(path), *extra], capture_output=True,
                       text=True, cwd=ROOT, timeout=900, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    best = re.search(r"best: trial (\d+),", p.stdout)
    command = lines[next(i for i, x in enumerate(lines) if x.startswith("best: ")) + 1].strip()
    assert best and command.startswith("OMP_NUM_THREADS=1 python tools/train.py --cfg "), p.stdout
    trial = Path(load_search(str(path), extra).trial_dir(int(best.group(1))))
    again = Path(f"{trial}_again")
    assert command.endswith(f"OUTPUT_DIR {again}") and not again.exists()
    assert f"| * | **{trial.name}** |" in summarize_cli(trial.parent).stdout  # summarize: the same answer
    shell = {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "_RUNNER_CPU_THREADS")}
    shell["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{shell.get('PATH', '')}"  # `python`: this venv's
    q = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=ROOT, timeout=600, env=shell)
    assert q.returncode == 0, q.stdout + q.stderr
    assert json.loads((again / "results.json").read_text())["status"] == "done"
    got, want = (torch.load(d / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
                 for d in (again, trial))
    assert got["step"] == want["step"] and got["cpu_threads"] == want["cpu_threads"]
    assert_same(got["model"], want["model"], "model")
    assert_same(got["optimizer"], want["optimizer"], "optimizer")
