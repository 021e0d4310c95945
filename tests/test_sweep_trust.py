"""The sweep scripts pass every value exactly as typed: no glob expansion, no word splitting, one line per mistake.

Most tests run the real scripts with PYTHON set to a tiny fake interpreter that records the argv of each
point (train.py, or torchrun with train.py) and hands everything else (the summary, torchrun.sh's free-port
probe) to the real one, so they take a second and see the exact arguments; one test starts real points.
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
SCRIPTS = ("lr_x_model.sh", "per_gpu.sh", "torchrun.sh")

FAKE = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
if "CALL_LOG" in os.environ:  # every call, points and helpers alike
    with open(os.environ["CALL_LOG"], "a") as f:
        f.write(json.dumps(args) + "\\n")
if any(a.endswith("train.py") for a in args):  # a point: record its argv, act as told
    with open(os.environ["ARGV_LOG"], "a") as f:
        f.write(json.dumps(args) + "\\n")
    if "CUDA_LOG" in os.environ:  # the GPUs the point was given
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


def sweep(script: str, cwd: Path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """Run tools/sweeps/<script> from cwd with the given environment added (no GPU: NUM_GPUS=0)."""
    full = dict(os.environ, NUM_GPUS="0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full.pop("CUDA_VISIBLE_DEVICES", None)
    full.update(env)
    proc = subprocess.Popen(["bash", str(ROOT / "tools" / "sweeps" / script), *args], cwd=cwd, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and every point it started
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def points(log: Path) -> list[list[str]]:
    """The argv of every point the fake interpreter was asked to run, in order."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def value_of(argv: list[str], key: str) -> str:
    """The value after the last occurrence of key in a point's argv."""
    return argv[len(argv) - 1 - argv[::-1].index(key) + 1]


