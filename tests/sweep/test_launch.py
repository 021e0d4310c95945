"""`python -m runner.sweep run` (runner/sweep/launch.py, the launcher tools/sweeps/run.sh execs): its options, the
stop signals it passes on, and the exit codes of points killed by a signal.

The points are a fake interpreter's (PYTHON): each notes its start, whether SIGINT reached it as ignored, and each
SIGTERM it gets, then waits for one and exits 75 as a real point saves and exits; so these take a second.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_sweep_trust import GRID, sweep_file
from tests.utils import ROOT, assert_user_error, wait_until

FAKE = f"""#!{sys.executable}
import json, os, signal, sys, time
args = sys.argv[1:]
if not any(a.endswith("train.py") for a in args):
    os.execv(sys.executable, [sys.executable, *args])  # the table: the real interpreter
name = args[args.index("OUTPUT_DIR") + 1].rsplit("/", 1)[-1]
notes = os.path.join(os.environ["NOTES"], name)
def note(what):
    with open(notes, "a") as f:
        f.write(json.dumps(what) + "\\n")
if os.environ.get("FAKE_KILL"):
    os.kill(os.getpid(), int(os.environ["FAKE_KILL"]))
signal.signal(signal.SIGTERM, lambda *_: (note(["TERM"]), sys.exit(75)))
with open(notes + ".tmp", "w") as f:  # the notes appear whole, once a SIGTERM would be noted
    f.write(json.dumps(["start", signal.getsignal(signal.SIGINT) == signal.SIG_IGN]) + "\\n")
os.replace(notes + ".tmp", notes)
while True:
    time.sleep(60)  # until the SIGTERM, whose handler exits
"""


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    """The environment of a launcher whose points are the fake interpreter above (on the CPU)."""
    path = tmp_path / "fake python"
    path.write_text(FAKE)
    path.chmod(0o755)
    (tmp_path / "notes").mkdir()
    env = dict(os.environ, PYTHON=str(path), NOTES=str(tmp_path / "notes"), NUM_GPUS="0", PYTHONUNBUFFERED="1")
    for key in ("CUDA_VISIBLE_DEVICES", "JOBS", "NPROC", "SWEEP_ROOT"):
        env.pop(key, None)
    return env


def launch(env: dict[str, str], *args: str) -> subprocess.Popen:
    """The launcher in its own process group (as a terminal's foreground job), its output piped."""
    return subprocess.Popen([sys.executable, "-m", "runner.sweep", "run", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def notes(env: dict[str, str]) -> dict[str, list]:
    """Each point's notes, by its folder name."""
    return {p.name: [json.loads(x) for x in p.read_text().splitlines()] for p in Path(env["NOTES"]).iterdir()
            if p.suffix != ".tmp"}


def end(proc: subprocess.Popen) -> tuple[str, str]:
    """The launcher's output once it has ended (its group killed if it does not within a minute)."""
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


@pytest.mark.parametrize("how", ["SIGTERM to the launcher", "Ctrl-C to the group"])
def test_a_stop_reaches_each_running_point_once_and_starts_no_more(tmp_path: Path, fake: dict, how: str) -> None:
    proc = launch(fake, "--jobs", "2", str(sweep_file(tmp_path, GRID)))
    wait_until(lambda: len(notes(fake)) == 2, proc, "two points started")
    if how == "Ctrl-C to the group":
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the launcher and every point get SIGINT
    else:
        os.kill(proc.pid, signal.SIGTERM)
    out, err = end(proc)
    assert proc.returncode == 75, out + err
    got = notes(fake)
    # a point ignores SIGINT (a shell's background job does): its one stop is the launcher's SIGTERM
    assert len(got) == 2 and all(n == [["start", True], ["TERM"]] for n in got.values()), got
    assert "sweep: stopping; running points save their state" in err and "sweep: stopped; re-run" in err, err
    assert out.count("sweep: start") == 2 and len(list((tmp_path / "sw" / "logs").iterdir())) == 2


def test_a_point_killed_by_a_signal_fails_with_the_shells_exit_code(tmp_path: Path, fake: dict) -> None:
    proc = launch({**fake, "FAKE_KILL": str(int(signal.SIGKILL))}, str(sweep_file(tmp_path, GRID)))
    out, err = end(proc)
    assert proc.returncode == 1, out + err
    assert "4 point(s) failed" in err and "  lr=0.1,model.name=a (exit code 137)" in err.splitlines(), err
    assert f"sweep: {tmp_path / 'sw'}, 1 point(s) at a time" in out  # one at a time: no GPU, no JOBS


def test_options_win_over_the_environment_and_are_named_as_given(tmp_path: Path, fake: dict) -> None:
    path = str(sweep_file(tmp_path, GRID))
    env = {**fake, "JOBS": "0", "FAKE_KILL": str(int(signal.SIGTERM))}  # JOBS=0 alone would be refused
    proc = launch(env, "--jobs", "3", "--root", str(tmp_path / "elsewhere"), path)
    out, err = end(proc)
    assert proc.returncode == 1 and f"sweep: {tmp_path / 'elsewhere'}, 3 point(s) at a time" in out, out + err
    assert "(exit code 143)" in err
    for args, fragment in ((["--jobs", "0", path], "--jobs 0 is not a whole number of at least 1; e.g. --jobs 2"),
                           (["--nproc=x", path], "--nproc x is not a whole number"),
                           (["--jobs"], "--jobs: unknown option or one without a value"),
                           (["--jobz", "2", path], "--jobz: unknown option"),
                           ([], "no sweep file given; usage: python -m runner.sweep run FILE")):
        line = assert_user_error(subprocess.run([sys.executable, "-m", "runner.sweep", "run", *args], cwd=ROOT,
                                                env=fake, capture_output=True, text=True, timeout=60), fragment)
        assert line.startswith("sweep: "), line
