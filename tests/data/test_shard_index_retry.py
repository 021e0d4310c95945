"""The shards' index and class map read at start-up over HTTP (issue 46, item 11.4): a 5xx or a refused connection
is ridden out for DATA.RETRY_S with the streams' back-off, then tools/train.py stops as preempted (exit 75, nothing
written), as the same fault does one step later; a 404 stays a user mistake (exit 2) and is not waited on."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from runner.preflight import load_config
from tests.data.test_shard_faults import DIGITS, dead_port, server, small  # noqa: F401 (fixtures)
from tests.utils import ROOT, assert_user_error, env, run_tool, torchrun

SHARDS = ["MODEL.NAME", "resnet10t", "DATA.NAME", "shards", "DATA.IMG_SIZE", "8", "DATA.BATCH_SIZE", "8",
          "DATA.SHARD_STREAMS", "2", "DATA.NUM_WORKERS", "0"]


def train(root: str, out: Path, *extra: str):
    """tools/train.py on the shards at `root` (a URL); (the finished process, its seconds)."""
    t0 = time.monotonic()
    done = run_tool("train.py", ["--cfg", DIGITS, *SHARDS, "DATA.ROOT", root, "OUTPUT_DIR", str(out), *extra],
                    timeout=120)
    return done, time.monotonic() - t0


def test_server_errors_on_the_index_for_a_while_are_ridden_out(server, tmp_path):  # noqa: F811
    # 5 answers of 500, more than DATA.SHARD_RETRIES (3) tries: the old reading refused the run after the third
    server.fault(fault="500", prefix="/train/index.json", count=5)
    cfg, _ = load_config(["--cfg", DIGITS, *SHARDS, "DATA.ROOT", server.url, "DATA.RETRY_S", "60"])
    assert cfg.DATA.ROOT == server.url
    rows = server.requests("/train/index.json")
    assert [row.split()[1] for row in rows[:6]] == ["500"] * 5 + ["200"], rows
    # a 404 is the user's: one line at once, however long DATA.RETRY_S is
    done, took = train(f"{server.url}/nowhere", tmp_path / "missing", "DATA.RETRY_S", "60")
    assert_user_error(done, f"{server.url}/nowhere/class_map.json", "404")
    assert took < 30, took


def test_a_lasting_5xx_on_the_index_stops_as_preempted(server, tmp_path):  # noqa: F811
    server.fault(fault="500", prefix="/train/index.json")
    out = tmp_path / "run"
    done, took = train(server.url, out, "DATA.RETRY_S", "3")
    assert done.returncode == 75, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{server.url}/train/index.json is unavailable:") and "500" in line, line
    assert "DATA.RETRY_S 3" in line and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert took >= 3 and not out.exists()  # waited out DATA.RETRY_S; nothing written before the claim


def test_a_refused_connection_at_start_up_stops_as_preempted(tmp_path):
    url = f"http://127.0.0.1:{dead_port()}"
    done, took = train(url, tmp_path / "run", "DATA.RETRY_S", "2")
    assert done.returncode == 75, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{url}/class_map.json is unavailable:") and "DATA.RETRY_S 2" in line, line
    assert took >= 2


@pytest.mark.slow
def test_under_torchrun_the_start_up_outage_is_said_once(tmp_path):
    """Every rank reads the index and meets the same outage: rank 0's line is the one shown (the others wait,
    quiet, until torchrun ends them; torchrun itself exits 1 for any failed rank)."""
    url = f"http://127.0.0.1:{dead_port()}"
    argv = [*torchrun(["--standalone", "--nproc_per_node=2", str(ROOT / "tools" / "train.py")]), "--cfg", DIGITS,
            *SHARDS, "DATA.ROOT", url, "DATA.RETRY_S", "2", "OUTPUT_DIR", str(tmp_path / "run")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=ROOT, env=env())
    # torchrun's own report (its ChildFailedError traceback) names rank 0's code; the ranks print no traceback
    assert "exitcode  : 75" in done.stderr and done.stderr.count("Traceback") == 1, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "is unavailable:" in line and "DATA.RETRY_S 2" in line]
    assert len(said) == 1, done.stderr[-3000:]
