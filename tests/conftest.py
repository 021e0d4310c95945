"""Shared test setup (the runner is installed by requirements.txt; pytest's pythonpath makes `tests` importable).

The test process is an entry point like tools/*.py: runner.process.startup.prepare() runs before any test imports torch.
"""
import logging
import os
import signal
import sys
import threading
import warnings

import pytest

from runner.process.startup import prepare

prepare()

from tests.slurm_cluster import slurm_cluster  # noqa: F401  (the session's SLURM for tests/test_slurm.py)
from tests.utils import ROOT, TINY, call_main, give_back_loggers, logger_state, run_tool


@pytest.fixture
def signal_handlers():
    """SIGTERM, SIGUSR1 and SIGINT given back after the test (a run's Preemption or a search worker takes them)."""
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    yield
    for s, handler in old.items():
        signal.signal(s, handler)


@pytest.fixture(scope="session")
def finished_digits(tmp_path_factory):
    """(OUTPUT_DIR, the finished process) of one tiny digits run, 2 epochs of 22 steps, trained once for every test
    that reads a finished run (tests/engine/test_engine.py, tests/rundir/test_rules.py, tests/test_model_setup.py):
    a test that would change it works on a copy."""
    out = tmp_path_factory.mktemp("finished_digits") / "run"
    r = run_tool("train.py", ["--cfg", str(ROOT / "configs" / "digits" / "resnet18.yaml"), *TINY, "TRAIN.EPOCHS", "2",
                              "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, r


@pytest.fixture
def in_process(capfd, monkeypatch, signal_handlers, tmp_path_factory):
    """`in_process(tool, args)`: tools/<tool>'s main(args) in this process (tests.utils.call_main), run from the
    repository as run_tool runs it; what a tool may change in its process is given back after the test (the
    environment, the runner's log handlers and Python's warnings capture, torch's thread count, signal handlers),
    and a thread it left running, a file it left open in the tests' folders (a run lock, a log.txt) or a process
    group it left fails the test: a refusal made after a run's claim belongs in a process of its own, which its
    exit cleans up."""
    import tqdm

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread: tqdm's, it would outlive the tool
    environ, threads = dict(os.environ), set(threading.enumerate())
    files = _open_files(tmp_path_factory.getbasetemp())
    loggers = logger_state()
    shown, kept = warnings.showwarning, logging._warnings_showwarning
    torch_threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
    yield lambda tool, args: call_main(tool, args, capfd)
    give_back_loggers(loggers)
    warnings.showwarning, logging._warnings_showwarning = shown, kept
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(torch_threads or sys.modules["torch"].get_num_threads())
    os.environ.clear()
    os.environ.update(environ)
    left = [t for t in threading.enumerate() if t not in threads and (t.join(5) or t.is_alive())]
    assert not left, f"threads left running by the tool: {left}"
    left_open = _open_files(tmp_path_factory.getbasetemp()) - files
    assert not left_open, f"files left open by the tool: {sorted(left_open)}"
    group = sys.modules.get("torch.distributed")
    assert not (group and group.is_available() and group.is_initialized()), "a process group left by the tool"


def _open_files(under) -> set[str]:
    """The files under `under` that this process holds open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target.startswith(str(under)):
            found.add(target)
    return found


