"""DIST.STRATEGY fsdp composed with the rest of the runner on 2 gloo processes: a SIGTERM preemption resumed
bit-identical, a search's trial, every optimizer and layer-wise LR decay against ddp, and the hang watchdog."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from runner.checkpoint import SHARDS_KEY
from runner.config.loader import load_config
from runner.config.schema import FSDP_UNSUPPORTED_OPTIMIZERS, OPTIMIZERS, UNSUPPORTED_OPTIMIZERS
from runner.errors import UserError
from tests.engine.test_resume import Launch, ckpt_step, train_rows
from tests.engine.test_watchdog import CRASH, _runner_lines, _workers, exited_76
from tests.sweep.test_search_torchrun import trained_again, two_process_search
from tests.test_distributed import TINY_RESNET, kill_tree
from tests.test_fsdp import DIGITS, ELASTIC, STEPS, argv, final_weights, results, trained
from tests.utils import ROOT, env, is_alive, torchrun

EXIT_PREEMPTED = 75


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The sharded 2-process ELASTIC run left alone."""
    return trained(tmp_path_factory.mktemp("fsdp_compose") / "ref", 2, *ELASTIC)


# ---- a preemption ----------------------------------------------------------------------------------------------
def sigterm_everyone(run: Launch) -> None:
    """SIGTERM to torchrun and each of its workers at once, as SLURM signals a job step."""
    for pid in [run.p.pid, *run.children()]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_shards_and_resumes_bit_identical(reference, tmp_path):
    """Each rank finishes its step, every rank writes its shards, each exits 75 (torchrun itself reports 1, README);
    the same command continues to the reference's every loss, val result and final weight, bit for bit."""
    out = tmp_path / "run"
    first = Launch(argv(out, 2, *ELASTIC), tmp_path, "first")
    first.wait_step(6)
    sigterm_everyone(first)
    first.finish(120)
    assert first.stderr.count("preempted at step") == 2, first.stderr[-3000:]  # each rank's exit-75 line
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "preempted", status
    last = out / "checkpoints" / "last.pth"
    saved = ckpt_step(last)
    assert 6 <= saved < STEPS, saved  # the step in progress (the periodic one before it is step 4)
    shards = last.parent / torch.load(last, map_location="cpu", weights_only=True)[SHARDS_KEY]
    assert shards.is_dir() and (shards / ".metadata").is_file() and len(list(shards.glob("*.distcp"))) == 2
    second = Launch(argv(out, 2, *ELASTIC), tmp_path, "second")
    assert second.finish() == 0, second.stderr[-3000:]
    assert f"step {saved}" in second.stdout and "resumed from" in second.stdout
    assert train_rows(out) == train_rows(reference)
    for key in ("val/top1", "val_ema/top1"):
        assert results(out)[key] == results(reference)[key], key
    got, want = final_weights(out), final_weights(reference)
    assert got.keys() == want.keys() and len(got) > 10
    for key, value in want.items():
        assert torch.equal(got[key], value), key


# ---- a search's trials -----------------------------------------------------------------------------------------
def sharded_state(out: Path) -> dict[str, torch.Tensor]:
    """The model's and the optimizer's tensors of last.pth's shard folder, read whole (no process group)."""
    from runner.checkpoint import load_file, with_shard_path
    from runner.fsdp import read_model

    last = out / "checkpoints" / "last.pth"
    folder = with_shard_path(load_file(last), last)[SHARDS_KEY]
    return {f"{part}/{k}": v for part in ("model", "optimizer") for k, v in read_model(folder, part).items()}


