"""W&B (offline) and MLflow (sqlite) as sinks, against the real libraries with no network.

The trackers are read back with their own means: MLflow's MlflowClient, and W&B's offline run files (the
.wandb log, parsed with W&B's own protobuf definitions; W&B 0.31 ships no Python reader of its own).
"""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.utils import ROOT, TINY, TRAIN, assert_user_error, env, read_jsonl, run_tool

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
mlflow_tracking = pytest.importorskip("mlflow.tracking")

CFG = ["--cfg", "configs/digits/test_resnet.yaml"]
# 20 of the epoch's 22 steps (killed mid-epoch), a checkpoint every 4 steps, a log row every 2
SHORT = [*TINY, "TRAIN.MAX_STEPS", "20", "CHECKPOINT.PERIOD", "4", "LOG.PERIOD", "2"]


def tracker_env(home: Path, **extra: str) -> dict:
    """No W&B credentials or settings of the machine's user: HOME is the test's, no API key."""
    e = env(HOME=str(home), **extra)
    e.pop("WANDB_API_KEY", None)
    return e


def wandb_records(path: Path):
    """The records of a .wandb file: W&B's header, then LevelDB log chunks in 32 KiB blocks."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunk = 7, 32768, b""
    while pos + 7 <= len(data):
        room = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if room < 7 or (kind == 0 and length == 0):  # the block's zero padding
            pos += room
            continue
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def wandb_run(out: Path) -> dict:
    """Every offline fragment of OUTPUT_DIR's W&B run: ids, history rows (step -> values), config, summary."""
    got = {"ids": set(), "steps": [], "history": {}, "config": {}, "summary": {}, "fragments": 0}
    for path in sorted(out.glob("wandb/offline-run-*/run-*.wandb")):
        got["fragments"] += 1
        for r in wandb_records(path):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                got["ids"].add(r.run.run_id)
                got["config"].update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "config":
                got["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
            elif kind == "history":
                got["steps"].append(r.history.step.num)
                got["history"][r.history.step.num] = {i.key or ".".join(i.nested_key): json.loads(i.value_json)
                                                      for i in r.history.item}
            elif kind == "summary":
                got["summary"].update({i.key or ".".join(i.nested_key): json.loads(i.value_json)
                                       for i in r.summary.update})
    return got


def mlflow_run(uri: str) -> tuple:
    """(the client, the store's one run) of the default experiment's name for these tests."""
    client = mlflow_tracking.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric's (step, value) points in step order."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def torch_step(path: Path) -> int:
    """The step a checkpoint was saved at."""
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["step"])


