"""TensorBoard's HParams tab and the sweep table compare the points of a sweep on every swept key.

Two tiny real points of an LR sweep (tools/train.py, one at the default LR 0.1) are read back through
TensorBoard's own event readers and its HParams plugin handlers (what the tab shows), and through
tools/summarize.py.
"""
from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runner.config import load_config
from runner.sinks import run_hparams
from tests.utils import ROOT, TINY, env, read_jsonl, run_tool

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
LRS = ("0.1", "0.05")  # 0.1 is the default
# TINY's keys as a sweep passes them, less the ones that only observe a run (LOG.PERIOD, DATA.NUM_WORKERS)
SWEPT = ["MODEL.NAME", "DATA.IMG_SIZE", "DATA.BATCH_SIZE", "TRAIN.EPOCHS", "TRAIN.LR"]
# set by the config file only, so the same in every point: never an HParams column
FROM_FILE = ["AUG.SHIFT", "TRAIN.WEIGHT_DECAY", "TRAIN.WARMUP_EPOCHS"]


@pytest.fixture(scope="module")
def sweep_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two points, TRAIN.LR 0.1 and 0.05 after TINY's keys, trained side by side."""
    root = tmp_path_factory.mktemp("hparams") / "sweep"
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tools" / "train.py"), "--cfg", DIGITS, *TINY,
                               "TRAIN.LR", lr, "OUTPUT_DIR", str(root / f"lr{lr}")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), cwd=ROOT)
             for lr in LRS]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    return root


def hparams_data(root: Path) -> dict[str, dict]:
    """Run name -> tag -> HParamsPluginData, from the event files under root."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    mux = EventMultiplexer().AddRunsFromDirectory(str(root))
    mux.Reload()
    return {run: {tag: plugin_data_pb2.HParamsPluginData.FromString(content) for tag, content in tags.items()}
            for run, tags in mux.PluginRunToTagToContent("hparams").items()}


def start_values(data) -> dict:
    """A session_start_info's hparams as plain Python values."""
    from google.protobuf import json_format

    return {k: json_format.MessageToDict(v) for k, v in data.session_start_info.hparams.items()}


@pytest.mark.slow
def test_every_point_writes_the_command_line_keys(sweep_root: Path) -> None:
    data = hparams_data(sweep_root)
    assert sorted(data) == [f"lr{lr}" for lr in sorted(LRS)]
    for lr in LRS:
        values = start_values(data[f"lr{lr}"]["_hparams_/session_start_info"])
        # the same keys in every point, the default LR and batch size included; none from the config file alone
        assert sorted(values) == sorted(SWEPT)
        assert values["TRAIN.LR"] == float(lr) and values["DATA.BATCH_SIZE"] == 64
        assert values["MODEL.NAME"] == "resnet10t"
        experiment = data[f"lr{lr}"]["_hparams_/experiment"].experiment
        assert [h.name for h in experiment.hparam_infos] == SWEPT
        assert [m.name.tag for m in experiment.metric_infos] == ["val/top1", "val/top5"]


