"""runner/config/interp.py through load_config: ${KEY} and ${env:NAME[,default]} in files, overrides, text and
lists, resolved once and typed; cycles, unknown keys, unset variables and wrong types refused in one line; $${ for a
literal ${; config.yaml stores the resolved values and a resume keeps them after the environment changed; --explain;
two torchrun processes checked for the same values."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from runner.config import config_from_yaml_text, diff_configs, dump_config
from runner.config.interp import STORED_CONFIG
from runner.preflight import load_config
from runner.rundir.layout import CONFIG
from tests.config.test_loader import user_error_line, write
from tests.utils import ROOT, TINY, TRAIN, env, read_jsonl, run_tool, torchrun

DIGITS = str(ROOT / "configs" / "digits" / "test_resnet.yaml")


def test_file_references_are_typed_and_follow_the_final_value(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", "DATA:\n  IMG_SIZE: 32\n  MEAN: ['${TRAIN.LR}', 0.5, 0.5]\n"
                                     "EVAL:\n  IMG_SIZE: ${DATA.IMG_SIZE}\n"
                                     "AUG:\n  SCALE: [0.25, 1.0]\n  RATIO: ${AUG.SCALE}\n"
                                     "OUTPUT_DIR: out/${MODEL.NAME}-${DATA.IMG_SIZE}px\n")
    cfg, _ = load_config(["--cfg", path, "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "48"])
    assert cfg.EVAL.IMG_SIZE == 48 and isinstance(cfg.EVAL.IMG_SIZE, int)  # the final value, as an integer
    assert cfg.OUTPUT_DIR == "out/resnet10t-48px"  # inside text, after the overrides
    assert cfg.AUG.RATIO == (0.25, 1.0)  # a whole list
    assert cfg.DATA.MEAN == (cfg.TRAIN.LR, 0.5, 0.5)  # a list item


def test_overrides_and_list_items_interpolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RED", "0.25")
    monkeypatch.chdir(tmp_path)
    cfg, info = load_config(["EVAL.IMG_SIZE", "${DATA.IMG_SIZE}", "DATA.IMG_SIZE", "40", "TRAIN.EPOCHS",
                             "${env:EPOCHS_NOT_SET,3}", "DATA.MEAN", "['${env:RED}', 0.5, '${TRAIN.LR}']"])
    assert (cfg.EVAL.IMG_SIZE, cfg.TRAIN.EPOCHS, cfg.DATA.MEAN) == (40, 3, (0.25, 0.5, cfg.TRAIN.LR))
    assert "mean=0.25_0.5_" in cfg.OUTPUT_DIR  # the folder is named after the resolved override
    assert info.resolved.env_keys == {"TRAIN.EPOCHS": ["EPOCHS_NOT_SET"], "DATA.MEAN": ["RED"]}


def test_env_with_and_without_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    path = write(tmp_path, "a.yaml", "DATA:\n  ROOT: ${env:DATA_HOME,/nowhere}/digits\n"
                                     "MODEL:\n  NAME: ${env:NET}\nOUTPUT_DIR: o\n")
    monkeypatch.setenv("NET", "resnet10t")
    monkeypatch.setenv("DATA_HOME", "/data")
    cfg, _ = load_config(["--cfg", path])
    assert (cfg.DATA.ROOT, cfg.MODEL.NAME) == ("/data/digits", "resnet10t")
    monkeypatch.delenv("DATA_HOME")
    assert load_config(["--cfg", path])[0].DATA.ROOT == "/nowhere/digits"
    monkeypatch.delenv("NET")
    line = user_error_line(["--cfg", path], capsys)
    assert "${env:NET}: the environment variable NET is not set" in line and f"{path}:4" in line, line


@pytest.mark.parametrize("text, fragments", [
    ("DATA:\n  IMG_SIZE: ${EVAL.IMG_SIZE}\nEVAL:\n  IMG_SIZE: ${TRAIN.EPOCHS}\nTRAIN:\n  EPOCHS: ${DATA.IMG_SIZE}\n",
     ["interpolation cycle: DATA.IMG_SIZE (A:2) -> EVAL.IMG_SIZE (A:4) -> TRAIN.EPOCHS (A:6) -> DATA.IMG_SIZE"]),
    ("DATA:\n  ROOT: /d/${MODEL.NAM}\n", ["${MODEL.NAM} is not a config key; did you mean MODEL.NAME?", "A:2"]),
    ("MODEL:\n  NAME: x${DATA.ROOT}\nDATA:\n  ROOT: ${TRAIN}\n",
     ["${TRAIN} is a section, not a key", "A:4: DATA.ROOT: ${TRAIN}; used by MODEL.NAME (A:2)"]),
    ("EVAL:\n  IMG_SIZE: ${MODEL.NAME}\n", ["EVAL.IMG_SIZE expects an integer, got 'resnet18'", "A:2"]),
    ("EVAL:\n  IMG_SIZE: ${DATA.IMG_SIZE\n", ["has a ${ without its closing }", "A:2"]),
])
def test_cycles_unknown_keys_and_wrong_types_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           text: str, fragments: list[str]) -> None:
    path = write(tmp_path, "a.yaml", text)
    line = user_error_line(["--cfg", path, "OUTPUT_DIR", "o"], capsys)
    for fragment in fragments:
        assert fragment.replace("A:", f"{path}:") in line, line


def test_escape_is_literal_and_config_yaml_keeps_it(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", "LOG:\n  WANDB_PROJECT: cost-$${HOME}-${DATA.IMG_SIZE}\nOUTPUT_DIR: o\n")
    cfg, _ = load_config(["--cfg", path])
    assert cfg.LOG.WANDB_PROJECT == "cost-${HOME}-32"
    text = dump_config(cfg)  # what config.yaml holds: resolved, the literal ${ written back as $${
    assert yaml.safe_load(text)["LOG"]["WANDB_PROJECT"] == "cost-$${HOME}-32"
    assert diff_configs(config_from_yaml_text(text), cfg) == []  # a stored config is read, never resolved
    again, _ = load_config(["--cfg", write(tmp_path, "stored.yaml", text)])  # loadable again with --cfg
    assert diff_configs(again, cfg) == []


def test_the_stored_config_name_is_the_run_folders() -> None:
    assert STORED_CONFIG == CONFIG  # interp.py cannot import runner.rundir (a layer above config/)


def test_explain_shows_the_expression_and_where_it_was_written(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", f"_BASE_: {DIGITS}\nEVAL:\n  IMG_SIZE: ${{DATA.IMG_SIZE}}\n"
                                     "DATA:\n  ROOT: ${env:DATA_HOME,/nowhere}\n")
    proc = run_tool("train.py", ["--cfg", path, "--explain", "DATA.IMG_SIZE", "16", "LOG.WANDB_PROJECT",
                                 "p-${MODEL.NAME}"], env=env(DATA_HOME="/scratch/me"))
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if not line.startswith("#")}
    assert rows["EVAL.IMG_SIZE"].split("<- ")[1] == f"{path}:3: ${{DATA.IMG_SIZE}}", rows
    assert rows["EVAL.IMG_SIZE"].split()[1] == "16"
    assert rows["DATA.ROOT"].split()[1] == "/scratch/me"
    assert rows["LOG.WANDB_PROJECT"].split("<- ")[1] == "command line: p-${MODEL.NAME}"
    assert rows["LOG.WANDB_PROJECT"].split()[1] == "p-test_resnet"


@pytest.mark.slow
def test_config_yaml_is_resolved_and_a_resume_does_not_resolve_again(tmp_path: Path) -> None:
    out = tmp_path / "run"
    path = write(tmp_path, "a.yaml", f"_BASE_: {DIGITS}\nTRAIN:\n  LR: ${{env:MY_LR}}\n  EPOCHS: 2\n")
    args = ["--cfg", path, *TINY[:6], "DATA.NUM_WORKERS", "0", "OUTPUT_DIR", str(out)]
    first = run_tool("train.py", [*args, "--pause-after-epoch", "1"], env=env(MY_LR="0.02"))
    assert first.returncode == 0, first.stderr
    assert yaml.safe_load((out / CONFIG).read_text())["TRAIN"]["LR"] == 0.02  # resolved, no ${ left
    assert json.loads((out / "run.json").read_text())["status"] == "paused"
    explain = run_tool("train.py", [*args, "--explain"], env=env(MY_LR="0.5"))
    row = next(line for line in explain.stdout.splitlines() if line.startswith("TRAIN.LR"))
    assert row.split()[1] == "0.02" and f"kept from {out / CONFIG}" in row and "MY_LR" in row, row
    second = run_tool("train.py", args, env=env(MY_LR="0.5"))  # the environment changed since the first start
    assert second.returncode == 0, second.stderr
    assert yaml.safe_load((out / CONFIG).read_text())["TRAIN"]["LR"] == 0.02
    rows = read_jsonl(out / "metrics.jsonl")
    assert {r["epoch"] for r in rows if "train/loss" in r} == {1, 2}
    assert max(r["train/lr"] for r in rows if "train/lr" in r) <= 0.02  # the run's own LR, never 0.5


@pytest.mark.slow
def test_two_torchrun_processes_get_the_same_values_or_stop(tmp_path: Path) -> None:
    def launch(out: Path, *extra: str) -> subprocess.CompletedProcess:
        cmd = torchrun(["--standalone", "--nproc_per_node=2", TRAIN, "--cfg", DIGITS, *TINY, "TRAIN.MAX_STEPS",
                        "2", "DIST.TIMEOUT_S", "60", "EVAL.IMG_SIZE", "${DATA.IMG_SIZE}", *extra,
                        "OUTPUT_DIR", str(out)])
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env(RUN_TAG="t1"), timeout=240)

    same = launch(tmp_path / "same", "LOG.WANDB_PROJECT", "p-${env:RUN_TAG}")
    assert same.returncode == 0, same.stderr[-3000:]
    stored = yaml.safe_load((tmp_path / "same" / CONFIG).read_text())
    assert (stored["EVAL"]["IMG_SIZE"], stored["LOG"]["WANDB_PROJECT"]) == (16, "p-t1")
    apart = launch(tmp_path / "apart", "LOG.WANDB_PROJECT", "p-${env:RANK}")  # each process reads its own RANK
    errors = [line for line in apart.stderr.splitlines() if line.startswith("error:")]
    assert apart.returncode != 0 and len(errors) == 1, apart.stderr[-3000:]
    assert ("rank 1 resolved the config differently from rank 0 (LOG.WANDB_PROJECT: 'p-0' on rank 0, 'p-1' on "
            "rank 1)") in errors[0], errors
    assert not (tmp_path / "apart").exists()  # stopped before the claim