def same_points(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    """The same steps, in order, with the same values (float32 text round trips aside)."""
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


def train_until(args: list[str], e: dict, step: int, after: float) -> int:
    """Start a run and SIGKILL it `after` seconds after its log shows `step`; returns the exit status."""
    p = subprocess.Popen([sys.executable, TRAIN, *args], cwd=ROOT, env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stdout:
            if f" step {step}/" in line:
                time.sleep(after)
                p.send_signal(signal.SIGKILL)
                break
        return p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
        p.stdout.close()
        p.stderr.close()


@pytest.mark.slow
def test_killed_and_resumed_run_is_one_tracker_run(tmp_path):
    """SIGKILLed 0.2 s after step 10 and resumed: W&B and MLflow hold one
    run each whose steps and values are metrics.jsonl's, no step twice; the config and the results are
    there; a re-run adds nothing.
    The resumed process asks for W&B online without an API key: it says once how to sync and logs offline
    into the same run."""
    out, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = [*CFG, *SHORT, "OUTPUT_DIR", str(out), "LOG.MLFLOW_URI", uri, "LOG.WANDB", "true",
            "LOG.WANDB_TAGS", "[digits]"]
    e = tracker_env(tmp_path)
    # killed soon after the log's step 10 (of 20): a fixed delay after an earlier step let a fast machine finish
    # all 20 steps before the kill (CI: 14 steps in 1.5 s)
    assert train_until([*args, "LOG.WANDB_MODE", "offline"], e, 10, after=0.2) == -signal.SIGKILL
    state = json.loads((out / "trackers.json").read_text())
    killed_at = max(row["step"] for row in read_jsonl(out / "metrics.jsonl"))
    covered = torch_step(out / "checkpoints" / "last.pth")
    # only what a checkpoint covers; a kill while the checkpoint is written leaves it one checkpoint ahead, and
    # the resume then skips the rows up to it (the same rows again: the resume is exact)
    for name in ("wandb", "mlflow"):
        assert covered <= state[name]["step"] <= killed_at < 20, (name, state, covered, killed_at)

    r = run_tool("train.py", [*args, "LOG.WANDB_MODE", "online"], env=e)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr == ""
    assert r.stdout.count("W&B: cannot log online") == 1 and "wandb beta sync" in r.stdout
    rows = read_jsonl(out / "metrics.jsonl")
    train_rows = [row for row in rows if "train/loss" in row]
    val_rows = [row for row in rows if "val/top1" in row]
    assert [row["step"] for row in train_rows] == list(range(2, 21, 2))

    client, run = mlflow_run(uri)
    same_points(history(client, run.info.run_id, "train/loss"),
                [(row["step"], row["train/loss"]) for row in train_rows])
    same_points(history(client, run.info.run_id, "val/top1"), [(row["step"], row["val/top1"]) for row in val_rows])
    assert run.data.params["MODEL.NAME"] == "resnet10t" and run.data.params["TRAIN.MAX_STEPS"] == "20"
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.tags["result.status"] == "done"
    results = json.loads((out / "results.json").read_text())
    assert run.data.metrics["best/val/top1"] == pytest.approx(results["best/val/top1"])

    wb = wandb_run(out)
    assert wb["fragments"] == 1 and len(wb["ids"]) == 1 and wb["ids"] == {state["wandb"]["id"]}
    assert wb["steps"] == sorted(set(wb["steps"])) == sorted({row["step"] for row in rows})
    same_points([(s, wb["history"][s]["train/loss"]) for s in wb["steps"]],
                [(row["step"], row["train/loss"]) for row in train_rows])
    assert wb["config"]["MODEL.NAME"] == "resnet10t"
    assert wb["summary"]["status"] == "done"
    assert wb["summary"]["val/top1"] == pytest.approx(results["val/top1"])

    again = run_tool("train.py", [*args, "LOG.WANDB_MODE", "offline"], env=e)
    assert again.returncode == 0, again.stderr[-3000:]
    assert wandb_run(out)["fragments"] == 1
    assert len(history(client, run.info.run_id, "train/loss")) == len(train_rows)


def test_a_broken_store_warns_once_and_the_run_finishes(tmp_path):
    """MLflow's file store loses the run's metrics folder mid-run: one warning in log.txt, the run's results."""
    import shutil

    from runner.config import load_config
    from runner.engine import build_trainer
    from runner.engine.hooks import Hook

    store, out = tmp_path / "mlruns", tmp_path / "run"
    cfg = load_config([*CFG, *TINY, "TRAIN.MAX_STEPS", "6", "CHECKPOINT.PERIOD", "2", "LOG.PERIOD", "2",
                       "LOG.TENSORBOARD", "false", "OUTPUT_DIR", str(out), "LOG.MLFLOW_URI", f"file:{store}"])[0]

    class BreakStore(Hook):
        def after_step(self, trainer):
            if trainer.step == 3:  # the metrics folder becomes a file: the next checkpoint's rows cannot go in
                run_id = json.loads((out / "trackers.json").read_text())["mlflow"]["id"]
                metrics = next(store.glob(f"*/{run_id}/metrics"))
                shutil.rmtree(metrics)
                metrics.write_text("not a folder")

    trainer = build_trainer(cfg)
    trainer.hooks.insert(0, BreakStore())
    try:
        results = trainer.train()
    finally:
        trainer.close()
    assert results["status"] == "done" and results["step"] == 6
    assert json.loads((out / "results.json").read_text())["step"] == 6
    warnings = [line for line in (out / "log.txt").read_text().splitlines() if " W MLflow:" in line]
    assert len(warnings) == 1 and "the run goes on without MLflow" in warnings[0], warnings


def test_store_that_cannot_be_opened_or_missing_library_is_exit_2(tmp_path):
    """A sqlite file under a plain file, and mlflow not importable: one line, exit 2, no OUTPUT_DIR made."""
    out, blocker = tmp_path / "run", tmp_path / "a-file"
    blocker.write_text("")
    args = [*CFG, *TINY, "OUTPUT_DIR", str(out)]
    bad = run_tool("train.py", [*args, "LOG.MLFLOW_URI", f"sqlite:///{blocker / 'x.db'}"],
                   env=tracker_env(tmp_path))
    assert_user_error(bad, "LOG.MLFLOW_URI", "cannot be opened")
    assert not out.exists()
    hide = ("import runpy, sys; sys.modules['mlflow'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    missing = subprocess.run([sys.executable, "-c", hide, TRAIN, *args, "LOG.MLFLOW_URI", "sqlite:///x.db"],
                             capture_output=True, text=True, cwd=ROOT, env=tracker_env(tmp_path), timeout=300)
    assert_user_error(missing, "pip install -e '.[mlflow]'")
    assert not out.exists()


def test_trackers_off_import_neither_library(tmp_path):
    """A run with the trackers off (the default) imports no tracker module, neither mlflow nor wandb (timm's
    `import wandb` at `import timm` is answered "not installed": runner.process.startup); the W&B sink still can."""
    code = ("import sys; from runner.process.startup import prepare; prepare(); from runner.config import load_config; "
            "from runner.engine import train; "
            "train(load_config(sys.argv[1:])[0]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'wandb') "
            "or m.startswith(('runner.sinks.tracker', 'runner.sinks.wandb_sink', 'runner.sinks.mlflow_sink'))))")
    args = [*CFG, *TINY, "TRAIN.MAX_STEPS", "2", "OUTPUT_DIR", str(tmp_path / "run")]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                       env=env(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"
    asked = "from runner.process.startup import prepare; prepare(); import timm, wandb; print(wandb.__version__)"
    later = subprocess.run([sys.executable, "-c", asked], capture_output=True, text=True, cwd=ROOT, env=env(),
                           timeout=300)
    assert later.returncode == 0 and later.stdout.strip(), later.stderr[-3000:]  # importable when asked for
    assert (tmp_path / "run" / "results.json").exists() and not (tmp_path / "run" / "trackers.json").exists()


def unusable_stores(tmp_path: Path) -> dict[str, str]:
    """LOG.MLFLOW_URI values whose store cannot work, each made for real under tmp_path."""
    (tmp_path / "folder.db").mkdir()
    (tmp_path / "text.db").write_text("not a database\n" * 100)
    (tmp_path / "a-file").write_text("")
    return {"sqlite on a folder": f"sqlite:///{tmp_path / 'folder.db'}",
            "sqlite on a text file": f"sqlite:///{tmp_path / 'text.db'}",
            "file: under a file": f"file:{tmp_path / 'a-file' / 'mlruns'}",
            "path under a file": str(tmp_path / "a-file" / "mlruns")}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["sqlite on a folder", "sqlite on a text file", "file: under a file",
                                  "path under a file"])
def test_mlflow_unusable_store_is_one_line_in_seconds(tmp_path, case):
    """A store that cannot work: exit 2 with one stderr line naming LOG.MLFLOW_URI, in seconds (mlflow's
    own retry loop sat 106 s and printed 36 warning lines), OUTPUT_DIR not claimed."""
    out, uri = tmp_path / "run", unusable_stores(tmp_path)[case]
    start = time.monotonic()
    r = run_tool("train.py", [*CFG, *TINY, "OUTPUT_DIR", str(out), "LOG.MLFLOW_URI", uri], timeout=60,
                 env=tracker_env(tmp_path))
    took = time.monotonic() - start
    assert_user_error(r, "LOG.MLFLOW_URI", uri)
    assert took < 10, took
    assert not out.exists()


def test_mlflow_unwritable_store_folder_is_refused(tmp_path):
    """A sqlite file or file: store in a folder this user cannot write to: refused at the check."""
    from runner.config import load_config
    from runner.errors import UserError
    from runner.sinks import check_sinks as check_trackers

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("this user (root) writes into a read-only folder")
        for uri in (f"sqlite:///{folder / 'x.db'}", f"file:{folder / 'mlruns'}"):
            cfg = load_config([*CFG, "LOG.MLFLOW_URI", uri, "OUTPUT_DIR", str(tmp_path / "run")])[0]
            with pytest.raises(UserError, match="not writable"):
                check_trackers(cfg)
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize("out, want", [("output/x-lr=0.1", "x-lr=0.1"), ("output/digits/test_resnet", "digits"),
                                       ("output/sweeps/lr_x_model/lr0.008_resnet10t", "lr_x_model"),
                                       ("/scratch/me/runs/a", "runs")])
def test_mlflow_default_experiment_name(out, want):
    """OUTPUT_DIR's parent folder (a sweep's folder); a run right in output/ gets its own folder's name."""
    from runner.sinks.mlflow_sink import experiment_name

    assert experiment_name(Path(out)) == want


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Poll `url` until it answers 200; fail at once with the server's output if the server exits."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)  # polling the port: not yet listening
    pytest.fail(f"{url} did not answer in {timeout} s")


def post_json(url: str, body: dict) -> dict:
    """POST a JSON body; the JSON answer."""
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_mlflow_ui_serves_the_run_and_its_artifacts(tmp_path):
    """The README's way: a run into sqlite:///, then `mlflow ui --backend-store-uri` on 127.0.0.1 serves the
    UI page and the run over HTTP (REST search, and the client through the server), config.yaml and
    results.json as the run's artifacts; the log says once where MLflow logs; a run right in output/ lands
    in an experiment named after its own folder."""
    out, uri = tmp_path / "output" / "tiny", f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = run_tool("train.py", [*CFG, *TINY, "TRAIN.MAX_STEPS", "4", "OUTPUT_DIR", str(out), "LOG.MLFLOW_URI", uri],
                 env=tracker_env(tmp_path))
    assert r.returncode == 0 and r.stderr == "", r.stderr[-3000:]
    client, run = mlflow_run(uri)
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "tiny"
    said = [line for line in r.stdout.splitlines() if " MLflow: " in line]
    assert len(said) == 1 and f"experiment 'tiny', run {run.info.run_id} at {uri}" in said[0], said

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1"], cwd=tmp_path,
                              env=tracker_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        wait_for_http(f"{base}/health", server)
        import urllib.request

        with urllib.request.urlopen(base + "/", timeout=30) as page:
            assert "<html" in page.read().decode().lower()  # the UI itself, not only the REST API
        found = post_json(f"{base}/api/2.0/mlflow/runs/search", {"experiment_ids": [run.info.experiment_id]})
        assert [x["info"]["run_id"] for x in found["runs"]] == [run.info.run_id]
        remote = mlflow_tracking.MlflowClient(tracking_uri=base)
        assert remote.get_run(run.info.run_id).data.params["MODEL.NAME"] == "resnet10t"
        assert sorted(a.path for a in remote.list_artifacts(run.info.run_id)) == ["config.yaml", "results.json"]
        got = Path(remote.download_artifacts(run.info.run_id, "results.json", str(tmp_path)))
        assert json.loads(got.read_text()) == json.loads((out / "results.json").read_text())
        got = Path(remote.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path)))
        assert got.read_text() == (out / "config.yaml").read_text()
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers: the session it was started in
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        server.stdout.close()


@pytest.mark.slow
def test_mlflow_artifact_that_cannot_be_logged_warns_once(tmp_path):
    """The experiment's artifact folder lies under a plain file: one warning in log.txt, the metrics and
    results still reach MLflow and the run finishes."""
    out, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    (tmp_path / "a-file").write_text("")
    store = mlflow_tracking.MlflowClient(tracking_uri=uri)
    store.create_experiment("blocked", artifact_location=f"file:{tmp_path / 'a-file' / 'artifacts'}")
    r = run_tool("train.py", [*CFG, *TINY, "TRAIN.MAX_STEPS", "4", "OUTPUT_DIR", str(out), "LOG.MLFLOW_URI", uri,
                              "LOG.MLFLOW_EXPERIMENT", "blocked"], env=tracker_env(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    warned = [line for line in (out / "log.txt").read_text().splitlines() if "MLflow:" in line and " W " in line]
    assert len(warned) == 1 and "artifact" in warned[0], warned
    _, run = mlflow_run(uri)
    assert run.info.status == "FINISHED" and run.data.tags["result.status"] == "done"
    assert "train/loss" in run.data.metrics