@pytest.mark.parametrize("script", SCRIPTS)
def test_values_are_not_glob_expanded(script: str, tmp_path: Path, fake_python: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("resnet18x", "resnet50y", "0.1z"):  # files the patterns below would match in the cwd
        (work / name).write_text("")
    log = tmp_path / "argv.jsonl"
    out = sweep(script, work, PYTHON=str(fake_python), ARGV_LOG=str(log), SWEEP_ROOT="sw",
                LRS="0.1", MODELS="resnet* resnet10t", NPROC="1")
    assert out.returncode == 0, out.stdout + out.stderr
    got = points(log)
    assert [value_of(a, "MODEL.NAME") for a in got] == ["resnet*", "resnet10t"]
    assert value_of(got[0], "OUTPUT_DIR") == "sw/lr0.1_resnet*"
    assert "start lr0.1_resnet*" in out.stdout
    # the LR 0.1* reaches the config check as typed (0.1z in the cwd is not taken), which refuses it
    out = sweep(script, work, PYTHON=str(fake_python), ARGV_LOG=str(log), SWEEP_ROOT="sw2", LRS="0.1*",
                MODELS="resnet*", NPROC="1")
    assert_user_error(out, "point lr0.1*_resnet*: TRAIN.LR expects a number, got '0.1*'")


def test_items_with_spaces_and_slashes(tmp_path: Path, fake_python: Path) -> None:
    log = tmp_path / "argv.jsonl"
    root = tmp_path / "my sweep"  # a sweep folder with a space in its name
    out = sweep("per_gpu.sh", tmp_path, "AUG.SCALE", "(0.5, 1.0)", PYTHON=str(fake_python), ARGV_LOG=str(log),
                SWEEP_ROOT=str(root), JOBS="2", LRS="0.1", MODELS="my model\n  timm/resnet10t \n\n")
    assert out.returncode == 0, out.stdout + out.stderr
    got = sorted(points(log), key=lambda a: value_of(a, "MODEL.NAME"))
    assert [value_of(a, "MODEL.NAME") for a in got] == ["my model", "timm/resnet10t"]
    assert [value_of(a, "OUTPUT_DIR") for a in got] == [f"{root}/lr0.1_my model", f"{root}/lr0.1_timm_resnet10t"]
    assert all(value_of(a, "AUG.SCALE") == "(0.5, 1.0)" for a in got)  # an extra argument stays whole
    # two at a time: each point's output in its own log file, a / in the name made _ (no subfolder)
    assert sorted(p.name for p in (root / "logs").iterdir()) == ["lr0.1_my model.log", "lr0.1_timm_resnet10t.log"]


def test_done_point_with_a_star_is_skipped(tmp_path: Path, fake_python: Path) -> None:
    log = tmp_path / "argv.jsonl"
    done = tmp_path / "sw" / "lr0.1_resnet*"
    done.mkdir(parents=True)
    (done / "results.json").write_text('{"status": "done"}')
    (tmp_path / "resnet18x").write_text("")  # what the pattern would match in the cwd
    out = sweep("lr_x_model.sh", tmp_path, PYTHON=str(fake_python), ARGV_LOG=str(log), SWEEP_ROOT="sw",
                LRS="0.1", MODELS="resnet* resnet10t")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "skip lr0.1_resnet* (done)" in out.stdout
    assert [value_of(a, "MODEL.NAME") for a in points(log)] == ["resnet10t"]


def test_failed_point_listed_by_its_literal_name(tmp_path: Path, fake_python: Path) -> None:
    log = tmp_path / "argv.jsonl"
    (tmp_path / "resnet18x").write_text("")
    out = sweep("lr_x_model.sh", tmp_path, PYTHON=str(fake_python), ARGV_LOG=str(log), SWEEP_ROOT="sw",
                LRS="0.1", MODELS="resnet*", FAKE_RC="2")
    assert out.returncode == 1
    assert "  lr0.1_resnet* (exit code 2)" in out.stderr.splitlines()


@pytest.mark.slow
def test_real_point_gets_the_literal_model_name(tmp_path: Path) -> None:
    # train.py itself, started by the script: the model name resnet* is refused as not a timm model
    (tmp_path / "resnet18x").write_text("")
    out = sweep("lr_x_model.sh", tmp_path, "DATA.NUM_WORKERS", "0", PYTHON=sys.executable, SWEEP_ROOT="sw",
                LRS="0.1", MODELS="resnet*", timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "'resnet*' is not a timm model" in out.stderr
    assert any(line.startswith("  lr0.1_resnet* (exit code ") for line in out.stderr.splitlines())
    assert sorted(p.name for p in (tmp_path / "sw").iterdir()) == ["lr0.1_resnet*"]


@pytest.mark.parametrize("settings, fragment", [
    ({"JOBS": "0"}, "JOBS=0 is not a whole number of at least 1"),
    ({"JOBS": "two"}, "JOBS=two is not a whole number"),
    ({"NUM_GPUS": "-1"}, "NUM_GPUS=-1 is not a whole number of at least 0"),
    ({"LRS": "   "}, "LRS holds no value"),
    ({"MODELS": "\n\n"}, "MODELS holds no value"),
    ({"CFG": "nope.yaml"}, "CFG=nope.yaml is not a file"),
    ({"PYTHON": "no-such-python"}, "PYTHON=no-such-python is not a program"),
])
def test_sweep_setting_mistakes(settings: dict, fragment: str, tmp_path: Path) -> None:
    # JOBS=0 used to loop for ever waiting for a free slot; the others failed every point, one by one
    out = sweep("per_gpu.sh", tmp_path, timeout=20, SWEEP_ROOT="sw", **settings)
    assert_user_error(out, fragment)
    assert not (tmp_path / "sw").exists() or not any((tmp_path / "sw").iterdir())


def test_torchrun_nproc_mistake(tmp_path: Path) -> None:
    out = sweep("torchrun.sh", tmp_path, timeout=20, SWEEP_ROOT="sw", NPROC="0")
    assert_user_error(out, "NPROC=0 is not a whole number of at least 1")
    out = sweep("torchrun.sh", tmp_path, timeout=20, SWEEP_ROOT="sw", NPROC="1", MAX_RESTARTS="x")
    assert_user_error(out, "MAX_RESTARTS=x is not a whole number of at least 0")


def test_counts_with_leading_zero(tmp_path: Path, fake_python: Path) -> None:
    # bash arithmetic reads 08 as a bad octal number: the script used to stop with its own error
    log = tmp_path / "argv.jsonl"
    out = sweep("per_gpu.sh", tmp_path, PYTHON=str(fake_python), ARGV_LOG=str(log), SWEEP_ROOT="sw", JOBS="08",
                LRS="0.1", MODELS="a b")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "8 point(s) at a time" in out.stdout and len(points(log)) == 2


def test_sweep_root_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("my notes")
    out = sweep("lr_x_model.sh", tmp_path, timeout=20, SWEEP_ROOT="taken/sweep")
    assert_user_error(out, "SWEEP_ROOT=taken/sweep cannot be made a folder")
    assert (tmp_path / "taken").read_text() == "my notes"


@pytest.mark.parametrize("args, fragments", [
    (["--repeat", "0"], ["--repeat 0", "at least 1"]),
    (["--cfg", "nope.yaml"], ["nope.yaml not found"]),
    (["TRAIN.LR", "abc"], ["TRAIN.LR expects a number"]),
    (["--repeat", "x"], ["--repeat: invalid int value"]),  # argparse printed its usage: three lines
])
def test_overhead_mistakes(args: list[str], fragments: list[str]) -> None:
    # used to end in an IndexError or a CalledProcessError traceback from the timed child
    assert_user_error(run_tool("sweeps/overhead.py", args, timeout=60), *fragments)


@pytest.fixture
def two_gpus(tmp_path: Path) -> str:
    """A PATH whose nvidia-smi lists two GPUs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-a)'\necho 'GPU 1: Fake (UUID: GPU-b)'\n")
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize("visible, expected", [
    (None, {"0", "1"}),  # nvidia-smi's two GPUs, each running one point at a time
    ("", {""}),  # set but empty: every GPU stays hidden, the points run on the CPU
    ("3, 5", {"3", "5"}),
])
def test_gpus_given_to_points(visible: str | None, expected: set, tmp_path: Path, fake_python: Path,
                              two_gpus: str) -> None:
    log, cuda = tmp_path / "argv.jsonl", tmp_path / "cuda.jsonl"
    env = {"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {}
    out = sweep("per_gpu.sh", tmp_path, PYTHON=str(fake_python), ARGV_LOG=str(log), CUDA_LOG=str(cuda),
                SWEEP_ROOT="sw", LRS="0.1 0.05", MODELS="a b", PATH=two_gpus, NUM_GPUS="", **env)
    assert out.returncode == 0, out.stdout + out.stderr
    got = [json.loads(line) for line in cuda.read_text().splitlines()]
    assert len(got) == 4 and set(got) == expected  # which GPU gets which point depends on which ends first
    assert ("no GPU found" in out.stdout) == (visible == "")


def test_repeated_item_and_too_many_processes(tmp_path: Path, two_gpus: str) -> None:
    # LRS="0.1 0.1" used to run two points in one folder (side by side with JOBS=2: one refused as busy)
    assert_user_error(sweep("per_gpu.sh", tmp_path, SWEEP_ROOT="sw", LRS="0.1 0.05 0.1", JOBS="2"),
                      "LRS lists 0.1 twice")
    # three processes on two GPUs used to get CUDA_VISIBLE_DEVICES=0,1,0
    assert_user_error(sweep("torchrun.sh", tmp_path, SWEEP_ROOT="sw", NPROC="3", PATH=two_gpus, NUM_GPUS=""),
                      "NPROC=3 is more than the 2 GPU(s) found")
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("script, args, fragment", [
    ("lr_x_model.sh", ["TRAIN.EPOCHS", "2", "TRAIN.LR", "0.01"], "TRAIN.LR is set per point by this sweep"),
    ("per_gpu.sh", ["MODEL.NAME", "resnet50"], "give MODELS=... instead"),
    ("torchrun.sh", ["OUTPUT_DIR", "out"], "give SWEEP_ROOT=... instead"),
])
def test_extra_argument_that_would_override_the_swept_key(script: str, args: list[str], fragment: str,
                                                          tmp_path: Path, fake_python: Path) -> None:
    # the extra arguments come last, so they used to win: every point trained the same LR, model or folder
    log = tmp_path / "argv.jsonl"
    out = sweep(script, tmp_path, *args, PYTHON=str(fake_python), ARGV_LOG=str(log), SWEEP_ROOT="sw", NPROC="1")
    assert_user_error(out, fragment)
    assert points(log) == [] and not (tmp_path / "sw").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_points_that_share_a_folder_are_refused(script: str, tmp_path: Path, fake_python: Path) -> None:
    # hf-hub:timm/test_resnet and hf-hub:timm_test_resnet both became the folder lr0.1_hf-hub:timm_test_resnet:
    # side by side the second met the first's lock; one after another it trained on the first's run
    log = tmp_path / "argv.jsonl"
    out = sweep(script, tmp_path, PYTHON=str(fake_python), ARGV_LOG=str(log), SWEEP_ROOT="sw", NPROC="1", JOBS="2",
                LRS="0.1", MODELS="hf-hub:timm/test_resnet hf-hub:timm_test_resnet")
    line = assert_user_error(out, "lr0.1_hf-hub:timm/test_resnet", "lr0.1_hf-hub:timm_test_resnet",
                             "sw/lr0.1_hf-hub:timm_test_resnet")
    assert "one folder" in line and points(log) == [] and not (tmp_path / "sw").exists()


CHECKER = "check_points.py"


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("args, fragment", [
    (["TRAIN.EPOCS", "3"], "TRAIN.EPOCS"),  # a typo
    (["TRAIN.EPOCHS"], "TRAIN.EPOCHS"),  # an odd number of overrides
    (["TRAIN.EPOCHS", "many"], "TRAIN.EPOCHS"),  # a value of the wrong type
])
def test_every_point_is_checked_before_any_starts(script: str, args: list[str], fragment: str, tmp_path: Path,
                                                  fake_python: Path) -> None:
    # used to start every point, each failing on the same mistake (exit 1 after N failures)
    log, calls = tmp_path / "argv.jsonl", tmp_path / "calls.jsonl"
    out = sweep(script, tmp_path, *args, PYTHON=str(fake_python), ARGV_LOG=str(log), CALL_LOG=str(calls),
                SWEEP_ROOT="sw", NPROC="1", LRS="0.1 0.05", MODELS="a b")
    line = assert_user_error(out, fragment)
    assert line.startswith("sweep: point lr0.1_a: "), line
    assert points(log) == [] and not (tmp_path / "sw").exists()
    # one Python process built all four points' configs
    assert sum(CHECKER in " ".join(json.loads(c)) for c in calls.read_text().splitlines()) == 1


def test_good_points_are_checked_once_then_run(tmp_path: Path, fake_python: Path) -> None:
    log, calls = tmp_path / "argv.jsonl", tmp_path / "calls.jsonl"
    out = sweep("per_gpu.sh", tmp_path, "TRAIN.EPOCHS", "3", PYTHON=str(fake_python), ARGV_LOG=str(log),
                CALL_LOG=str(calls), SWEEP_ROOT="sw", JOBS="2", LRS="0.1 0.05", MODELS="a b")
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(points(log)) == 4
    assert sum(CHECKER in " ".join(json.loads(c)) for c in calls.read_text().splitlines()) == 1
