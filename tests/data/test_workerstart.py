"""The loader workers' fork server: started by tools/train.py before the run imports torch (only where the run
will have workers from it), and gone as soon as the run is, so that a reader of the run's output is not kept
waiting by the server's interpreter teardown."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.data.fixtures import export_digits_jpegs
from tests.utils import ROOT, TRAIN, env, forked_worker_script

# a fresh process: the early start for a config, whether this process had imported torch by then, and whether the
# server it started is alive (its pid is multiprocessing's own record)
PROBE = """
import json, os, sys
from runner.process.startup import prepare
prepare()
from runner.config import load_config
from runner.data.workerstart import start_early
cfg, _ = load_config(sys.argv[1:], check_paths=False)
started = start_early(cfg)
torch_loaded = "torch" in sys.modules
from multiprocessing import forkserver
pid = forkserver._forkserver._forkserver_pid
alive = pid is not None and os.path.exists(f"/proc/{pid}")
print(json.dumps({"started": started, "torch": torch_loaded, "alive": alive}))
"""


def _probe(*overrides: str) -> dict:
    """PROBE's report for the config with `overrides`."""
    out = subprocess.run([sys.executable, "-c", PROBE, *overrides], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("overrides, started", [
    (["DATA.NAME", "folder", "DATA.NUM_WORKERS", "2"], True),
    (["DATA.NAME", "shards", "DATA.NUM_WORKERS", "1"], True),
    (["DATA.NAME", "folder", "DATA.NUM_WORKERS", "0"], False),  # no workers: no server
    (["DATA.NAME", "folder", "DATA.NUM_WORKERS", "2", "DATA.WORKER_START", "fork"], False),
    (["DATA.NAME", "digits", "DATA.NUM_WORKERS", "2"], False),  # tensors made in the training process
])
def test_the_server_starts_before_torch_only_where_the_run_will_have_workers(overrides, started):
    report = _probe(*overrides)
    assert report == {"started": started, "torch": False, "alive": started}


@pytest.mark.slow
def test_the_runs_output_ends_with_the_run_not_with_the_servers_teardown(tmp_path: Path):
    """Whoever reads a run's output to its end (a pipe, `| tee`, subprocess.run) gets the end as the run exits:
    the server, which holds the run's stdout, leaves at once (its torch interpreter's teardown took 1.3 s)."""
    data = export_digits_jpegs(tmp_path / "digits", size=16, per_class=10)
    cmd = [sys.executable, TRAIN, "--cfg", str(ROOT / "configs" / "digits" / "test_resnet.yaml"), "DATA.NAME", "folder",
           "DATA.ROOT", str(data), "DATA.IMG_SIZE", "16", "DATA.NUM_WORKERS", "2", "TRAIN.EPOCHS", "1",
           "LOG.TENSORBOARD", "False", "OUTPUT_DIR", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env())
    ends: dict[str, float] = {}

    def read(name: str, stream) -> None:
        stream.read()
        ends[name] = time.monotonic()

    readers = [threading.Thread(target=read, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    assert proc.wait(timeout=300) == 0
    exited = time.monotonic()
    for reader in readers:
        reader.join(timeout=60)
    assert max(ends.values()) - exited < 1.0, (ends, exited)


# the folder source's preload; the worker reports which of these it holds
SERVER_MODULES = forked_worker_script(["torch", "runner.data.folder.dataset"], """
def report(queue):
    queue.put(sorted(m for m in ("wandb", "timm", "torch") if m in sys.modules))
""")


def test_the_server_skips_timms_own_import_of_wandb(tmp_path: Path):
    """timm imports wandb at `import timm` where it is installed (0.4 s of the server's preload here); the server
    answers it "not installed" as the run does, so a worker forked from it holds timm but not wandb."""
    pytest.importorskip("wandb")
    script = tmp_path / "tool.py"
    script.write_text(SERVER_MODULES)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=ROOT,
                         env=env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["timm", "torch"]


# A forkserver queue's semaphore unlinked by its feeder thread (a collection there dropped the last reference),
# the thread then descheduled for 0.5 s before it tells the resource tracker, as on a loaded machine, while the
# main process exits: argv[1] the exit (the interpreter's teardown, or run_script's quick exit after torch),
# argv[2] "quiet" where the process called quiet_exit (worker_options does, for forkserver and spawn loaders)
FEEDER_RACE = """
import sys, threading, time
from multiprocessing import get_context, resource_tracker

if sys.argv[1] == "run_script":
    import torch  # run_script's quick exit is for a process that imported torch
    from runner.errors import run_script
if sys.argv[2] == "quiet":
    from runner.data.workerstart import quiet_exit
    quiet_exit()
in_cleanup = threading.Event()
unregister = resource_tracker.unregister


def descheduled(name, rtype):
    if threading.current_thread().name == "QueueFeederThread":
        in_cleanup.set()
        time.sleep(0.5)
    unregister(name, rtype)


resource_tracker.unregister = descheduled


class Holder:
    '''Pickled as 0: the feeder thread drops the last reference to the lock once it has pickled it.'''
    def __init__(self, lock):
        self.lock = lock

    def __reduce__(self):
        return (int, (0,))


ctx = get_context("forkserver")
queue = ctx.Queue()
queue.cancel_join_thread()  # as DataLoader does with its index queues
queue.put(Holder(ctx.Lock()))
assert in_cleanup.wait(60)
if sys.argv[1] == "run_script":
    run_script(lambda: sys.exit(0))
"""


@pytest.mark.parametrize("exit_path", ["teardown", "run_script"])
def test_an_exit_waits_for_a_feeder_thread_that_is_freeing_a_semaphore(exit_path: str, tmp_path: Path):
    """The exit waits for the feeder thread, and the tracker has nothing to say: without quiet_exit it printed
    its warnings (a leaked semaphore, and `No such file or directory` on unlinking it) on the run's stderr after
    the process had ended (CI, tools/predict.py)."""
    script = tmp_path / "race.py"
    script.write_text(FEEDER_RACE)
    results = {}
    for how in ("plain", "quiet"):
        res = subprocess.run([sys.executable, str(script), exit_path, how], capture_output=True, text=True,
                             timeout=180, cwd=ROOT, env=env())
        assert res.returncode == 0, res.stderr[-2000:]
        results[how] = res.stderr
    assert "resource_tracker" in results["plain"] and "No such file or directory" in results["plain"]
    assert results["quiet"] == ""
