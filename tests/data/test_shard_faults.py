"""DATA.NAME shards read over HTTP from a server that fails: transient faults (500, a refused connection, a
server that accepts and never answers) are retried for DATA.RETRY_S, then the run saves and exits 75 and the
same command continues it; a 404 stays a user mistake; every shard reader (curl) is closed and reaped."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest
import torch

from runner.config import load_config
from runner.data.shards import build_shards
from runner.data.shards.index import classify
from runner.distributed import Dist
from runner.errors import one_line
from tests.data.fixtures import export_digits_jpegs
from tests.engine.test_resume import Launch, train_rows
from tests.utils import ROOT, TRAIN, env, proc_stat, run_tool

CPU = torch.device("cpu")
DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
BATCHES = 50 // 8  # 5 train shards of 10 samples, batches of 8


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """60 digits at 8 px: 5 train shards of 10, 1 val shard of 10."""
    base = tmp_path_factory.mktemp("faults")
    jpegs = export_digits_jpegs(base / "jpegs", size=8, per_class=6)
    done = run_tool("make_shards.py", [str(jpegs), str(base / "shards"), "--shard-size", "10"], timeout=120)
    assert done.returncode == 0, done.stderr
    return base / "shards"


class FaultServer:
    """tests/data/shard_server.py over `root` with a control file (the fault to inject), stopped by pid."""

    def __init__(self, root: Path, folder: Path):
        self.log, self.control = folder / "served.log", folder / "control.json"
        self.p = subprocess.Popen([sys.executable, "-m", "tests.data.shard_server", str(root), str(self.log),
                                   str(self.control)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env())
        self.url = f"http://127.0.0.1:{int(self.p.stdout.readline())}"

    def fault(self, **control) -> None:
        """Inject a fault from the next request on ({} serves normally again)."""
        self.control.write_text(json.dumps(control))

    def requests(self, prefix: str) -> list[str]:
        """The log rows (path status bytes) of requests starting with `prefix`."""
        rows = self.log.read_text().splitlines() if self.log.exists() else []
        return [row for row in rows if row.startswith(prefix)]

    def stop(self) -> None:
        """Kill the server process (ours, by pid) and reap it."""
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.wait(10)


@pytest.fixture
def server(small, tmp_path):
    srv = FaultServer(small, tmp_path)
    yield srv
    srv.stop()


def dead_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released: a connection is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(root: str, *extra: str):
    """Shards over `root`: 8 px, batch 8, 2 streams read in blocks of 4 (a shard opens every few batches)."""
    cfg, _ = load_config(["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.NAME", "shards", "DATA.ROOT", root,
                          "DATA.IMG_SIZE", "8", "DATA.BATCH_SIZE", "8", "DATA.SHARD_STREAMS", "2",
                          "DATA.SHARD_WINDOW", "4", "DATA.NUM_WORKERS", "0", *extra])
    return cfg


def train_loader(cfg):
    """The training loader of a single process."""
    train, _, _ = build_shards(cfg, Dist(0, 1, 0, CPU), 8)
    return train


def epoch(loader, n: int | None = None, epoch_index: int = 0) -> list:
    """The first `n` batches (all by default) of an epoch."""
    loader.set_epoch(epoch_index, 0)
    return list(islice(iter(loader), n))


# ---------------------------------------------------------------------------------------------------------
# Transient faults: retried, then DataUnavailable (exit 75) naming the shard; a 404 stays a user mistake
# ---------------------------------------------------------------------------------------------------------
RETRY = ["DATA.RETRY_S", "60"] if "DATA.RETRY_S" in open(ROOT / "runner/config/defaults.py").read() else []


def test_server_errors_for_a_while_are_ridden_out(small, server):
    want = epoch(train_loader(config(str(small))))
    server.fault(fault="500", prefix="/train/train-", after=2, count=4)  # more than DATA.SHARD_RETRIES tries
    got = epoch(train_loader(config(server.url, *RETRY)))
    assert len([row for row in server.requests("/train/train-") if " 500 " in row]) == 4
    for (x, y), (x2, y2) in zip(want, got, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


FAULTS = ["500", "refused", "hang"]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fault", FAULTS)
def test_a_lasting_fault_is_data_unavailable_naming_the_shard(server, fault, workers):
    extra = ["DATA.RETRY_S", "2", "DATA.NUM_WORKERS", str(workers)]
    if fault == "refused":  # the index from the server, the shards from a port nothing listens on
        extra += ["DATA.SHARD_URL", f"http://127.0.0.1:{dead_port()}/{{split}}/{{name}}"]
    else:
        server.fault(fault=fault, prefix="/train/train-", after=2)
    loader = train_loader(config(server.url, *extra))
    with pytest.raises(Exception) as caught:
        epoch(loader)
    error = caught.value
    assert type(error).__name__ == "DataUnavailable" and error.exit_code == 75, repr(error)
    line = one_line(str(error))
    assert "\n" not in line and re.search(r"shard \S+/train/train-0000\d\d\.tar", line), line
    words = {"500": "500", "refused": "connect", "hang": "no byte"}[fault]
    assert words in line and "DATA.RETRY_S 2" in line, line


def test_a_missing_shard_is_still_a_user_mistake(server):
    loader = train_loader(config(server.url, "DATA.SHARD_URL", "{root}/{split}/missing-{name}",
                                 "DATA.SHARD_RETRIES", "1"))
    with pytest.raises(Exception) as caught:
        epoch(loader)
    assert type(caught.value).__name__ == "UserError" and "404" in str(caught.value), repr(caught.value)


# ---------------------------------------------------------------------------------------------------------
# Shard readers: closed and reaped, not left to the garbage collector
# ---------------------------------------------------------------------------------------------------------
def curl_children() -> list[str]:
    """The state ('S', 'Z', ...) of each curl child of this process."""
    states = []
    for task in Path("/proc/self/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            st = proc_stat(int(pid))
            if comm == "curl" and st is not None:
                states.append(st[0])
    return states


def readers_of(url: str) -> int:
    """Live processes anywhere whose command line names `url` (curls of loader workers too)."""
    n = 0
    for d in Path("/proc").iterdir():
        try:
            n += d.name.isdigit() and url.encode() in (d / "cmdline").read_bytes()
        except OSError:
            pass
    return n


def test_readers_are_closed_each_epoch_and_when_stopped_early(server):
    loader = train_loader(config(server.url))
    most = 0
    for e in range(3):
        loader.set_epoch(e, 0)
        for _ in loader:
            most = max(most, len(curl_children()))
        assert curl_children() == [], f"epoch {e}: curl readers left: {curl_children()}"
    assert most <= 3, most  # one per stream, and a boundary shard's two readers at most for a moment
    loader.set_epoch(3, 0)
    batches = iter(loader)
    next(batches)
    assert curl_children()
    batches.close()  # the loop stops early (a preemption, TRAIN.MAX_STEPS)
    assert curl_children() == []


def test_workers_close_their_readers(server):
    loader = train_loader(config(server.url, "DATA.NUM_WORKERS", "2"))
    for e in range(2):
        assert len(epoch(loader, epoch_index=e)) == BATCHES
        assert readers_of(server.url) == 0
    batches = iter(loader)
    next(batches)
    batches.close()
    assert readers_of(server.url) == 0


# ---------------------------------------------------------------------------------------------------------
# The real run: exit 75 with one line and run.json `preempted`, then the same command finishes it
# ---------------------------------------------------------------------------------------------------------
def run_argv(url: str, out: Path, *extra: str) -> list[str]:
    """tools/train.py over the server's shards, 2 epochs of 6 steps, a checkpoint each epoch only."""
    return [sys.executable, TRAIN, "--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.NAME", "shards",
            "DATA.ROOT", url, "DATA.IMG_SIZE", "8", "DATA.BATCH_SIZE", "8", "DATA.SHARD_STREAMS", "2",
            "DATA.SHARD_WINDOW", "4", "DATA.RETRY_S", "2", "TRAIN.EPOCHS", "2", "LOG.PERIOD", "1",
            "LOG.PROGRESS", "plain", "CHECKPOINT.PERIOD", "0", *extra, "OUTPUT_DIR", str(out)]


