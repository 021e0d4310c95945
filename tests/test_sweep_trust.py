"""tools/sweeps/run.sh passes every value exactly as typed (no glob expansion, no word splitting), gives each point
or search worker its GPUs, and says each mistake in one line.

The tests run the real script with PYTHON set to a tiny fake interpreter that records the argv of each point
(train.py, or torchrun with train.py) and of each search worker, and hands everything else (the launcher,
`python -m runner.sweep run`, and the table) to the real one, so they take a second and see the exact arguments.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import assert_user_error, run_tool

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "digits" / "test_resnet.yaml"
LAUNCHER = ["-m", "runner.sweep", "run"]  # python -m runner.sweep run: the launcher run.sh execs

FAKE = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
if "CALL_LOG" in os.environ:  # every call, points and helpers alike
    with open(os.environ["CALL_LOG"], "a") as f:
        f.write(json.dumps(args) + "\\n")
if any(a.endswith("train.py") for a in args) or "--no-table" in args:  # a point or a worker: record, act as told
    with open(os.environ["ARGV_LOG"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    if "FAKE_SAY" in os.environ:  # a line of output, into its log when the sweep runs more than one at a time
        print(os.environ["FAKE_SAY"], flush=True)
    if "CUDA_LOG" in os.environ:  # the GPUs it was given
        with open(os.environ["CUDA_LOG"], "a") as f:
            f.write(json.dumps(os.environ.get("CUDA_VISIBLE_DEVICES")) + "\\n")
    sys.exit(int(os.environ.get("FAKE_RC", "0")))
os.execv(sys.executable, [sys.executable, *args])
"""


@pytest.fixture
def fake_python(tmp_path: Path) -> Path:
    """An executable that records each point's argv in ARGV_LOG and runs anything else with this Python."""
    path = tmp_path / "fake python"  # a space in the interpreter's path too
    path.write_text(FAKE)
    path.chmod(0o755)
    return path


def sweep_file(folder: Path, body: str, root: str = "sw") -> Path:
    """A sweep file on the digits config whose points train under folder/root."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "s.yaml"
    path.write_text(f"cfg: {DIGITS}\nroot: {json.dumps(root)}\n{body}")
    return path


GRID = "grid:\n  TRAIN.LR: [0.1, 0.05]\n  MODEL.NAME: [a, b]\n"
SEARCH = "search: {trials: 2, space: {TRAIN.LR: {log: [0.001, 0.1]}}}\n"


def run_sh(cwd: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """Run tools/sweeps/run.sh from cwd with the given environment added (no GPU: NUM_GPUS=0)."""
    full = dict(os.environ, NUM_GPUS="0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full.pop("CUDA_VISIBLE_DEVICES", None)
    full.update(env)
    proc = subprocess.Popen(["bash", str(ROOT / "tools" / "sweeps" / "run.sh"), *args], cwd=cwd, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and every point it started
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def points(log: Path) -> list[list[str]]:
    """The argv of every point (or worker) the fake interpreter was asked to run, in order."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def value_of(argv: list[str], key: str) -> str:
    """The value after the last occurrence of key in a point's argv."""
    return argv[len(argv) - 1 - argv[::-1].index(key) + 1]


