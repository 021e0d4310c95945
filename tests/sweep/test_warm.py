"""Warm segments (runner/sweep/warm.py, runner/sweep/warmserver.py): a segment forked from the worker's warm server
behaves as a new `python SCRIPT ARGS` process: its exit code and the signal that killed it come back, its output is
appended to its log, its stdin is not the server's requests, nothing it does is seen by the next segment, a stop
signal reaches it, a SIGTERM to the server itself (a job's process group) leaves the server serving, a lost server
reads as a kill (resumed, never a failure), and the server's imports make no CUDA call (a fork could not use it).
A segment's loader workers' fork server is a fork of the segment (no new interpreter importing torch again), goes
with it, and a warm run with loader workers paused and resumed equals a cold one trained straight."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from runner.sweep.warm import PRELOAD, WarmServer, preload_for
from tests.utils import ROOT, TRAIN, env, wait_until

SCRIPT = """\
import os, select, signal, sys, time
from pathlib import Path
print("argv", sys.argv[1:], flush=True)
ready = select.select([sys.stdin], [], [], 5)[0]  # /dev/null is at its end at once; the server's pipe would wait
print("stdin", repr(sys.stdin.read()) if ready else "not the null device", flush=True)
print("seen", os.environ.get("SEGMENT_MARK"), flush=True)
os.environ["SEGMENT_MARK"] = sys.argv[1]
if sys.argv[1] == "wait":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))
    Path(sys.argv[2]).write_text(str(os.getpid()))
    while True:
        time.sleep(0.02)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
print("err", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def server(tmp_path):
    """A warm server importing nothing (the script needs no torch), closed at the end."""
    (tmp_path / "seg.py").write_text(SCRIPT)
    warm = WarmServer(preload=[])
    warm.start()
    yield warm
    warm.close()


def test_exit_codes_output_and_no_state_between_segments(tmp_path, server):
    log = tmp_path / "seg.log"
    log.write_text("earlier\n")
    assert server.segment([str(tmp_path / "seg.py"), "3", "x y"], log).wait() == 3
    assert server.segment([str(tmp_path / "seg.py"), "0"], log).wait() == 0
    assert server.segment([str(tmp_path / "seg.py"), "kill"], log).wait() == -signal.SIGKILL
    lines = log.read_text().splitlines()
    assert lines[:6] == ["earlier", "argv ['3', 'x y']", "stdin ''", "seen None", "err", "argv ['0']"]
    assert lines.count("seen None") == 3  # the first segment's environment change is not the next one's
    assert server.proc.poll() is None


def test_a_stop_signal_reaches_the_segment_and_the_server_outlives_a_group_sigterm(tmp_path, server):
    pid_file = tmp_path / "pid"
    seg = server.segment([str(tmp_path / "seg.py"), "wait", str(pid_file)], tmp_path / "seg.log")
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), server.proc, "the segment's pid", 30)
    assert int(pid_file.read_text()) == seg.pid and seg.poll() is None
    os.kill(server.proc.pid, signal.SIGTERM)  # as a SIGTERM to the job's process group reaches it: held back
    seg.send_signal(signal.SIGTERM)
    assert seg.wait() == 75 and seg.poll() == 75
    assert server.proc.poll() is None
    assert server.segment([str(tmp_path / "seg.py"), "4"], tmp_path / "seg.log").wait() == 4


def test_a_lost_server_reads_as_a_kill_and_the_next_segment_restarts_it(tmp_path, server):
    pid_file = tmp_path / "pid"
    seg = server.segment([str(tmp_path / "seg.py"), "wait", str(pid_file)], tmp_path / "seg.log")
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), server.proc, "the segment's pid", 30)
    first = server.proc.pid
    os.kill(first, signal.SIGKILL)
    assert seg.wait() == -signal.SIGKILL  # the worker resumes such a segment (worker.finish), never fails it
    _wait(lambda: not _alive(seg.pid), "the segment ending with its server (it saves: exit 75)")
    assert server.segment([str(tmp_path / "seg.py"), "5"], tmp_path / "seg.log").wait() == 5
    assert server.proc.pid != first