@pytest.mark.slow
def test_hparams_tab_as_tensorboard_shows_it(sweep_root: Path) -> None:
    from google.protobuf import json_format
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, list_session_groups

    mux = plugin_event_multiplexer.EventMultiplexer().AddRunsFromDirectory(str(sweep_root))
    mux.Reload()
    tb = base_plugin.TBContext(logdir=str(sweep_root), multiplexer=mux,
                               data_provider=data_provider.MultiplexerDataProvider(mux, str(sweep_root)))
    backend, ctx = backend_context.Context(tb), context.RequestContext()
    experiment = get_experiment.Handler(ctx, backend, "", api_pb2.GetExperimentRequest()).run()
    columns = {h.name for h in experiment.hparam_infos}
    assert "TRAIN.LR" in columns and columns == set(SWEPT) and not columns & set(FROM_FILE)
    assert {m.name.tag for m in experiment.metric_infos} == {"val/top1", "val/top5"}
    request = json_format.Parse(json.dumps({"startIndex": 0, "sliceSize": 10, "allowedStatuses": [
        "STATUS_SUCCESS", "STATUS_UNKNOWN", "STATUS_FAILURE", "STATUS_RUNNING"]}),
        api_pb2.ListSessionGroupsRequest())
    groups = list_session_groups.Handler(ctx, backend, "", request).run().session_groups
    # each point is its own group, named from its folder first (the table cuts long names short)
    assert sorted(g.name for g in groups) == [f"lr{lr} ({sweep_root})" for lr in sorted(LRS)]
    assert all(len(g.sessions) == 1 for g in groups)
    top1 = {g.hparams["TRAIN.LR"].number_value: {m.name.tag: m.value for m in g.metric_values}["val/top1"]
            for g in groups}
    # each point's row: its LR and its final val/top1, read from the run's own val/top1 curve
    expected = {float(lr): json.loads((sweep_root / f"lr{lr}" / "results.json").read_text())["val/top1"]
                for lr in LRS}
    assert top1 == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_no_hparam_charts_no_count_curve(sweep_root: Path) -> None:
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    mux = EventMultiplexer().AddRunsFromDirectory(str(sweep_root))
    mux.Reload()
    assert sorted(mux.Runs()) == [f"lr{lr}" for lr in sorted(LRS)]  # no sub-run per point
    for lr in LRS:
        tags = mux.Runs()[f"lr{lr}"]["scalars"]
        assert "val/top1" in tags and "val/top5" in tags
        assert not [t for t in tags if t.startswith("hparam/")], tags
        assert "val/count" not in tags
        assert len(list((sweep_root / f"lr{lr}").glob("events.out.tfevents.*"))) == 1
        # the count is still recorded, in metrics.jsonl
        assert [row["val/count"] for row in read_jsonl(sweep_root / f"lr{lr}" / "metrics.jsonl")
                if "val/count" in row] == [360]


@pytest.mark.slow
def test_sweep_table_of_the_same_points(sweep_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    shutil.copytree(sweep_root, root)
    broken = root / "broken"  # a third folder whose config.yaml and results.json are damaged
    broken.mkdir()
    (broken / "config.yaml").write_text("TRAIN: {LR: [0.1,\n")
    (broken / "results.json").write_text('{"status": "do')
    out = run_tool("summarize.py", [str(root)])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # keys that never vary are one line above the table, whatever the unreadable run; the swept key is a column
    assert lines[0].startswith("Same in every run whose config could be read: ")
    assert "MODEL.NAME=resnet10t" in lines[0] and "AUG.SHIFT=2" in lines[0] and "TRAIN.LR" not in lines[0]
    header = next(line for line in lines if line.startswith("|"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert "TRAIN.LR" in cells and not {"MODEL.NAME", "AUG.SHIFT", "DATA.IMG_SIZE"} & set(cells)
    broken_row = next(line for line in lines if "| broken |" in line)
    assert "config.yaml unreadable" in broken_row and "results.json unreadable" in broken_row
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(run_tool("summarize.py", [
        str(root), "--format", "csv"]).stdout))}
    assert {run: rows[run]["TRAIN.LR"] for run in rows} == {"lr0.1": "0.1", "lr0.05": "0.05", "broken": ""}


def test_plain_run_and_value_types(tmp_path: Path) -> None:
    cfg_file = tmp_path / "plain.yaml"
    cfg_file.write_text("MODEL: {NAME: resnet10t}\nTRAIN: {LR: 0.05, EPOCHS: 2}\nLOG: {PERIOD: 5}\n")
    cfg, info = load_config(["--cfg", str(cfg_file), "OUTPUT_DIR", str(tmp_path / "out")])
    # no swept key on the command line: what the config file changed, less what only observes the run
    assert run_hparams(cfg, [k for k, _ in info.overrides]) == {
        "MODEL.NAME": "resnet10t", "TRAIN.LR": 0.05, "TRAIN.EPOCHS": 2}
    defaults, info = load_config(["OUTPUT_DIR", str(tmp_path / "out")])
    assert run_hparams(defaults, [k for k, _ in info.overrides]) == {"MODEL.NAME": "resnet18"}
    # command-line keys in order (repeats once), at their value even when it is the default; text for bools
    # and lists (torch would store a bool as 0 or 1)
    cfg, info = load_config(["--cfg", str(cfg_file), "TRAIN.LR", "0.1", "MODEL.PRETRAINED", "false",
                             "AUG.SCALE", "(0.5, 1.0)", "DATA.NUM_WORKERS", "0", "TRAIN.LR", "0.1",
                             "OUTPUT_DIR", str(tmp_path / "out")])
    assert run_hparams(cfg, [k for k, _ in info.overrides]) == {
        "TRAIN.LR": 0.1, "MODEL.PRETRAINED": "false", "AUG.SCALE": "[0.5, 1.0]"}
