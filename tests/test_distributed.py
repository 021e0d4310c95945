"""torchrun on CPU (gloo), real launcher processes: one set of outputs, 2 processes == 1 process with the same
global batch, exact distributed validation, two nodes on localhost, a killed worker ends the job."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import torch

from runner.config import get_default_config
from runner.data.loaders import DeviceLoader, shard
from runner.data.memory import load_digits_tensors
from runner.distributed import Dist
from tests.utils import ROOT, TRAIN, env, is_alive, proc_env, proc_stat, read_jsonl, run_tool, torchrun

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
B = 8  # per-process batch of the 2-process run; the 1-process run takes 2 * B
STEPS = 8
LR, REF = 0.001, 8
# A model without batch statistics (ConvNeXt: LayerNorm only) at 32 px, no random shift (it is seeded per
# rank), a constant LR scaled from a reference batch: the 2-process run must reproduce the 1-process one step by
# step. AdamW at this LR learns digits within these steps (val/top1 ~70%), so the curves are far from flat.
MATCHED = ["MODEL.NAME", "convnext_atto", "DATA.IMG_SIZE", "32", "TRAIN.EPOCHS", "1", "TRAIN.OPTIMIZER", "adamw",
           "TRAIN.MAX_STEPS", str(STEPS), "LOG.PERIOD", "1", "AUG.SHIFT", "0", "DATA.NUM_WORKERS", "0",
           "TRAIN.SCHEDULER", "none", "TRAIN.WARMUP_EPOCHS", "0", "TRAIN.LR", str(LR),
           "TRAIN.LR_REF_BATCH", str(REF)]
# Float tolerance for the loss curves: DDP averages gradients across ranks, one process averages the loss
# over the whole batch; the sums differ only in rounding order (measured: ~1e-7 over these steps).
LOSS_TOL = 1e-5
TINY_RESNET = ["MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", str(B), "TRAIN.EPOCHS", "1",
               "LOG.PERIOD", "1", "DATA.NUM_WORKERS", "0"]
N_TRAIN, N_VAL = 1437, 360  # digits split with DATA.VAL_FRACTION 0.2


def free_port() -> int:
    """A port nobody listens on now (the OS picks it), so concurrent tests never collide."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], log: Path) -> subprocess.Popen:
    """Start torchrun with `args`, its output to `log` (a pipe could fill and block the launcher)."""
    with open(log, "w") as f:
        return subprocess.Popen(torchrun(args), stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env())


def finish(proc: subprocess.Popen, log: Path, timeout: float = 150) -> str:
    """Wait for a launcher and return its output; kill it and its workers if it overruns."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        left = process_table(proc.pid)
        kill_tree(proc.pid)
        proc.wait()
        pytest.fail(f"torchrun did not finish in {timeout}s; its processes then:\n{left}\n{log.read_text()[-3000:]}")
    return log.read_text()


def process_table(launcher: int) -> str:
    """One line per live process below `launcher`: pid, state, RANK and command (what a stuck job was doing)."""
    rows = []
    for pid in descendants(launcher):
        st = proc_stat(pid)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            rank = proc_env(pid).get("RANK", "-")
        except OSError:
            continue
        rows.append(f"  pid {pid} state {st[0] if st else '?'} RANK {rank}: {cmd}")
    return "\n".join(rows) or "  (none)"


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (torchrun starts its workers in new sessions, so not by group)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and (st := proc_stat(int(p.name))) is not None:
            children.setdefault(int(st[1]), []).append(int(p.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def alive_with(text: str) -> list[int]:
    """Live (not zombie) processes whose command line contains `text`."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if text in cmd and is_alive(int(p.name)):
            pids.append(int(p.name))
    return pids


def kill_tree(pid: int) -> None:
    """SIGKILL a launcher and everything below it (test cleanup only)."""
    for p in [*descendants(pid), pid]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def results(out: Path) -> dict:
    """results.json of a finished run."""
    return json.loads((out / "results.json").read_text())


def train_rows(out: Path) -> list[dict]:
    """The metrics.jsonl lines that carry train/loss."""
    return [row for row in read_jsonl(out / "metrics.jsonl") if "train/loss" in row]


