"""Resumes on another number of processes (same global batch), and DATA.REPEATED_AUG killed and resumed: the real
tools/train.py and torchrun (gloo) on CPU."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import torch

from runner.distributed import Dist
from runner.engine.build import seed_micro_step
from tests.data.fixtures import export_digits_jpegs
from tests.engine.test_resume import Launch, assert_same_run, train_rows
from tests.utils import ROOT, TRAIN, assert_user_error, run_tool, torchrun

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
# Dropout, mixup and shifts draw per chunk of the global batch (not per process), so two layouts of one global
# batch differ only in the order of their sums
BASE = ["--cfg", DIGITS, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "32",
        "TRAIN.EPOCHS", "1", "DATA.NUM_WORKERS", "0", "LOG.PERIOD", "1", "LOG.PROGRESS", "plain",
        "MODEL.DROP_RATE", "0.2", "AUG.MIXUP", "0.2"]
STEPS = 1437 // 64  # one epoch of global batches of 64


def argv(out: Path, procs: int, *extra: str) -> list[str]:
    """The BASE run in `out` on `procs` processes (torchrun when 2), with `extra` settings."""
    cmd = [TRAIN, *BASE, *extra, "OUTPUT_DIR", str(out)]
    return torchrun(["--standalone", f"--nproc_per_node={procs}", *cmd]) if procs > 1 else [sys.executable, *cmd]


def accum_for(procs: int) -> list[str]:
    """TRAIN.ACCUM_STEPS that keeps the global batch at 64 on `procs` processes."""
    return ["TRAIN.ACCUM_STEPS", str(2 // procs)]


def losses(out: Path) -> list[float]:
    """The training loss of every step."""
    rows = train_rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    return [r["train/loss"] for r in rows]


# EMA on and a checkpoint every 4 steps: the layouts must agree on BatchNorm statistics too (the model's and the
# EMA's), and a SIGKILL loses at most 3 steps
ELASTIC = ["TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9", "CHECKPOINT.PERIOD", "4"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The 2-process run left alone."""
    out = tmp_path_factory.mktemp("elastic") / "ref"
    run = Launch(argv(out, 2, *ELASTIC), out.parent, "ref")
    assert run.finish() == 0, run.stderr[-3000:]
    return out


def norm_buffers(out: Path) -> dict[str, torch.Tensor]:
    """The BatchNorm buffers of the final checkpoint: running statistics and counts, of the model and its EMA."""
    state = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)
    found = {f"{part}/{k}": v for part in ("model", "ema") for k, v in state[part].items()
             if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    assert any(k.startswith("ema/") for k in found) and len(found) > 20, sorted(found)[:5]
    return found


def assert_same_norm_statistics(out: Path, ref: Path) -> None:
    """BatchNorm buffers equal up to float order, updated once per optimizer step; the same val results."""
    got, want = norm_buffers(out), norm_buffers(ref)
    assert got.keys() == want.keys()
    for key, value in want.items():
        if key.endswith("num_batches_tracked"):
            assert int(got[key]) == int(value) == STEPS, (key, int(got[key]), int(value))
        else:
            torch.testing.assert_close(got[key], value, rtol=1e-3, atol=1e-4, msg=key)
    res, ref_res = (json.loads((d / "results.json").read_text()) for d in (out, ref))
    for key in ("val/top1", "val/top5", "val_ema/top1", "val_ema/top5"):
        assert res[key] == ref_res[key], (key, res[key], ref_res[key])


@pytest.mark.slow
def test_two_processes_and_one_accumulating_two_train_alike(reference, tmp_path):
    """The same global batches on another layout: the loss curve, BatchNorm statistics and evaluation agree."""
    out = tmp_path / "accum"
    run = Launch(argv(out, 1, *ELASTIC, *accum_for(1)), tmp_path, "accum")
    assert run.finish() == 0, run.stderr[-3000:]
    assert losses(out) == pytest.approx(losses(reference), rel=1e-4, abs=1e-5)
    assert_same_norm_statistics(out, reference)


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)])
def test_resume_on_another_number_of_processes(reference, tmp_path, before, after):
    out = tmp_path / "run"
    first = Launch(argv(out, before, *ELASTIC, *accum_for(before)), tmp_path, "first")
    first.wait_step(10)
    first.kill_all()  # SIGKILL, every process: the run continues from its last periodic checkpoint
    saved = torch.load(out / "checkpoints" / "last.pth", map_location="cpu", weights_only=True)["step"]
    assert 4 <= saved < STEPS, saved
    if after == 1:  # one process without accumulation: a global batch of 32, not 64
        before_files = snapshot(out)
        refused = run_tool(TRAIN, [*BASE, *ELASTIC, "OUTPUT_DIR", str(out)], timeout=120)
        assert_user_error(refused, "global batch of 64", "32 x 1 x 1 = 32", "TRAIN.ACCUM_STEPS 2")
        assert snapshot(out) == before_files  # a refused command changes nothing in the folder
    second = Launch(argv(out, after, *ELASTIC, *accum_for(after)), tmp_path, "second")
    assert second.finish() == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout
    got, want = losses(out), losses(reference)
    if before == 2:  # up to the kill it is the reference's own command
        assert got[:saved] == want[:saved]
    # after the resume only the summation order differs (gradients averaged by DDP or summed by accumulation)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert_same_norm_statistics(out, reference)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (relative name -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("procs", [1, 2])
