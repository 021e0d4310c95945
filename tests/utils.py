"""Helpers for tests that drive the real command-line tools, in subprocesses or through their main(argv)."""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from runner.process.threads import MARKER

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "tools" / "train.py")

# A tiny, quick digits run: 16 px, a small ResNet, one short epoch.
TINY = ["MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "64", "TRAIN.EPOCHS", "1",
        "LOG.PERIOD", "5", "TRAIN.LR", "0.05", "DATA.NUM_WORKERS", "0"]


def forked_worker_script(preload: list[str], body: str) -> str:
    """A tool-like script: it prepares, starts the loader workers' fork server with `preload`, forks one worker
    from it that runs `report(queue)` (defined in `body`) and prints, as JSON, what that put in the queue."""
    return f"""
import json, sys
from runner.process.startup import prepare
prepare()
import multiprocessing as mp
from runner.data.workerstart import start_server
{body}

if __name__ == "__main__":
    start_server({preload!r})
    ctx = mp.get_context("forkserver")
    queue = ctx.Queue()
    worker = ctx.Process(target=report, args=(queue,))
    worker.start()
    print(json.dumps(queue.get(timeout=120)))
    worker.join()
"""


def env(**extra: str) -> dict:
    """The test environment: one thread per process, pinned (so two runs a test compares use the same count on a
    loaded machine too), no terminal progress bar."""
    # the empty marker makes OMP_NUM_THREADS=1 the user's: if this process chose 1 thread itself, the marker it
    # inherited would say 1 is the runner's own choice, and each child would choose again from the load it sees
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **{MARKER: ""})
    e.update(extra)
    return e


def run_tool(tool: str, args: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run tools/<tool> with the venv's python; capture text output."""
    return subprocess.run([sys.executable, str(ROOT / "tools" / tool), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=kw.pop("env", env()), **kw)


_TOOLS: dict[str, ModuleType] = {}


def tool_module(tool: str) -> ModuleType:
    """tools/<tool> (a name, or TRAIN's whole path) imported from its path once per test process (tools/ is no
    package; the prepare() its import runs is a no-op after conftest's)."""
    tool = Path(tool).name
    if tool not in _TOOLS:
        path = ROOT / "tools" / tool
        spec = importlib.util.spec_from_file_location(f"tools_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _TOOLS[tool] = module
    return _TOOLS[tool]


def call_main(tool: str, args: list[str], capfd) -> subprocess.CompletedProcess:
    """tools/<tool>'s main(args) in this process, answered as run_tool answers: the exit code that runner.errors.cli
    ends it with, and what reached file descriptors 1 and 2 meanwhile (use the `in_process` fixture, which gives
    back what a tool may change). Python's warnings are pytest's here, not the tool's stderr: a test of a refusal
    that a warning may come with runs the tool in a process of its own."""
    import pytest

    capfd.readouterr()  # what the test printed before is not the tool's
    with pytest.raises(SystemExit) as ended:
        tool_module(tool).main(list(args))
    out = capfd.readouterr()
    return subprocess.CompletedProcess([tool, *args], ended.value.code, out.out, out.err)


def read_jsonl(path: Path) -> list[dict]:
    """Every line of a metrics.jsonl."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def torchrun(args: list[str]) -> list[str]:
    """The argv prefix to launch tools under torchrun with this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", *args]


def proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], ppid [1]); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def is_alive(pid: int) -> bool:
    """True while a process exists and is not a zombie."""
    st = proc_stat(pid)
    return st is not None and st[0] != "Z"


def proc_env(pid: int) -> dict[str, str]:
    """The environment a process was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def assert_user_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """A user mistake's contract: exit 2, exactly one line on stderr, no traceback; returns that line.

    With MISTAKES_LOG set, each call also appends a JSON row (test, exit code, stderr lines, traceback seen)
    to that file first, so that benchmarks/mistakes_table.py can print the table of every bad input tried.
    """
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    traceback = "Traceback" in proc.stderr or "Traceback" in proc.stdout
    if os.environ.get("MISTAKES_LOG"):
        row = {"test": os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0], "rc": proc.returncode,
               "stderr_lines": len(lines), "traceback": traceback, "line": lines[-1] if lines else ""}
        with open(os.environ["MISTAKES_LOG"], "a") as f:
            f.write(json.dumps(row) + "\n")
    assert proc.returncode == 2, f"exit {proc.returncode}, stderr:\n{proc.stderr[-3000:]}"
    assert not traceback, proc.stderr[-3000:]
    assert len(lines) == 1, f"{len(lines)} stderr lines:\n{proc.stderr[-3000:]}"
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


def wait_file(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Block until `path` exists (a file the process under test writes), failing if `proc` ends first."""
    wait_until(path.exists, proc, f"{path} exists", timeout)


def wait_last_checkpoint(out: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Block until a resume of `out` would start at `step` or later: checkpoints/last.pth is the file of such a
    step. (A step file appears first; save_checkpoint reads it back, then links last.pth to it, and a resume tries
    last.pth first.)"""
    from runner.rundir.checkpoints import step_files
    from runner.rundir.layout import LAST, checkpoints

    d = checkpoints(out)

    def linked() -> bool:
        try:
            return any(s >= step and os.path.samefile(d / LAST, p) for s, p in step_files(d))
        except FileNotFoundError:  # no last.pth yet, or a step file pruned meanwhile
            return False

    wait_until(linked, proc, f"{d / LAST} is the checkpoint of step {step} or later", timeout)


def wait_until(ready: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    """Block until `ready()` (a state the process under test brings about), failing if `proc` ends first."""
    end = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the process ended (rc {proc.returncode}) before {what}"
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        time.sleep(0.01)


def merge_pairs(cfg, pairs: list) -> None:
    """yacs's merge_from_list with the runner's own reading of each value (KEY VALUE, a value as text or as
    Python): "auto" keys (DATA.MEAN, ...) take a list as the command line does, where yacs would refuse its type."""
    from runner.config.keypath import lookup, set_value
    from runner.config.schema import coerce_value

    for key, value in zip(pairs[::2], pairs[1::2], strict=True):
        raw = value if isinstance(value, str) else None
        if isinstance(value, str):
            import yaml

            value = yaml.safe_load(value) if value.strip() else value
        set_value(cfg, key, coerce_value(key, value, lookup(key), raw))


def logger_state() -> dict[str, tuple]:
    """The handlers, level and propagation of the loggers a tool sets up, and runner.sinks.logs's own record of
    the set-up (a spawned loader worker repeats it)."""
    from runner.sinks import logs

    names = ("runner", "py.warnings", "")
    state = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level, logging.getLogger(n).propagate)
             for n in names}
    return {**state, "setup": logs._SETUP}


def give_back_loggers(state: dict[str, tuple]) -> None:
    """Put the loggers back as `logger_state` found them, closing the handlers added since (log.txt's file)."""
    from runner.sinks import logs

    logs._SETUP = state.pop("setup")
    for name, (handlers, level, propagate) in state.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate
    logs._BEFORE_LOG_FILE.records.clear()