@pytest.mark.slow
@pytest.mark.parametrize("workers, accum", [(0, 1), (2, 2)])
def test_a_lasting_fault_saves_exits_75_and_the_same_command_continues(server, tmp_path, workers, accum):
    out = tmp_path / "run"
    argv = run_argv(server.url, out, "DATA.NUM_WORKERS", str(workers), "TRAIN.ACCUM_STEPS", str(accum),
                    "DATA.BATCH_SIZE", str(8 // accum))
    server.fault(fault="500", prefix="/train/train-", after=3)  # the 4th shard read fails, mid-epoch 1
    first = Launch(argv, tmp_path, "first")
    assert first.finish(120) == 75, first.stderr[-3000:]
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in first.stderr, first.stderr[-3000:]
    assert "train-0000" in lines[0] and "500" in lines[0] and "rerun" in lines[0], lines[0]
    status = json.loads((out / "run.json").read_text())
    saved = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
    assert status["status"] == "preempted" and "500" in status["error"] and "train-0000" in status["error"], status
    assert 1 <= saved["step"] == status["step"] < 2 * BATCHES and saved["batch_in_epoch"] % accum == 0, status
    server.fault()  # the server is back
    second = Launch(argv, tmp_path, "second")
    assert second.finish(120) == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and second.stderr == ""
    assert [r["step"] for r in train_rows(out)] == list(range(1, 2 * BATCHES + 1))
    assert json.loads((out / "run.json").read_text())["status"] == "done"


@pytest.mark.slow
def test_a_fault_on_rank_1_under_torchrun_ends_the_job_75_preempted(server, small, tmp_path):
    from runner.data.shards.order import EpochPlan

    counts = [10] * 5
    plan = EpochPlan(counts, streams=2, window=4, seed=load_config(["--cfg", DIGITS])[0].SEED, epoch=0)
    shard, _, _ = plan.pieces(plan.stream_len, 2 * plan.stream_len)[-1]  # read by stream 1 (rank 1) alone
    server.fault(fault="500", prefix=f"/train/train-{shard:06d}.tar")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *run_argv(server.url, out, "DATA.NUM_WORKERS", "0", "DATA.BATCH_SIZE", "4")[1:]]
    first = Launch(cmd, tmp_path, "first")
    first.finish(180)
    assert "exitcode  : 75" in first.stderr or "exitcode: 75" in first.stderr, first.stderr[-3000:]
    assert "exitcode  : 1 " not in first.stderr and "exitcode  : 2 " not in first.stderr, first.stderr[-3000:]
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "preempted" and f"train-{shard:06d}.tar" in status["error"], status
    assert status.get("rank") == 1, status
    server.fault()
    second = Launch(cmd, tmp_path, "second")
    assert second.finish(180) == 0, second.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["status"] == "done"


def test_a_status_number_inside_a_path_is_no_outage():
    """pytest's own folders are /tmp/pytest-of-root/pytest-NNN: a run numbered 500-599 made every missing file
    under them an outage (the failing-pipe test waited 120 s, then exited 75 instead of 2)."""
    missing = "cat: /tmp/pytest-of-root/pytest-575/shards/train/missing-train-000503.tar: No such file or directory"
    assert not classify(1, missing).transient
    assert not classify(1, "cat: shard-500.tar: No such file or directory").transient
    assert classify(22, "curl: (22) The requested URL returned error: 503").transient
    assert classify(1, "aws: error: 503 Service Unavailable").transient
    assert classify(1, "gsutil: HTTP 429 (too many requests)").transient
    assert not classify(22, "curl: (22) The requested URL returned error: 404").transient