def test_the_server_dies_with_its_worker(tmp_path):
    """kill -9 of the worker: its server goes, and the segment gets SIGTERM (it saves and exits 75)."""
    (tmp_path / "seg.py").write_text(SCRIPT)
    pid_file = tmp_path / "pid"
    script = ("import sys, time; from runner.sweep.warm import WarmServer; s = WarmServer(preload=[]); "
              f"seg = s.segment([{str(tmp_path / 'seg.py')!r}, 'wait', {str(pid_file)!r}], "
              f"{str(tmp_path / 'seg.log')!r}); print(s.proc.pid, flush=True); time.sleep(600)")
    worker = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    server = int(worker.stdout.readline())
    wait_until(lambda: pid_file.exists() and pid_file.read_text(), worker, "the segment's pid", 60)
    segment = int(pid_file.read_text())
    worker.kill()
    worker.wait()
    _wait(lambda: not _alive(server) and not _alive(segment), "the server and the segment gone")


@pytest.mark.slow
def test_the_server_imports_make_no_cuda_call():
    code = ("import importlib, json, sys, torch; calls = []; real = torch._C._cuda_getDeviceCount\n"
            "torch._C._cuda_getDeviceCount = lambda: calls.append(1) or real()\n"
            "[importlib.import_module(m) for m in json.loads(sys.argv[1])]\n"
            "print(len(calls), torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(PRELOAD)], cwd=ROOT, env=env(), text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["0", "False"], out.stderr


def _wait(ready, what: str, timeout: float = 30) -> None:
    """Block until `ready()`, failing after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_stop_while_the_server_still_imports_reaches_the_segment(tmp_path):
    """SIGTERM to a worker whose warm server is still importing (its first segment asked for): the segment, once
    forked, is stopped at once (the fake trainer dies of it before training: nothing trained, the job released),
    and the worker exits 75."""
    from runner.sweep.search import load_search
    from runner.sweep.study import open_study
    from tests.sweep.test_search import FAKE, search_file

    (tmp_path / "slowimport.py").write_text("import time\ntime.sleep(3)  # an import that takes a while\n")
    path = search_file(tmp_path, "trials: 2\nseed: 1\n")
    script = ("import sys; from pathlib import Path; from runner.sweep import worker; "
              "from runner.sweep.search import load_search; "
              f"worker.TRAIN_PY = Path({str(FAKE)!r}); worker.WARM_PRELOAD = ['slowimport']; "
              "sys.exit(worker.run_worker(load_search(sys.argv[1]), poll_s=0.1))")
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"), start_new_session=True)
    for line in proc.stdout:
        if line.startswith("search: trial 0: new"):
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75, out
    assert not (tmp_path / "out" / "trial_0" / "calls.txt").exists()  # it never trained
    job = open_study(load_search(str(path)), create=False).trials[0].user_attrs["job"]
    assert job["worker"] is None  # released: the next worker resumes it


# A segment that starts its loader fork server warm (start_server's warm start, as start_early does in a warm
# segment), has one worker from it report, then waits to be killed; argv[1]: where its report goes
FORKED = """\
import json, multiprocessing, os, sys, time
from pathlib import Path


def report(queue):
    queue.put({"ppid": os.getppid(), "owner": multiprocessing.parent_process().pid,
               "main": sys.modules["__main__"].__name__})


if __name__ == "__main__":
    from multiprocessing import forkserver
    from runner.data.workerstart import start_server
    start_server(["json"], warm=True)
    ctx = multiprocessing.get_context("forkserver")
    queue = ctx.Queue()
    worker = ctx.Process(target=report, args=(queue,))
    worker.start()
    seen = queue.get(timeout=60)
    worker.join()
    seen.update(segment=os.getpid(), server=forkserver._forkserver._forkserver_pid)
    Path(sys.argv[1] + ".tmp").write_text(json.dumps(seen))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    while True:
        time.sleep(0.05)
"""


def test_a_segments_loader_fork_server_is_forked_from_it_and_goes_with_it(tmp_path, server):
    """The server is a fork (its command line the warm server's, not `python -c ...forkserver`), its workers run
    with the segment as their owner and find its script as a new server's workers do, and a SIGKILL of the
    segment ends it (it holds no end of its own alive pipe)."""
    (tmp_path / "forked.py").write_text(FORKED)
    info = tmp_path / "info.json"
    seg = server.segment([str(tmp_path / "forked.py"), str(info)], tmp_path / "seg.log")
    wait_until(info.exists, server.proc, "the segment's report", 60)
    got = json.loads(info.read_text())
    assert _cmdline(got["server"]) == _cmdline(server.proc.pid), (tmp_path / "seg.log").read_text()
    assert got["ppid"] == got["server"] and got["owner"] == got["segment"] == seg.pid
    assert got["main"] == "__mp_main__"
    os.kill(seg.pid, signal.SIGKILL)
    assert seg.wait() == -signal.SIGKILL
    _wait(lambda: not _alive(got["server"]), "the fork server gone with its segment")


def _cmdline(pid: int) -> list[str]:
    """The command line of process `pid`."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


# tools/train.py's early start for a folder run with 2 loader workers: the command line of the server it started
EARLY = """\
import json, sys
from multiprocessing import forkserver
from runner.config import load_config
from runner.data.workerstart import start_early
cfg, _ = load_config(["DATA.NAME", "folder", "DATA.NUM_WORKERS", "2"], check_paths=False)
start_early(cfg)
with open(f"/proc/{forkserver._forkserver._forkserver_pid}/cmdline", "rb") as f:
    print(json.dumps(f.read().decode().split("\\0")), flush=True)
"""


@pytest.mark.slow
def test_the_early_start_forks_in_a_warm_segment_and_nowhere_else(tmp_path):
    """In a warm segment the run's early start forks the server; a process that imported torch itself (a tool,
    a test calling main in-process) still starts a new interpreter: only the warm server's segments are known
    to fork safely at that point."""
    (tmp_path / "early.py").write_text(EARLY)
    log = tmp_path / "seg.log"
    warm = WarmServer(preload=["torch", "runner.config", "runner.data.workerstart"])
    try:
        assert warm.segment([str(tmp_path / "early.py")], log).wait() == 0, log.read_text()
        assert json.loads(log.read_text().splitlines()[-1]) == _cmdline(warm.proc.pid)
    finally:
        warm.close()
    out = subprocess.run([sys.executable, "-c", "import sys, torch; exec(open(sys.argv[1]).read())", str(tmp_path /
                          "early.py")], cwd=ROOT, env=env(), text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "from multiprocessing.forkserver import main" in " ".join(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.slow
def test_a_warm_folder_run_with_loader_workers_paused_and_resumed_equals_a_cold_straight_run(tmp_path, monkeypatch):
    """Bit-identical: every step's loss, the evaluations, the final checkpoint (the workers' random crops, erasing
    and RandAugment seeded as from a new server's workers), and nothing on the segments' stderr."""
    from tests.data.fixtures import export_digits_jpegs
    from tests.data.indexed_runs import RUN, one_thread
    from tests.engine.test_resume import assert_same_run

    data = export_digits_jpegs(tmp_path / "digits", size=16, per_class=20)
    args = [*RUN, "DATA.NAME", "folder", "DATA.ROOT", str(data), "TRAIN.EPOCHS", "2"]
    cold = subprocess.run([sys.executable, TRAIN, *args, "OUTPUT_DIR", str(tmp_path / "cold")], cwd=ROOT,
                          env=one_thread(env()), capture_output=True, text=True, timeout=300)
    assert cold.returncode == 0, cold.stderr[-3000:]
    for key, value in one_thread({}).items():  # the warm server's segments compute with the cold run's threads
        monkeypatch.setenv(key, value)
    warm, log = WarmServer(preload_for("folder")), tmp_path / "warm.log"
    try:
        run = [TRAIN, *args, "OUTPUT_DIR", str(tmp_path / "warm")]
        assert warm.segment([*run, "--pause-after-epoch", "1"], log).wait() == 0, log.read_text()[-3000:]
        assert warm.segment(run, log).wait() == 0, log.read_text()[-3000:]
    finally:
        warm.close()
    text = log.read_text()
    assert "paused" in text and "resumed from" in text and "Traceback" not in text and "Warning" not in text
    assert_same_run(tmp_path / "warm", tmp_path / "cold")
