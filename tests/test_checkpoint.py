"""Checkpoints (runner/checkpoint.py): pruning, read-back, a full disk while saving, safe loading, and each
rank's own RNG state saved and restored (also on another number of processes, and from older checkpoints)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from runner import checkpoint
from runner.distributed import Dist
from tests.rng_worker import draws, seed
from tests.utils import ROOT, TINY, assert_user_error, env, torchrun

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
TRAIN = str(ROOT / "tools" / "train.py")
CPU = torch.device("cpu")


def test_prune_never_removes_newer_files(tmp_path):
    for step in range(1, 8):
        (tmp_path / f"step_{step:08d}.pth").write_bytes(b"x")
    checkpoint.prune(tmp_path, step=4, keep=2)
    assert [s for s, _ in checkpoint.step_files(tmp_path)] == [7, 6, 5, 4, 3]


def test_read_back_tells_whole_from_damaged(tmp_path):
    d = tmp_path / "checkpoints"
    for step in (1, 2):
        checkpoint.save_checkpoint({"model": {"w": torch.ones(3)}, "step": step}, tmp_path, step, keep=1, best=False)
    assert [s for s, _ in checkpoint.step_files(d)] == [2] and checkpoint.looks_whole(d / "last.pth")
    data = (d / "step_00000002.pth").read_bytes()
    for damaged in (b"", data[: len(data) // 2], b"PK" + bytes(100)):
        (tmp_path / "bad.pth").write_bytes(damaged)
        assert not checkpoint.looks_whole(tmp_path / "bad.pth")


def test_load_file_refuses_what_is_no_dict(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pth")
    with pytest.raises(checkpoint.NotADict, match="expected a dict, found list") as e:
        checkpoint.load_file(tmp_path / "list.pth")
    assert e.value.found == "list"
    torch.save({"f": np.float64}, tmp_path / "obj.pth")  # a pickled class: weights_only refuses it
    with pytest.raises(Exception, match="Weights only load failed"):
        checkpoint.load_file(tmp_path / "obj.pth")


def _can_mount_tmpfs() -> bool:
    """Whether this machine lets us mount a small tmpfs in a private mount namespace (root, unshare)."""
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    r = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True)
    return r.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and unshare to mount a small tmpfs")
def test_full_disk_while_saving(tmp_path):
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    # a checkpoint of resnet10t with SGD momentum is about 40 MB: the first fits on 60 MB, the second does not
    # (SGD momentum set here: the digits config's AdamW keeps two moments per weight, 59 MB, too near 60)
    args = [sys.executable, TRAIN, "--cfg", DIGITS, *TINY, "TRAIN.OPTIMIZER", "momentum", "CHECKPOINT.PERIOD", "3",
            "TRAIN.MAX_STEPS", "9", "OUTPUT_DIR", str(disk / "run")]
    script = (f"mount -t tmpfs -o size=60m tmpfs {disk} && cd {ROOT} && "
              f"{' '.join(args)} 2>{tmp_path / 'err'}; echo $? > {tmp_path / 'rc'}; cp -a {disk}/run {kept}")
    subprocess.run(["unshare", "-m", "sh", "-c", script], check=True, timeout=300,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    proc = subprocess.CompletedProcess(args, int((tmp_path / "rc").read_text()), "", (tmp_path / "err").read_text())
    assert_user_error(proc, "no space left on device", str(disk / "run" / "checkpoints"),
                      "previous checkpoint", "step 3) is intact")
    ckpts = sorted(p.name for p in (kept / "checkpoints").iterdir())
    assert ckpts == ["last.pth", "step_00000003.pth"]  # no temporary file left behind
    state = torch.load(kept / "checkpoints" / "last.pth", weights_only=True)
    assert state["step"] == 3
    status = json.loads((kept / "run.json").read_text())
    assert status["status"] == "failed" and "no space left" in status["error"]


# ---- RNG state: each rank its own ---------------------------------------------------------------------------
def rank_states(n: int) -> tuple[list[dict], list[list]]:
    """n processes' RNG states as capture_rng gathers them (seeded 100 + rank), and what each draws next."""
    states, nexts = [], []
    for rank in range(n):
        seed(100 + rank)
        states += checkpoint.capture_rng(Dist(0, 1, 0, CPU))
        nexts.append(draws())
    return states, nexts