def test_repeated_augmentation_resumes_exactly(tmp_path, procs):
    extra = ["DATA.REPEATED_AUG", "3", "TRAIN.MAX_STEPS", "40", "TRAIN.EMA", "true", "TRAIN.EMA_DECAY", "0.9"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    alone = Launch(argv(ref, procs, *extra), tmp_path, "ref")
    assert alone.finish() == 0, alone.stderr[-3000:]
    assert f"1 epochs x {3 * 1437 // (32 * procs)} steps" in alone.stdout  # three passes in the epoch
    first = Launch(argv(out, procs, *extra), tmp_path, "first")
    first.wait_step(15)
    first.p.send_signal(signal.SIGTERM)
    rc = first.finish(60)
    assert rc == 75 if procs == 1 else rc != 0, first.stderr[-3000:]  # torchrun itself exits 1 on SIGTERM
    assert json.loads((out / "run.json").read_text())["status"] == "preempted"
    second = Launch(argv(out, procs, *extra), tmp_path, "second")
    assert second.finish() == 0, second.stderr[-3000:]
    assert_same_run(out, ref)


def test_micro_step_seeds_follow_the_chunk():
    def draws(rank: int, world: int, micro: int, step: int = 5) -> torch.Tensor:
        seed_micro_step(0, Dist(rank, world, rank, torch.device("cpu")), step, micro)
        return torch.rand(4)

    assert torch.equal(draws(1, 2, 0), draws(0, 1, 1))  # chunk 1 of step 5: rank 1 of 2, or micro-step 1 of 1
    assert not torch.equal(draws(0, 2, 0), draws(1, 2, 0))  # ranks draw differently
    assert not torch.equal(draws(0, 1, 0), draws(0, 1, 0, step=6))  # and steps


@pytest.mark.slow
def test_folder_run_with_workers_resumes_exactly(tmp_path):
    root = export_digits_jpegs(tmp_path / "jpegs", size=24, per_class=30)
    extra = ["DATA.NAME", "folder", "DATA.ROOT", str(root), "DATA.NUM_WORKERS", "2", "TRAIN.EMA", "true",
             "AUG.SCALE", "[0.5, 1.0]"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    alone = Launch(argv(ref, 1, *extra), tmp_path, "ref")
    assert alone.finish() == 0, alone.stderr[-3000:]
    first = Launch(argv(out, 1, *extra), tmp_path, "first")
    first.wait_step(4)
    first.p.send_signal(signal.SIGTERM)
    assert first.finish(60) == 75, first.stderr[-3000:]
    second = Launch(argv(out, 1, *extra), tmp_path, "second")
    assert second.finish() == 0, second.stderr[-3000:]
    assert_same_run(out, ref)