@pytest.mark.slow
def test_a_search_trial_under_fsdp_equals_its_config_trained_straight(tmp_path):
    """Two trials on 2 processes each, sharded; the better one paused after epoch 1 and promoted (resumed from its
    shards) equals, to the bit, its config trained straight under torchrun by the command the table prints."""
    path, trial, log = two_process_search(
        tmp_path, "MODEL.NAME: test_vit, MODEL.CHANNELS_LAST: false, DATA.BATCH_SIZE: 64, DIST.STRATEGY: fsdp",
        "[0.001, 0.01]", 600)
    assert log.count("--nproc_per_node=2") == 2 and "resumed from" in log and "fsdp:" in log, log[-3000:]
    assert "STRATEGY: fsdp" in (trial / "config.yaml").read_text()  # the printed command trains it sharded too
    straight, command = trained_again(path, trial, 300)
    assert command.endswith(f"{trial}/config.yaml OUTPUT_DIR {straight}"), command
    got, want = sharded_state(trial), sharded_state(straight)
    assert got.keys() == want.keys() and any(k.startswith("optimizer/") for k in want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert results(trial)["val/top1"] == results(straight)["val/top1"]


# ---- the hang watchdog -----------------------------------------------------------------------------------------
def frozen_in_step(tmp_path: Path) -> tuple[str, Path]:
    """torchrun on 2 sharded processes with rank 1 frozen (SIGSTOP) at step 3: torchrun's stderr and the folder.
    The frozen worker is SIGKILLed once rank 0 has ended (torchrun would wait 30 s for it)."""
    out, err = tmp_path / "out", tmp_path / "stderr.log"
    faults = {"CRASH_RANK": "1", "CRASH_HOW": "stop", "CRASH_AT": "step", "CRASH_STEP": "3"}
    args = ["--cfg", DIGITS, *TINY_RESNET, "MODEL.CHANNELS_LAST", "false", "DIST.STRATEGY", "fsdp",
            "DIST.HANG_TIMEOUT_S", "5", "DIST.TIMEOUT_S", "60", "OUTPUT_DIR", str(out)]
    with open(tmp_path / "stdout.log", "w") as f, open(err, "w") as e:
        proc = subprocess.Popen(torchrun(["--standalone", "--nproc_per_node=2", CRASH, *args]), stdout=f, stderr=e,
                                env=env(**faults))
    t0, workers = time.monotonic(), {}
    try:
        while proc.poll() is None and time.monotonic() - t0 < 150:
            workers.update(_workers(proc.pid, out))
            if 0 in workers and not is_alive(workers[0]) and 1 in workers and is_alive(workers[1]):
                os.kill(workers[1], signal.SIGKILL)
            time.sleep(0.2)
    finally:
        kill_tree(proc.pid)
        proc.wait()
    return err.read_text(), out


@pytest.mark.slow
def test_a_rank_frozen_in_a_sharded_step_ends_the_job_with_exit_76(tmp_path):
    """Rank 0 waits in FSDP's all-gather or reduce-scatter for the frozen rank 1: the watchdog ends the job
    within DIST.HANG_TIMEOUT_S with one line naming rank 1, exit 76 and run.json hung."""
    stderr, out = frozen_in_step(tmp_path)
    assert exited_76(stderr), stderr[-3000:]
    lines = _runner_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith("hung: ") and "rank 1 stopped reporting" in lines[0], lines
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "hung" and status["hung_ranks"] == [1] and status["step"] == 2, status


# ---- optimizers and layer-wise LR decay ------------------------------------------------------------------------
# every optimizer the config offers (adahessian is refused for every strategy), one wrapped in lookahead, and
# layer-wise LR decay (NAME:LAYER_DECAY)
CASES = [n for n in OPTIMIZERS if n not in UNSUPPORTED_OPTIMIZERS] + ["lookahead_adamw", "lookahead_clion",
                                                                      "adamw:0.75", "sgd:0.65"]
WORKER = str(ROOT / "tests" / "fsdp_optimizers.py")


def refused(case: str) -> bool:
    """True for an optimizer validation refuses under fsdp."""
    return case.split(":")[0].removeprefix("lookahead_") in FSDP_UNSUPPORTED_OPTIMIZERS


@pytest.fixture(scope="module")
def optimizer_losses(tmp_path_factory) -> dict[str, dict]:
    """Each accepted case trained 2 steps sharded on 2 processes and whole (one torchrun for all)."""
    out = tmp_path_factory.mktemp("optimizers") / "losses.jsonl"
    cases = [c for c in CASES if not refused(c)]
    run = subprocess.run(torchrun(["--standalone", "--nproc_per_node=2", WORKER, str(out), *cases]), cwd=ROOT,
                         env=env(), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {f"{r['name']}:{r['decay']:g}" if r["decay"] else r["name"]: r for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_each_optimizer_trains_under_fsdp_as_whole_or_is_refused(request, case):
    """Accepted: the global loss before and after each of 2 steps equals the whole model's on the global batch
    (ddp's arithmetic) within 2e-4 (most agree to 1e-6; muon's bfloat16 Newton-Schulz to 1e-4); refused: one line
    from validation, before any process or file."""
    name, _, decay = case.partition(":")
    if refused(case):
        with pytest.raises(UserError, match=r"^TRAIN.OPTIMIZER \S+ does not combine with DIST.STRATEGY fsdp \("):
            load_config(["DIST.STRATEGY", "fsdp", "TRAIN.OPTIMIZER", name, "MODEL.CHANNELS_LAST", "false",
                         "OUTPUT_DIR", "unused"], check_paths=False)
        return
    row = request.getfixturevalue("optimizer_losses")[case]
    assert "error" not in row, row
    assert row["fsdp"] == pytest.approx(row["whole"], rel=2e-4)
    assert row["fsdp"][2] < row["fsdp"][0], row  # it trained
