"""DIST.STRATEGY fsdp with CHECKPOINT.ASYNC: each process's shards staged in host memory on the step and written by
DCP's thread, the folder renamed and the .pth written after it in the writer's thread. The same checkpoints as the
synchronous saves, a caller not held by the write, and a write killed half way never taken for a checkpoint."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from tests.engine.test_resume import Launch, train_rows
from tests.test_fsdp import ELASTIC, argv
from tests.utils import ROOT


def _folders(out: Path) -> dict[int, Path]:
    """Each step's shard folder in `out`, by step."""
    d = out / "checkpoints"
    return {int(p.name.split(".")[0][5:]): p for p in d.iterdir() if p.is_dir() and p.name.endswith(".dcp")}


@pytest.mark.slow
def test_async_sharded_saves_hold_the_same_state_as_synchronous_ones(tmp_path):
    """2 gloo processes, a checkpoint every 4 steps, all kept: with CHECKPOINT.ASYNC each step's folder holds the
    model and EMA of its own step (staged on the step, though training went on during the write), bit-identical
    to the run that wrote them on the step, and the two runs train alike."""
    from runner.fsdp import read_model

    runs = {}
    for flag in ("true", "false"):
        out = tmp_path / flag
        run = Launch(argv(out, 2, *ELASTIC, "CHECKPOINT.KEEP", "100", "CHECKPOINT.ASYNC", flag), tmp_path, flag)
        assert run.finish() == 0, run.stderr[-3000:]
        runs[flag] = out
    assert train_rows(runs["true"]) == train_rows(runs["false"])
    got, want = _folders(runs["true"]), _folders(runs["false"])
    assert sorted(got) == sorted(want) == [4, 8, 12, 16, 20, 22]
    for step in want:
        for part in ("model", "ema"):
            a, b = read_model(got[step], part), read_model(want[step], part)
            assert a.keys() == b.keys() and len(a) > 10
            for key in b:
                assert torch.equal(a[key], b[key]), (step, part, key)
    assert not [p for p in (runs["true"] / "checkpoints").iterdir() if p.name.endswith(".partial")]


class _Gate:
    """DCP's file writes held until released: the write in flight while the caller goes on."""

    def __init__(self, monkeypatch):
        from torch.distributed.checkpoint import filesystem

        self.entered, self.release = threading.Event(), threading.Event()
        write = filesystem._FileSystemWriter.write_data

        def held(writer, plan, planner):
            """write_data once released."""
            self.entered.set()
            assert self.release.wait(60)
            return write(writer, plan, planner)

        monkeypatch.setattr(filesystem._FileSystemWriter, "write_data", held)


def test_a_background_sharded_write_leaves_the_step_free_and_holds_its_staged_state(tmp_path, monkeypatch):
    """start_shards returns while the shards are still being written; a step changing the weights meanwhile does
    not reach the checkpoint; only the finished write renames the folder into place."""
    from runner import checkpoint as ckpt
    from runner.fsdp import read_model
    from tests.test_fsdp import _shards

    shards, gate = _shards(1), _Gate(monkeypatch)
    before = shards.model.weight.detach().clone()
    name, finish = ckpt.start_shards(shards.save_async, tmp_path, 5, write_group=shards.write_group())
    assert gate.entered.wait(60)  # the write is under way, held, and the caller has its hands free
    with torch.no_grad():
        shards.model.weight.add_(1.0)  # the next step
    d = tmp_path / "checkpoints"
    assert not (d / name).exists() and (d / f".{name}.partial").is_dir()
    gate.release.set()
    finish()
    assert (d / name / ".metadata").is_file() and not (d / f".{name}.partial").exists()
    torch.testing.assert_close(read_model(d / name)["weight"], before, rtol=0, atol=0)


KILLED = """
import sys, threading
sys.path.insert(0, {root!r})
from pathlib import Path
from runner import checkpoint as ckpt
from tests.test_fsdp import _shards
from torch.distributed.checkpoint import filesystem

out, shards = Path({out!r}), _shards(1)
name, finish = ckpt.start_shards(shards.save_async, out, 1, write_group=shards.write_group())
finish()
ckpt.save_checkpoint({{"model": None, "step": 1, ckpt.SHARDS_KEY: name}}, out, 1, 3, False)
write = filesystem._FileSystemWriter.write_data
def held(writer, plan, planner):
    fut = write(writer, plan, planner)
    fut.wait()
    print("writing", flush=True)
    threading.Event().wait()  # killed here: the shards on disk, the metadata and the rename never come
filesystem._FileSystemWriter.write_data = held
ckpt.start_shards(shards.save_async, out, 2, write_group=shards.write_group())[1]()
"""


def test_killed_during_a_background_sharded_write_falls_back_to_the_previous(tmp_path):
    """SIGKILL while step 2's shards are being written in the background: step 1 is what a resume finds, and the
    next save removes the half-written folder."""
    from runner import checkpoint as ckpt
    from tests.test_fsdp import _save, _shards

    code = textwrap.dedent(KILLED).format(root=str(ROOT), out=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "writing", p.stderr.read()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(60)
    d = tmp_path / "checkpoints"
    assert [x.name for x in d.iterdir() if x.name.endswith(".partial")], "the kill landed inside the write"
    path, state = ckpt.find_resumable(tmp_path)
    assert state["step"] == 1 and path.name == "last.pth"
    _save(tmp_path, 3, _shards(3))
    assert not [x.name for x in d.iterdir() if x.name.endswith(".partial")]