def logged_a_step(out: Path) -> bool:
    """True once metrics.jsonl holds a complete train line."""
    try:
        return bool(train_rows(out))
    except (FileNotFoundError, ValueError):  # not written yet, or a line caught half-written
        return False


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same tiny ConvNeXt run twice, side by side: 2 processes x batch B under torchrun, and 1 process x 2B."""
    root = tmp_path_factory.mktemp("ddp")
    out2, out1 = root / "two", root / "one"
    proc = launch(["--standalone", "--nproc_per_node=2", TRAIN, "--cfg", DIGITS, *MATCHED,
                   "DATA.BATCH_SIZE", str(B), "OUTPUT_DIR", str(out2)], root / "two.log")
    one = run_tool("train.py", ["--cfg", DIGITS, *MATCHED, "DATA.BATCH_SIZE", str(2 * B), "OUTPUT_DIR", str(out1)])
    text = finish(proc, root / "two.log")
    assert proc.returncode == 0, text[-5000:]
    assert one.returncode == 0, one.stdout + one.stderr
    return out2, out1, text


def test_two_processes_write_one_set_of_outputs(pair):
    out2, _, text = pair
    assert "Traceback" not in text
    for name in ("config.yaml", "log.txt", "metrics.jsonl", "results.json", "env.txt"):
        assert (out2 / name).is_file(), name
    res = results(out2)
    assert res["status"] == "done" and res["world_size"] == 2 and res["step"] == STEPS
    # one writer: every step once in metrics.jsonl (two writers would give each train step twice)
    rows = read_jsonl(out2 / "metrics.jsonl")
    assert [row["step"] for row in rows if "train/loss" in row] == list(range(1, STEPS + 1))
    assert [row["step"] for row in rows if "val/top1" in row] == [STEPS]
    log_text = (out2 / "log.txt").read_text()
    assert log_text.count(" done: ") == 1 and "(2 processes)" in log_text
    # rank 0 alone saves checkpoints and TensorBoard events: no stray temporary files, one writing pid
    ckpts = sorted(p.name for p in (out2 / "checkpoints").iterdir())
    assert f"step_{STEPS:08d}.pth" in ckpts and all(re.fullmatch(r"step_\d{8}\.pth|last\.pth|best\.pth", n)
                                                    for n in ckpts), ckpts
    pids = {re.search(r"\.(\d+)\.\d+$", p.name).group(1) for p in out2.glob("events.out.tfevents.*")}
    assert len(pids) == 1, pids
    assert not [p.name for p in out2.rglob("*") if "rank" in p.name or "tmp" in p.name]


def test_loss_curve_matches_one_process_with_same_global_batch(pair):
    out2, out1, _ = pair
    two, one = train_rows(out2), train_rows(out1)
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, STEPS + 1))
    for a, b in zip(two, one, strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], abs=LOSS_TOL), (a, b)
    # not trivially equal: the model learns, so a wrong batch or a missing gradient average would show
    assert len({round(r["train/loss"], 4) for r in two}) == STEPS
    # TRAIN.LR_REF_BATCH scales by the global batch (2 x B and 1 x 2B), not the per-process one
    for r in two + one:
        assert r["train/lr"] == pytest.approx(LR * 2 * B / REF, rel=1e-9)
    assert results(out1)["world_size"] == 1


def test_batch_size_is_per_process(pair):
    out2, out1, _ = pair
    # 2 processes x B and 1 process x 2B: the same steps per epoch; 1 process x B would take twice as many
    per_epoch = re.compile(r"\d+ epochs x (\d+) steps, batch (\d+) per process")
    assert per_epoch.search((out2 / "log.txt").read_text()).groups() == (str(N_TRAIN // 2 // B), str(B))
    assert per_epoch.search((out1 / "log.txt").read_text()).groups() == (str(N_TRAIN // (2 * B)), str(2 * B))
    cfg = _digits_cfg()
    xt, yt, _, _ = load_digits_tensors(cfg)
    alone = DeviceLoader(xt, yt, B, Dist(0, 1, 0, torch.device("cpu")), train=True, seed=0)
    assert len(alone) == N_TRAIN // B and N_TRAIN // 2 // B == len(alone) // 2


def _digits_cfg():
    """The digits config at 16 px (small and quick: the sample order does not depend on the image size)."""
    cfg = get_default_config()
    cfg.DATA.IMG_SIZE = 16
    cfg.freeze()
    return cfg


def test_strided_shards_form_the_global_batch():
    cfg = _digits_cfg()
    xt, yt, xv, yv = load_digits_tensors(cfg)
    cpu = torch.device("cpu")

    def batches(t_x, t_y, bs, rank, world, train):
        loader = DeviceLoader(t_x, t_y, bs, Dist(rank, world, rank, cpu), train=train, seed=cfg.SEED)
        loader.set_epoch(3)
        return [(x, y) for x, y in loader]

    one = batches(xt, yt, 2 * B, 0, 1, True)
    r0, r1 = batches(xt, yt, B, 0, 2, True), batches(xt, yt, B, 1, 2, True)
    assert len(r0) == len(r1) == len(one) == N_TRAIN // (2 * B)
    for (x1, y1), (a, ya), (b, yb) in zip(one, r0, r1, strict=True):
        # the two ranks' batches at one step are exactly the 1-process batch (interleaved)
        assert torch.equal(torch.stack([a, b], 1).flatten(0, 1), x1)
        assert torch.equal(torch.stack([ya, yb], 1).flatten(), y1)
    # evaluation: every val image on exactly one rank, none padded or dropped, also when 360 does not split
    # evenly (7 ranks: a DistributedSampler would pad with 4 duplicates)
    for world in (2, 7):
        parts = [shard(torch.arange(N_VAL), Dist(r, world, r, cpu), drop_last=False) for r in range(world)]
        assert sorted(torch.cat(parts).tolist()) == list(range(N_VAL))
    assert sum(len(y) for _, y in batches(xv, yv, 2 * B, 0, 2, False) + batches(xv, yv, 2 * B, 1, 2, False)) \
        == N_VAL


def test_distributed_val_equals_one_process_eval(pair):
    out2, _, _ = pair
    val = [row for row in read_jsonl(out2 / "metrics.jsonl") if "val/top1" in row][-1]
    assert val["val/count"] == N_VAL  # no DistributedSampler-style padding duplicates
    r = run_tool("eval.py", ["--cfg", str(out2 / "config.yaml"),
                             "MODEL.CHECKPOINT", str(out2 / "checkpoints" / "last.pth")])
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["world_size"] == 1 and got["val/count"] == N_VAL
    assert got["val/top1"] == val["val/top1"] and got["val/top5"] == val["val/top5"]
    assert got["val/loss"] == pytest.approx(val["val/loss"], rel=1e-5)
    assert 30 < val["val/top1"] < 100  # a model that learned: not one constant prediction


def test_two_nodes_on_localhost_rendezvous_and_train(tmp_path):
    out, port = tmp_path / "out", free_port()
    node = ["--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=two-nodes-{port}", TRAIN, "--cfg", DIGITS, *TINY_RESNET, "TRAIN.MAX_STEPS", "2",
            "OUTPUT_DIR", str(out)]
    logs = [tmp_path / f"node{i}.log" for i in range(2)]
    procs = [launch(node, log) for log in logs]
    texts = [finish(p, log) for p, log in zip(procs, logs, strict=True)]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(t[-3000:] for t in texts)
    res = results(out)
    assert res["world_size"] == 2 and res["step"] == 2 and res["status"] == "done"
    assert [r["step"] for r in train_rows(out)] == [1, 2]
    assert sum("(2 processes)" in t for t in texts) == 1  # rank 0 lives on one of the two launchers


def test_killed_worker_ends_the_job(tmp_path):
    out, log = tmp_path / "out", tmp_path / "run.log"
    proc = launch(["--standalone", "--nproc_per_node=2", TRAIN, "--cfg", DIGITS, *TINY_RESNET,
                   "TRAIN.EPOCHS", "100", "OUTPUT_DIR", str(out)], log)
    try:
        deadline = time.monotonic() + 90
        while not logged_a_step(out):  # both ranks are in the training loop
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        workers = {int(proc_env(p).get("RANK", -1)): p for p in descendants(proc.pid) if str(out) in
                   (Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace"))}
        assert sorted(workers) == [0, 1], workers
        os.kill(workers[1], signal.SIGKILL)
        t0 = time.monotonic()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"torchrun still running 60 s after rank 1 was killed:\n{log.read_text()[-3000:]}")
        elapsed = time.monotonic() - t0
    finally:
        kill_tree(proc.pid)
        proc.wait()
    text = log.read_text()
    assert proc.returncode != 0 and elapsed < 60
    time.sleep(0.5)  # the launcher has reaped its workers; give the kernel a moment to drop them
    assert alive_with(str(out)) == [], "a process of the killed job survived"
    # torchrun's summary names the killed rank as the root cause
    root = text.split("Root Cause (first observed failure):", 1)[1]
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root) and "SIGKILL" in root, text[-3000:]


def test_no_process_group_outside_torchrun(monkeypatch):
    import torch.distributed as tdist

    from runner import distributed

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    cfg = get_default_config()
    cfg.DEVICE = "cpu"
    d = distributed.setup(cfg)
    assert (d.rank, d.world_size, d.distributed) == (0, 1, False) and not tdist.is_initialized()


def test_sync_bn_on_cpu_is_a_clear_error():
    """torch's SyncBatchNorm is GPU-only; on CPU the runner says so instead of a DDP traceback."""
    import torch.distributed as tdist

    from runner.errors import UserError
    from runner.model import build_model, prepare_model

    cfg = get_default_config()
    cfg.MODEL.NAME, cfg.MODEL.SYNC_BN = "resnet10t", True
    cfg.freeze()
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(UserError, match="MODEL.SYNC_BN"):
            prepare_model(build_model(cfg), cfg, Dist(0, 1, 0, torch.device("cpu")))
    finally:
        tdist.destroy_process_group()