def test_values_are_not_glob_expanded_and_stay_whole(tmp_path: Path, fake_python: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("resnet18x", "0.1z"):  # files the patterns below would match in the cwd
        (work / name).write_text("")
    path = sweep_file(work, "grid:\n  TRAIN.LR: [0.1]\n  MODEL.NAME: ['resnet*', 'my model', timm/resnet10t]\n",
                      root="my sweep")
    log = tmp_path / "argv.jsonl"
    out = run_sh(work, str(path), "AUG.SCALE", "(0.5, 1.0)", PYTHON=str(fake_python), ARGV_LOG=str(log), JOBS="2")
    assert out.returncode == 0, out.stdout + out.stderr
    got = sorted(points(log), key=lambda a: value_of(a, "MODEL.NAME"))
    assert [value_of(a, "MODEL.NAME") for a in got] == ["my model", "resnet*", "timm/resnet10t"]
    root = work / "my sweep"
    assert [value_of(a, "OUTPUT_DIR") for a in got] == [f"{root}/lr=0.1,model.name=my model",
                                                         f"{root}/lr=0.1,model.name=resnet*",
                                                         f"{root}/lr=0.1,model.name=timm_resnet10t"]
    assert all(value_of(a, "AUG.SCALE") == "(0.5, 1.0)" for a in got)  # an extra argument stays whole
    # two at a time: each point's output in its own log file, a / in the name made _ (no subfolder)
    assert sorted(p.name for p in (root / "logs").iterdir()) == [
        "lr=0.1,model.name=my model.log", "lr=0.1,model.name=resnet*.log", "lr=0.1,model.name=timm_resnet10t.log"]


@pytest.mark.parametrize("body, names", [(GRID, ["lr=0.05,model.name=a", "lr=0.1,model.name=b"]),
                                         (SEARCH, ["worker_0", "worker_1"])])
def test_a_rerun_appends_to_the_logs(body: str, names: list[str], tmp_path: Path, fake_python: Path) -> None:
    """Issue 46, item 12: a re-run of the same command (a search whose workers are refused, say) keeps the first
    run's lines in ROOT/logs/*.log, after a header line per start naming when and what."""
    path, log = sweep_file(tmp_path, body), tmp_path / "argv.jsonl"
    for say in ("first run", "second run"):
        out = run_sh(tmp_path, str(path), PYTHON=str(fake_python), ARGV_LOG=str(log), JOBS="2", FAKE_SAY=say)
        assert out.returncode == 0, out.stdout + out.stderr
    for name in names:
        lines = (tmp_path / "sw" / "logs" / f"{name}.log").read_text().splitlines()
        assert [x for x in lines if not x.startswith("=== ")] == ["first run", "second run"], lines
        headers = [x for x in lines if x.startswith("=== ")]
        # the command as the shell would take it back: the interpreter's path with its space quoted
        assert len(headers) == 2 and all(f" start {name} on " in h and "/fake\\ python " in h for h in headers)


def test_done_point_is_skipped_and_a_failed_one_listed(tmp_path: Path, fake_python: Path) -> None:
    log = tmp_path / "argv.jsonl"
    done = tmp_path / "sw" / "lr=0.1,model.name=a"
    done.mkdir(parents=True)
    (done / "results.json").write_text('{"status": "done"}')
    path = sweep_file(tmp_path, GRID)
    out = run_sh(tmp_path, str(path), PYTHON=str(fake_python), ARGV_LOG=str(log))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "skip lr=0.1,model.name=a (done)" in out.stdout
    assert len(points(log)) == 3
    out = run_sh(tmp_path, str(path), PYTHON=str(fake_python), ARGV_LOG=str(log), FAKE_RC="2")
    assert out.returncode == 1
    assert "  lr=0.05,model.name=b (exit code 2)" in out.stderr.splitlines()
    assert "3 point(s) failed" in out.stderr


@pytest.mark.parametrize("settings, fragment", [
    ({"JOBS": "0"}, "JOBS=0 is not a whole number of at least 1"),
    ({"JOBS": "two"}, "JOBS=two is not a whole number"),
    ({"NUM_GPUS": "-1"}, "NUM_GPUS=-1 is not a whole number of at least 0"),
    ({"NPROC": "0"}, "NPROC=0 is not a whole number of at least 1"),
    ({"NPROC": "1", "MAX_RESTARTS": "x"}, "MAX_RESTARTS=x is not a whole number of at least 0"),
    ({"PYTHON": "no-such-python"}, "PYTHON=no-such-python is not a program"),
])
def test_setting_mistakes(settings: dict, fragment: str, tmp_path: Path) -> None:
    # JOBS=0 used to loop for ever waiting for a free slot
    out = run_sh(tmp_path, str(sweep_file(tmp_path, GRID)), timeout=20, **settings)
    assert_user_error(out, fragment)
    assert not (tmp_path / "sw").exists()


def test_counts_with_leading_zero(tmp_path: Path, fake_python: Path) -> None:
    # bash arithmetic reads 08 as a bad octal number: the script used to stop with its own error
    log = tmp_path / "argv.jsonl"
    out = run_sh(tmp_path, str(sweep_file(tmp_path, GRID)), PYTHON=str(fake_python), ARGV_LOG=str(log), JOBS="08")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "8 point(s) at a time" in out.stdout and len(points(log)) == 4


def test_root_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("my notes")
    out = run_sh(tmp_path, str(sweep_file(tmp_path, GRID)), timeout=20, SWEEP_ROOT="taken/sweep")
    assert_user_error(out, "taken/sweep cannot be made a folder")
    assert (tmp_path / "taken").read_text() == "my notes"


def test_every_point_is_checked_once_before_any_starts(tmp_path: Path, fake_python: Path) -> None:
    # a mistake in one point used to start every point, each failing on it (exit 1 after N failures)
    log, calls = tmp_path / "argv.jsonl", tmp_path / "calls.jsonl"
    path = sweep_file(tmp_path, GRID)
    out = run_sh(tmp_path, str(path), "TRAIN.EPOCHS", "many", PYTHON=str(fake_python), ARGV_LOG=str(log),
                 CALL_LOG=str(calls))
    line = assert_user_error(out, "point lr=0.1,model.name=a", "TRAIN.EPOCHS")
    assert line.startswith(f"error: sweep {path}: "), line
    assert points(log) == [] and not (tmp_path / "sw").exists()
    out = run_sh(tmp_path, str(path), "TRAIN.EPOCHS", "3", PYTHON=str(fake_python), ARGV_LOG=str(log),
                 CALL_LOG=str(calls))
    assert out.returncode == 0 and len(points(log)) == 4, out.stdout + out.stderr
    called = [json.loads(c) for c in calls.read_text().splitlines()]
    assert sum(c[:3] == LAUNCHER for c in called) == 2  # the launcher, once per run.sh
    # besides it, only the points and the table: one Python process built all four points' configs, each time
    assert all(c[:3] == LAUNCHER or c[0].endswith(("train.py", "summarize.py")) for c in called), called


@pytest.fixture
def two_gpus(tmp_path: Path) -> str:
    """A PATH whose nvidia-smi lists two GPUs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-a)'\necho 'GPU 1: Fake (UUID: GPU-b)'\n")
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize("body", [GRID, SEARCH], ids=["points", "search workers"])
@pytest.mark.parametrize("visible, expected", [
    (None, {"0", "1"}),  # nvidia-smi's two GPUs, each running one point (or worker) at a time
    ("", {""}),  # set but empty: every GPU stays hidden, the points run on the CPU
    ("3, 5", {"3", "5"}),
])
def test_gpus_given_to_points_and_workers(body: str, visible: str | None, expected: set, tmp_path: Path,
                                          fake_python: Path, two_gpus: str) -> None:
    log, cuda = tmp_path / "argv.jsonl", tmp_path / "cuda.jsonl"
    env = {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {}
    out = run_sh(tmp_path, str(sweep_file(tmp_path, body)), PYTHON=str(fake_python), ARGV_LOG=str(log),
                 CUDA_LOG=str(cuda), PATH=two_gpus, NUM_GPUS="", **env)
    assert out.returncode == 0, out.stdout + out.stderr
    got = [json.loads(line) for line in cuda.read_text().splitlines()]
    # which GPU gets which point depends on which ends first; a search: one worker per GPU (one on the CPU)
    assert len(got) == (4 if body == GRID else len(expected)) and set(got) == expected
    assert ("no GPU found" in out.stdout) == (visible == "")
    if body == SEARCH:
        assert all(a[:4] == ["-m", "runner.sweep", "search", "--no-table"] for a in points(log))


def test_torchrun_points_get_their_own_gpus_and_port(tmp_path: Path, fake_python: Path, two_gpus: str) -> None:
    log, cuda = tmp_path / "argv.jsonl", tmp_path / "cuda.jsonl"
    path = sweep_file(tmp_path, GRID)
    out = run_sh(tmp_path, str(path), PYTHON=str(fake_python), ARGV_LOG=str(log), CUDA_LOG=str(cuda),
                 PATH=two_gpus, NUM_GPUS="", NPROC="2")
    assert out.returncode == 0, out.stdout + out.stderr
    got = points(log)
    assert len(got) == 4 and all(a[:2] == ["-m", "torch.distributed.run"] and "--nproc_per_node=2" in a for a in got)
    assert {json.loads(line) for line in cuda.read_text().splitlines()} == {"0,1"}
    # three processes on two GPUs used to get CUDA_VISIBLE_DEVICES=0,1,0
    assert_user_error(run_sh(tmp_path, str(path), NPROC="3", PATH=two_gpus, NUM_GPUS=""),
                      "NPROC=3 is more than the 2 GPU(s) found")


@pytest.mark.parametrize("args, fragment", [
    (["TRAIN.EPOCHS", "2", "TRAIN.LR", "0.01"], "TRAIN.LR is set per point by the sweep's grid:"),
    (["OUTPUT_DIR", "out"], "OUTPUT_DIR is the sweep's"),
])
def test_extra_argument_that_would_override_the_swept_key(args: list[str], fragment: str, tmp_path: Path,
                                                          fake_python: Path) -> None:
    # an extra argument that set a swept key made every point the same
    log = tmp_path / "argv.jsonl"
    out = run_sh(tmp_path, str(sweep_file(tmp_path, GRID)), *args, PYTHON=str(fake_python), ARGV_LOG=str(log))
    assert_user_error(out, fragment)
    assert points(log) == [] and not (tmp_path / "sw").exists()


@pytest.mark.parametrize("args, fragments", [
    (["--repeat", "0"], ["--repeat 0", "at least 1"]),
    (["--cfg", "nope.yaml"], ["nope.yaml not found"]),
    (["TRAIN.LR", "abc"], ["TRAIN.LR expects a number"]),
    (["--repeat", "x"], ["--repeat: invalid int value"]),  # argparse printed its usage: three lines
])
def test_overhead_mistakes(args: list[str], fragments: list[str]) -> None:
    # used to end in an IndexError or a CalledProcessError traceback from the timed child
    assert_user_error(run_tool("sweeps/overhead.py", args, timeout=60), *fragments)
