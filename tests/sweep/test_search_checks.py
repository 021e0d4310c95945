"""Checks of a search made before anything is written (issue 46, item 11): trials that ASHA's rungs cannot bring to
the full length, and a damaged study journal, each one line and exit 2."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner.errors import UserError
from runner.sweep import worker
from runner.sweep.search import load_search
from runner.sweep.study import distributions, journal_path, open_study
from tests.utils import assert_user_error, env

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs/digits/test_resnet.yaml"


def search_file(tmp_path: Path, search: str, epochs: int, name: str = "s.yaml") -> Path:
    """A sweep file on the digits config, TRAIN.EPOCHS `epochs`, with `search` lines and a one-key space."""
    body = (f"cfg: {DIGITS}\nroot: out\nset: {{TRAIN.EPOCHS: {epochs}, DATA.IMG_SIZE: 16}}\nsearch:\n"
            + textwrap.indent(textwrap.dedent(search), "  ") + "  space:\n    TRAIN.LR: {log: [1.0e-4, 1.0]}\n")
    path = tmp_path / name
    path.write_text(body)
    return path


def sweep_cli(*args: str) -> subprocess.CompletedProcess:
    """python -m runner.sweep ARGS, its output as text."""
    return subprocess.run([sys.executable, "-m", "runner.sweep", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env(), timeout=120)


@pytest.mark.parametrize("search, epochs, fragments", [
    # 3 trials, eta 2, rungs 1, 2, 4: rung 2 is sure of only 3 // 2 = 1 trial, which has no top half
    ("trials: 3\nasha: {eta: 2, min_epochs: 1}\n", 4,
     ["trials 3 may end with no trial at the full length", "rungs [1, 2, 4]", "give trials: 4",
      "asha: {eta: 2, min_epochs: 2} (rungs [2, 4])"]),
    # fewer trials than eta: nothing is ever promoted from the first rung
    ("trials: 2\nasha: {eta: 3, min_epochs: 1}\n", 3, ["trials 2 may end", "give trials: 3", "drop asha:"]),
    ("trials: 8\nasha: {eta: 3, min_epochs: 1}\n", 9,
     ["give trials: 9", "asha: {eta: 3, min_epochs: 3} (rungs [3, 9])"]),
])
def test_trials_that_cannot_reach_the_full_length_are_refused(tmp_path, search, epochs, fragments):
    path = search_file(tmp_path, search, epochs)
    with pytest.raises(UserError) as e:
        load_search(str(path))
    text = str(e.value)
    assert text.startswith(f"sweep {path}: search: ") and "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, text
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_cli_refuses_them_in_one_line(tmp_path):
    path = search_file(tmp_path, "trials: 3\nasha: {eta: 2, min_epochs: 1}\n", 4)
    out = sweep_cli("search", str(path))
    assert_user_error(out, f"sweep {path}: search: trials 3 may end with no trial at the full length")
    assert out.stdout == "" and not (tmp_path / "out").exists()
    # the boundary: eta**2 trials for rungs 1, 2, 4; fewer rungs for fewer trials; no asha: one rung, any trials
    assert load_search(str(search_file(tmp_path, "trials: 4\nasha: {eta: 2, min_epochs: 1}\n", 4))).trials == 4
    assert load_search(str(search_file(tmp_path, "trials: 2\nasha: {eta: 2, min_epochs: 2}\n", 4, "b.yaml"))).rungs \
        == (2, 4)
    assert load_search(str(search_file(tmp_path, "trials: 1\n", 9, "c.yaml"))).rungs == (9,)


# ---------------------------------------------------------------------------------------------------------------
# A damaged study.journal
# ---------------------------------------------------------------------------------------------------------------
def journal_with_trials(tmp_path: Path) -> tuple[Path, Path]:
    """(sweep file, its study.journal) with a study of 3 trials, each reported at epoch 1 (a real Optuna journal)."""
    path = search_file(tmp_path, "trials: 3\n", 1)
    search = load_search(str(path))
    with worker.locked(search.root):
        study = open_study(search)
    for value in (0.1, 0.2, 0.3):
        study.ask(distributions(search)).report(value, step=1)
    return path, Path(journal_path(search))


def test_a_torn_last_line_is_cut_before_the_next_record(tmp_path):
    path, journal = journal_with_trials(tmp_path)
    whole = journal.read_bytes()
    journal.write_bytes(whole[:-25])  # a writer killed mid-record: the last line has no end
    # each run appends a record; without the cut the first would extend the torn line and the second follow it
    outs = [sweep_cli("search", "--table", str(path)) for _ in range(3)]
    for out in outs:
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert "3 of 3 trials" in out.stdout, out.stdout
    assert "cut its torn last line" in outs[0].stderr and "cut" not in outs[1].stderr, outs[0].stderr
    now = journal.read_bytes()
    assert now.endswith(b"\n") and now.splitlines()[:5] == whole.splitlines()[:5]  # only the torn record is gone
    assert now.splitlines()[5:] != whole.splitlines()[5:]


@pytest.mark.parametrize("bad", [b"garbage\n", b"[1, 2]\n", b'{"op_code": 99, "worker_id": "x"}\n'])
def test_a_damaged_line_is_one_line_naming_it(tmp_path, bad):
    path, journal = journal_with_trials(tmp_path)
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join([*lines[:3], bad, *lines[3:]]))  # line 4 is damaged, records follow it
    for args in (("search", "--table", str(path)), ("search", str(path))):
        out = sweep_cli(*args)
        line = assert_user_error(out, f"sweep {path}: search: {journal} line 4 ", f"sed -i '4d' {journal}")
        assert "is not a journal record" in line or "is a record Optuna cannot replay" in line, line
    assert not (tmp_path / "out" / "trial_0").exists()  # the worker trained nothing
    journal.write_bytes(b"".join(lines))  # what the line says: that line deleted, the study reads again
    assert "3 of 3 trials" in sweep_cli("search", "--table", str(path)).stdout