def test_each_rank_restores_its_own_state(tmp_path):
    states, nexts = rank_states(2)
    checkpoint.atomic_save({"rng": states}, tmp_path / "c.pth")
    saved = checkpoint.load_file(tmp_path / "c.pth")["rng"]  # a list of small dicts, loadable with weights_only
    for rank in (1, 0):
        checkpoint.restore_rng(saved, Dist(rank, 2, rank, CPU))
        assert draws() == nexts[rank]
    assert nexts[0] != nexts[1]


@pytest.mark.parametrize("saved, world", [(2, 1), (1, 2), (2, 3)])
def test_resume_on_another_number_of_processes_says_so(saved, world, caplog):
    states, nexts = rank_states(saved)
    for rank in range(world):
        torch.manual_seed(7)
        before = torch.get_rng_state()
        with caplog.at_level(logging.INFO, logger="runner"):
            checkpoint.restore_rng(states, Dist(rank, world, rank, CPU))
        if rank < saved:
            assert draws() == nexts[rank]
        else:
            assert torch.equal(torch.get_rng_state(), before)  # left as seeded
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f"RNG states of {saved} process" in lines[0] and f"this run has {world}" in lines[0]
    assert "those of an uninterrupted run" in lines[0] and caplog.records[0].levelno == logging.INFO  # nothing lost


def test_older_checkpoints_still_restore():
    torch.manual_seed(5)
    # the format before per-rank states: one dict from rank 0, with every visible GPU's state (here 8 GPUs)
    old = {**checkpoint.capture_rng(Dist(0, 1, 0, CPU))[0], "cuda": [torch.zeros(16, dtype=torch.uint8)] * 8}
    expected = draws()
    for rank in (0, 1):
        checkpoint.restore_rng(old, Dist(rank, 2, rank, CPU))
        assert draws() == expected  # every rank gets rank 0's state back, as before per-rank states


@pytest.mark.slow
def test_two_processes_save_and_restore_their_own_states(tmp_path):
    r = subprocess.run(torchrun(["--standalone", "--nproc_per_node", "2", "-m", "tests.rng_worker", str(tmp_path)]),
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [res["gathered"] for res in ranks] == [2, None]  # rank 0 holds both states, the other nothing
    for res in ranks:
        assert res["again"] == res["first"]
    assert ranks[0]["first"] != ranks[1]["first"]  # rank 1 got its own generator back, not rank 0's


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and unshare to mount a small tmpfs")
def test_full_disk_at_the_first_checkpoint_says_there_is_none_before(tmp_path):
    # the first save of a run on a full disk said "no earlier checkpoint exists; nothing was lost is intact"
    disk = tmp_path / "disk"
    disk.mkdir()
    code = ("from runner import checkpoint; from runner.errors import UserError; import torch\n"
            "try:\n"
            "    state = {'model': {'w': torch.ones(2**20)}, 'step': 3}\n"  # 4 MB on a 1 MB disk
            f"    checkpoint.save_checkpoint(state, '{disk}/run', 3, 3, False)\n"
            "except UserError as e:\n"
            "    print(e)\n")
    script = (f"mount -t tmpfs -o size=1m tmpfs {disk} && cd {ROOT} && {sys.executable} -c \"{code}\"; "
              f"ls -A {disk}/run/checkpoints")
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120, env=env())
    line, *left = out.stdout.strip().splitlines()
    assert line == (f"no space left on device while writing step_00000003.pth in {disk}/run/checkpoints; no earlier "
                    "checkpoint exists in this folder (a rerun starts where this run started): free some space and "
                    "run the same command again"), out.stdout + out.stderr
    assert left == []  # no temporary file left behind
