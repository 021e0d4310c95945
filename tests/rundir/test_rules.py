"""A run folder belongs to one run: foreign folders untouched, no two runs mixed, finished runs not rewritten,
setup failures recorded, folders that cannot be made (runner/rundir/rules.py); the refusals before the claim
through tools/train.py's main in this process."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.utils import ROOT, TINY, assert_user_error, env, run_tool, torchrun

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
TRAIN = str(ROOT / "tools" / "train.py")
RUN = [*TINY, "TRAIN.EPOCHS", "2"]  # the finished run's own command line


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder`: content hash and modification time (ns), to prove nothing was touched."""
    return {str(p.relative_to(folder)): (hashlib.sha1(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def finished(finished_digits) -> Path:
    """One finished tiny digits run (2 epochs, 44 steps: RUN, trained once for the session) that each test copies
    before changing anything."""
    return finished_digits[0]


def copy_run(finished: Path, tmp_path: Path) -> Path:
    """A private copy of the finished run."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def user_folder(tmp_path: Path) -> Path:
    """A folder of the user's own files, named like ours, as an earlier tool or a person left them."""
    d = tmp_path / "mine"
    (d / "checkpoints").mkdir(parents=True)
    (d / "config.yaml").write_text("my: notes\n")
    (d / "metrics.jsonl").write_text('{"step": 999, "epoch": 1, "mine": 1}\n')
    (d / "env.txt").write_text("my environment\n")
    (d / "results.json").write_text('{"status": "done", "val/top1": 12.5, "step": 7, "epoch": 9}\n')
    for step in (1, 2, 3, 4, 5):
        torch.save({"model": {}, "step": step}, d / "checkpoints" / f"step_{step:08d}.pth")
    return d


def test_foreign_folder_is_refused_and_untouched(tmp_path, in_process):
    d = user_folder(tmp_path)
    before = snapshot(d)
    r = in_process("train.py", ["--cfg", DIGITS, *TINY, "OUTPUT_DIR", str(d)])
    assert_user_error(r, str(d), "holds no run of ours", "config.yaml")
    assert snapshot(d) == before  # its "results.json" was not taken for ours: no "already done", no resume
    assert sorted(p.name for p in d.iterdir()) == ["checkpoints", "config.yaml", "env.txt", "metrics.jsonl",
                                                    "results.json"]


def test_folder_with_one_stray_file_is_refused(tmp_path, in_process):
    d = tmp_path / "x"
    d.mkdir()
    (d / "run.lock").write_text("not ours\n")
    r = in_process("train.py", ["--cfg", DIGITS, *TINY, "OUTPUT_DIR", str(d)])
    assert_user_error(r, "holds no run of ours")
    assert [p.name for p in d.iterdir()] == ["run.lock"] and (d / "run.lock").read_text() == "not ours\n"


@pytest.mark.slow
def test_foreign_folder_refused_under_torchrun(tmp_path):
    d = user_folder(tmp_path)
    before = snapshot(d)
    r = subprocess.run(torchrun(["--standalone", "--nproc_per_node", "2", TRAIN, "--cfg", DIGITS, *TINY,
                                 "OUTPUT_DIR", str(d)]), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode != 0 and "holds no run of ours" in r.stderr
    assert snapshot(d) == before


def test_output_dir_that_is_a_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep me\n")
    r = run_tool("train.py", ["--cfg", DIGITS, *TINY, "OUTPUT_DIR", str(f)])
    assert_user_error(r, "is a file")
    assert f.read_text() == "keep me\n"


def test_empty_and_missing_folders_are_taken(tmp_path):
    from runner.config import get_default_config
    from runner.rundir.rules import check_output_dir

    cfg = get_default_config()
    for d in (tmp_path / "empty", tmp_path / "missing" / "deeper"):
        if d.name == "empty":
            d.mkdir()
        cfg.OUTPUT_DIR = str(d)
        check_output_dir(cfg)  # no error
    assert not (tmp_path / "missing").exists()  # the check itself writes nothing


def test_resume_none_on_a_run_folder_is_refused(finished, tmp_path, in_process):
    out = copy_run(finished, tmp_path)
    before = snapshot(out)
    r = in_process("train.py", ["--cfg", DIGITS, *RUN, "CHECKPOINT.RESUME", "none", "OUTPUT_DIR", str(out)])
    assert_user_error(r, "CHECKPOINT.RESUME none would mix two runs", "another OUTPUT_DIR")
    assert snapshot(out) == before


def test_resume_from_another_folders_checkpoint_is_refused(finished, tmp_path, in_process):
    out = copy_run(finished, tmp_path)
    other = tmp_path / "other.pth"
    shutil.copy(out / "checkpoints" / "last.pth", other)
    before = snapshot(out)
    r = in_process("train.py", ["--cfg", DIGITS, *RUN, "CHECKPOINT.RESUME", str(other), "OUTPUT_DIR", str(out)])
    assert_user_error(r, "another folder's checkpoint", "mix two runs")
    assert snapshot(out) == before


def test_resume_none_on_a_fresh_folder_trains(tmp_path):
    out = tmp_path / "fresh"
    r = run_tool("train.py", ["--cfg", DIGITS, *TINY, "TRAIN.MAX_STEPS", "2", "CHECKPOINT.RESUME", "none",
                              "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "results.json").read_text())["step"] == 2


@pytest.mark.parametrize("extra, why", [
    ([], "it ran 2 epochs, 44 steps)"),  # the same command
    (["TRAIN.EPOCHS", "1"], "TRAIN.EPOCHS 1 asks for no more"),  # shorter than what ran
    (["TRAIN.EPOCHS", "3", "TRAIN.MAX_STEPS", "5"], "TRAIN.MAX_STEPS 5 asks for no more"),
])
def test_finished_run_is_not_rewritten(finished, tmp_path, extra, why, in_process):
    out = copy_run(finished, tmp_path)
    before = snapshot(out)
    r = in_process("train.py", ["--cfg", DIGITS, *RUN, *extra, "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stderr
    assert "already done" in r.stdout and why in r.stdout and "nothing rewritten" in r.stdout
    val = json.loads((out / "results.json").read_text())["val/top1"]
    assert f"val/top1 {val:.2f};" in r.stdout  # two decimals, not 98.33333333333333
    assert snapshot(out) == before


@pytest.mark.slow
def test_finished_run_under_torchrun_is_not_rewritten(finished, tmp_path):
    out = copy_run(finished, tmp_path)
    before = snapshot(out)
    r = subprocess.run(torchrun(["--standalone", "--nproc_per_node", "2", TRAIN, "--cfg", DIGITS, *RUN,
                                 "TRAIN.EPOCHS", "1", "OUTPUT_DIR", str(out)]), capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("already done") == 1 and "TRAIN.EPOCHS 1 asks for no more" in r.stdout
    after = snapshot(out)
    assert after.pop("run.lock") and before.pop("run.lock")  # rank 0 took the lock to decide; nothing else changed
    assert after == before


def test_setup_failure_is_recorded(tmp_path):
    out = tmp_path / "run"
    r = run_tool("train.py", ["--cfg", DIGITS, *TINY, "MODEL.NAME", "resnet10tt", "OUTPUT_DIR", str(out)])
    line = assert_user_error(r, "resnet10tt")
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "failed" and "resnet10tt" in status["error"]
    assert line.removeprefix("error: ") in (out / "log.txt").read_text()
    r = run_tool("train.py", ["--cfg", DIGITS, *TINY, "TRAIN.MAX_STEPS", "1", "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stderr  # the folder is ours: the corrected command runs in it


@pytest.mark.parametrize("where, fragment", [
    ("under_a_file", "is a file"),  # OUTPUT_DIR notes.txt/run: mkdir raised NotADirectoryError
    ("proc", "cannot be written"),  # a file system that refuses new folders: FileNotFoundError traceback
])
def test_output_dir_that_cannot_be_made(tmp_path, where, fragment, in_process):
    (tmp_path / "notes.txt").write_text("keep me\n")
    out = str(tmp_path / "notes.txt" / "run") if where == "under_a_file" else f"/proc/runner-test-{os.getpid()}"
    r = in_process("train.py", ["--cfg", DIGITS, *TINY, "OUTPUT_DIR", out])
    assert_user_error(r, "OUTPUT_DIR", fragment)
    assert (tmp_path / "notes.txt").read_text() == "keep me\n"


def test_lone_tilde_says_what_yaml_made_of_it(tmp_path, in_process):
    r = in_process("train.py", ["--cfg", DIGITS, *TINY, "OUTPUT_DIR", "~"])
    assert_user_error(r, "OUTPUT_DIR cannot be null", "lone ~ is YAML's null")


@pytest.mark.parametrize("text, what", [
    ('{"format": "runner-run/1", "status": "runn', "not JSON: Unterminated string"),  # truncated
    ("", "empty"),
    ("\x00\x00\x00\x00", "not JSON"),  # a block of zeros, as a crash of the file system can leave
])
def test_damaged_run_json_is_said_to_be_damaged(tmp_path, text, what, in_process):
    # it was reported as a folder with "no run.json from this runner"
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(text)
    (out / "config.yaml").write_text("MODEL:\n  NAME: resnet10t\n")
    before = snapshot(out)
    r = in_process("train.py", ["--cfg", DIGITS, *TINY, "OUTPUT_DIR", str(out)])
    line = assert_user_error(r, f"{out / 'run.json'} is damaged ({what}", "replace run.json with",
                             '"format": "runner-run/1"', "or choose another OUTPUT_DIR")
    assert "no run.json from this runner" not in line
    assert snapshot(out) == before


def test_run_of_a_newer_runner_is_refused(tmp_path, in_process):
    # "runner-run/9" with the keys of every format was taken for ours (an old run.json), and written into
    out = tmp_path / "run"
    out.mkdir()
    marker = {"format": "runner-run/9", "status": "preempted", "pid": 1, "host": "h", "updated": 0.0}
    (out / "run.json").write_text(json.dumps(marker))
    before = snapshot(out)
    r = in_process("train.py", ["--cfg", DIGITS, *TINY, "OUTPUT_DIR", str(out)])
    assert_user_error(r, f"OUTPUT_DIR {out} was made by a newer runner (format 9; this one reads up to 1)")
    assert snapshot(out) == before


def killed_after_the_claim(out: Path, args: list[str]) -> None:
    """Start a run and SIGKILL it as soon as its run.json appears: the state a kill between the claim and
    config.yaml leaves (the set-up after the claim takes seconds, the wait a few milliseconds)."""
    proc = subprocess.Popen([sys.executable, TRAIN, "--cfg", DIGITS, *args, "OUTPUT_DIR", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env())
    deadline = time.monotonic() + 60
    while not (out / "run.json").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.kill()
    proc.wait()
    assert (out / "run.json").exists() and not (out / "config.yaml").exists(), sorted(os.listdir(out))


@pytest.mark.slow
def test_a_run_killed_right_after_its_claim_keeps_its_config(tmp_path):
    # killed after run.json appeared but before config.yaml: another config could then take the folder on
    out = tmp_path / "run"
    run = [*TINY, "TRAIN.MAX_STEPS", "2"]
    killed_after_the_claim(out, run)
    before = snapshot(out)
    r = run_tool("train.py", ["--cfg", DIGITS, *run, "TRAIN.LR", "0.01", "OUTPUT_DIR", str(out)], timeout=120)
    assert_user_error(r, "differs from the one", "TRAIN.LR: 0.05 -> 0.01", "use another OUTPUT_DIR")
    assert snapshot(out) == before
    r = run_tool("train.py", ["--cfg", DIGITS, *run, "OUTPUT_DIR", str(out)], timeout=120)  # the same: it goes on
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "results.json").read_text())["step"] == 2
