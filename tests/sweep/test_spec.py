"""runner.sweep: a sweep file read and checked, its points crossed, named and built; the CLI's NUL fields in bash."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner.config import load_config
from runner.errors import UserError
from runner.sweep.__main__ import encode
from runner.sweep.points import load_points, plan, point_name
from runner.sweep.spec import read_sweep, token_for

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs/digits/test_resnet.yaml"
TRICKY = ["my exp 'single' \"double\" $(touch PWNED) `touch PWNED2` ; | & * ?", " lead", "trail ", "-dash", "yes",
          "1.50", "#hash", "a: b", "", "line1\nline2", "é ü"]


def write(path: Path, text: str) -> Path:
    """`text` (dedented) in the file `path`, its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def sweep_file(tmp_path: Path, body: str, name: str = "s.yaml") -> Path:
    """A sweep file in tmp_path whose cfg is the digits config (absolute) and whose root is tmp_path/out."""
    return write(tmp_path / name, f"cfg: {DIGITS}\nroot: out\n" + textwrap.dedent(body))


def refused(path: Path, *match: str, extra: list[str] | None = None) -> str:
    """The one-line UserError that load_points raises for `path`, checked to contain each of `match`."""
    with pytest.raises(UserError) as e:
        load_points(str(path), extra or [])
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"sweep {path}")
    for m in match:
        assert m in text, text
    return text


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -m runner.sweep ARGS` as the launchers run it."""
    return subprocess.run([sys.executable, "-m", "runner.sweep", *args], capture_output=True, cwd=cwd, timeout=120)


# ---------------------------------------------------------------------------------------------------------------
# Crossing, set, overrides
# ---------------------------------------------------------------------------------------------------------------
def test_shipped_lr_x_model_crosses_the_grid_in_file_order(monkeypatch):
    monkeypatch.chdir(ROOT)
    sweep, points = load_points("configs/sweeps/lr_x_model.yaml")
    assert sweep.root == os.path.join("output", "sweeps", "lr_x_model")
    assert [p.name for p in points] == [f"lr={lr},model.name={m}" for lr in ("0.008", "0.004", "0.002")
                                        for m in ("test_resnet", "resnet10t")]
    first = points[0]
    assert first.output_dir == "output/sweeps/lr_x_model/lr=0.008,model.name=test_resnet"
    assert first.argv == ("--cfg=configs/digits/test_resnet.yaml", "TRAIN.LR", "0.008", "MODEL.NAME", "test_resnet",
                          "OUTPUT_DIR", first.output_dir)
    cfg, _ = load_config(list(points[-1].argv))
    assert (cfg.TRAIN.LR, cfg.MODEL.NAME, cfg.DATA.IMG_SIZE) == (0.002, "resnet10t", 24)


def test_shipped_wd_x_smoothing_sets_epochs_for_every_point():
    _, points = load_points(str(ROOT / "configs/sweeps/wd_x_smoothing.yaml"))
    assert len(points) == 9
    cfg, _ = load_config(list(points[5].argv))
    assert (cfg.TRAIN.EPOCHS, cfg.TRAIN.WEIGHT_DECAY, cfg.TRAIN.LABEL_SMOOTHING) == (8, 0.05, 0.2)
    assert points[5].name == "label_smoothing=0.2,weight_decay=0.05"


def test_points_are_crossed_with_the_grid_points_slowest(tmp_path):
    path = sweep_file(tmp_path, """
        grid:
          TRAIN.LR: [0.1, 0.01]
        points:
          - {TRAIN.OPTIMIZER: sgd, TRAIN.WEIGHT_DECAY: 0.0001}
          - {TRAIN.OPTIMIZER: adamw}
    """)
    _, points = load_points(str(path))
    got = [(cfg.TRAIN.OPTIMIZER, cfg.TRAIN.LR, cfg.TRAIN.WEIGHT_DECAY)
           for cfg in (load_config(list(p.argv))[0] for p in points)]
    assert got == [("sgd", 0.1, 0.0001), ("sgd", 0.01, 0.0001), ("adamw", 0.1, 0.05), ("adamw", 0.01, 0.05)]
    assert points[0].name == "lr=0.1,optimizer=sgd,weight_decay=0.0001"
    assert points[3].name == "lr=0.01,optimizer=adamw"


def test_points_alone_and_the_empty_point(tmp_path):
    path = sweep_file(tmp_path, "points:\n  - {}\n  - {SEED: 3}\n")
    _, points = load_points(str(path))
    assert [p.name for p in points] == ["base", "seed=3"]
    assert load_config(list(points[0].argv))[0].SEED == 0


def test_yaml_anchors_and_merge_keys_work_in_points(tmp_path):
    path = sweep_file(tmp_path, """
        points:
          - &sgd {TRAIN.OPTIMIZER: sgd, TRAIN.LR: 0.1}
          - {<<: *sgd, TRAIN.LR: 0.05}
          - {<<: *sgd, TRAIN.LR: 0.05}
    """)
    refused(path, ":7: points: the list holds the same point twice (lines 6 and 7)")
    path.write_text(path.read_text().rsplit("\n", 2)[0] + "\n")
    _, points = load_points(str(path))
    assert [p.name for p in points] == ["lr=0.1,optimizer=sgd", "lr=0.05,optimizer=sgd"]


def test_set_is_for_every_point_and_the_command_line_wins_over_it(tmp_path):
    path = sweep_file(tmp_path, """
        set: {TRAIN.EPOCHS: 3, LOG.PERIOD: 7}
        grid: {SEED: [1, 2]}
    """)
    _, points = load_points(str(path), ["TRAIN.EPOCHS", "5"])
    for point, seed in zip(points, (1, 2), strict=True):
        cfg, info = load_config(list(point.argv))
        assert (cfg.TRAIN.EPOCHS, cfg.LOG.PERIOD, cfg.SEED) == (5, 7, seed)
    assert points[0].argv.index("LOG.PERIOD") < points[0].argv.index("SEED")  # set, command line, then the point


def test_command_line_mistakes_are_refused(tmp_path):
    path = sweep_file(tmp_path, "grid: {SEED: [1, 2]}\npoints: [{TRAIN.LR: 0.1}]\n")
    refused(path, "SEED is set per point by the sweep's grid:", extra=["SEED", "3"])
    refused(path, "TRAIN.LR is set per point by the sweep's points:", extra=["TRAIN.LR", "3"])
    refused(path, "OUTPUT_DIR is the sweep's", extra=["OUTPUT_DIR", "x"])
    refused(path, "TRAIN.EPOCHS has no value", extra=["TRAIN.EPOCHS"])
    refused(path, "--cfg=x.yaml: after the sweep file come KEY VALUE pairs", extra=["--cfg=x.yaml"])
    refused(path, "point lr=0.1,seed=1: unknown config key TRAIN.EPOCH on the command line",
            extra=["TRAIN.EPOCH", "3"])


# ---------------------------------------------------------------------------------------------------------------
# Paths, values, names
# ---------------------------------------------------------------------------------------------------------------
def test_relative_paths_are_relative_to_the_sweep_files_folder(tmp_path, monkeypatch):
    write(tmp_path / "configs/base.yaml", "TRAIN:\n  EPOCHS: 2\n")
    write(tmp_path / "mine/sweeps/a.yaml", "cfg: [../../configs/base.yaml]\nroot: ../runs\ngrid: {SEED: [1]}\n")
    monkeypatch.chdir(tmp_path / "mine")  # the paths in the file do not depend on the current folder
    sweep, points = load_points("sweeps/a.yaml")
    assert sweep.cfg == (os.path.join("..", "configs", "base.yaml"),)
    assert points[0].output_dir == os.path.join("runs", "seed=1")
    assert load_config(list(points[0].argv))[0].TRAIN.EPOCHS == 2


def test_the_default_root_is_output_sweeps_and_the_file_stem(tmp_path):
    path = write(tmp_path / "deep/lr_scan.yaml", f"cfg: {DIGITS}\ngrid: {{SEED: [1]}}\n")
    assert read_sweep(str(path)).root == os.path.join("output", "sweeps", "lr_scan")
    proc = cli("root", str(path))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"output/sweeps/lr_scan\n", b"")


def test_list_values_are_values(tmp_path):
    path = sweep_file(tmp_path, "grid:\n  AUG.SCALE: [[0.08, 1.0], [0.5, 1.0]]\n")
    _, points = load_points(str(path))
    assert [p.name for p in points] == ["scale=0.08_1.0", "scale=0.5_1.0"]
    assert [load_config(list(p.argv))[0].AUG.SCALE for p in points] == [(0.08, 1.0), (0.5, 1.0)]


def test_plain_scalars_keep_their_text_for_text_keys(tmp_path):
    path = sweep_file(tmp_path, "grid:\n  LOG.MLFLOW_EXPERIMENT: [1.50, 18, yes, 'no']\n")
    _, points = load_points(str(path))
    assert [load_config(list(p.argv))[0].LOG.MLFLOW_EXPERIMENT for p in points] == ["1.50", "18", "yes", "no"]
    assert [p.name for p in points] == [f"mlflow_experiment={v}" for v in ("1.50", "18", "yes", "no")]


def test_names_are_stable_across_key_order_and_set(tmp_path):
    a = sweep_file(tmp_path, "set: {SEED: 1, TRAIN.EPOCHS: 2}\ngrid: {TRAIN.LR: [0.1], MODEL.NAME: [resnet10t]}\n",
                   "a.yaml")
    b = sweep_file(tmp_path, "grid: {MODEL.NAME: [resnet10t], TRAIN.LR: [0.1]}\nset: {TRAIN.EPOCHS: 2, SEED: 1}\n",
                   "b.yaml")
    names = [plan(read_sweep(str(p)))[0].name for p in (a, b)]
    assert names == ["lr=0.1,model.name=resnet10t"] * 2
    assert point_name({"TRAIN.LR": 1e-05, "AMP.ENABLED": True}) == "amp.enabled=true,lr=1e-05"
    assert point_name({"MODEL.NAME": "hf-hub:timm/resnet\n"}) == "model.name=hf-hub:timm_resnet_"
    long = point_name({"LOG.MLFLOW_EXPERIMENT": "x" * 300})
    assert len(long) == 120 and long != point_name({"LOG.MLFLOW_EXPERIMENT": "x" * 301})


def test_two_points_in_one_folder_are_refused_before_anything_runs(tmp_path):
    path = sweep_file(tmp_path, "grid:\n  MODEL.NAME: [timm/resnet, timm_resnet]\n")
    refused(path, "points MODEL.NAME=timm/resnet and MODEL.NAME=timm_resnet would train in one folder",
            str(tmp_path / "out/model.name=timm_resnet"))
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------
# Mistakes in the file: one line, before anything runs
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, match", [
    ("grid: {TRAIN.LRR: [0.1]}\n", ":3: grid: unknown config key TRAIN.LRR; did you mean TRAIN.LR?"),
    ("grid: {TRAIN.LR: [0.1, abc]}\n", "TRAIN.LR expects"),
    ("set: {TRAIN: 3}\ngrid: {SEED: [1]}\n", ":3: set: TRAIN is a section, not a key"),
    ("gird: {SEED: [1]}\n", ":3: unknown section 'gird'"),
    ("grid: {SEED: 1}\n", ":3: grid: SEED must be a list of values"),
    ("grid: {SEED: []}\n", ":3: grid: SEED has an empty list"),
    ("grid: {SEED: [1, 2, 1]}\n", "grid: SEED lists the same value twice"),
    ("points:\n  - {SEED: 1}\n  - {SEED: 1}\n", ":5: points: the list holds the same point twice (lines 4 and 5)"),
    ("points: [SEED]\n", "points: each point must be a mapping"),
    ("set: {SEED: 1}\ngrid: {SEED: [1, 2]}\n", "SEED is in set: and in grid:"),
    ("grid: {SEED: [1]}\npoints: [{SEED: 2}]\n", "SEED is in grid: and in points:"),
    ("grid: {OUTPUT_DIR: [a, b]}\n", "grid: OUTPUT_DIR is the sweep's"),
    ("set: {SEED: 1}\n", "no points (it has none); give grid: or points:"),
    ("search: {trials: 3}\n", "no points (a search: is run by tools/sweeps/run.sh"),
    ("grid: {SEED: [1]}\ngrid: {SEED: [2]}\n", "the top level: grid is given twice"),
    ("grid: {TRAIN.LABEL_SMOOTHING: [0.1, 1.5]}\n", "point label_smoothing=1.5: TRAIN.LABEL_SMOOTHING must be"),
    ("grid: {SEED: !!python/object/apply:os.system [touch PWNED]}\n", ":3: YAML tag tag:yaml.org,2002:python/"),
    ("grid: {SEED: [1}\n", "YAML syntax error"),
])
def test_a_mistake_in_the_file_is_one_line(tmp_path, body, match):
    refused(sweep_file(tmp_path, body), match)
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "out").exists()


def test_a_missing_cfg_file_and_a_missing_sweep_file(tmp_path):
    path = write(tmp_path / "s.yaml", "cfg: nope.yaml\ngrid: {SEED: [1]}\n")
    refused(path, f":1: cfg: config file {tmp_path / 'nope.yaml'} not found")
    with pytest.raises(UserError, match="sweep file .*missing.yaml not found"):
        read_sweep(str(tmp_path / "missing.yaml"))


def test_search_is_kept_as_written(tmp_path):
    sweep = read_sweep(str(sweep_file(tmp_path, "grid: {SEED: [1]}\nsearch: {trials: 9, space: {TRAIN.LR: "
                                                "{log: [1.0e-5, 1]}}}\n")))
    assert sweep.search == {"trials": 9, "space": {"TRAIN.LR": {"log": [1e-5, 1]}}}


def test_token_for_reads_back_as_the_value():
    for value in TRICKY + [0.001, 1e-05, True, 3, [0.5, 1.0], ["a b", "-c"]]:
        token = token_for(value)
        assert not token.startswith("--")
        assert load_config(["OUTPUT_DIR", "/tmp/x", "LOG.MLFLOW_EXPERIMENT", token_for(str(value))],
                           check_paths=False)[0].LOG.MLFLOW_EXPERIMENT == str(value)
    # the text as written when it reads back as the value (a float key's 1.50), else a quoted string
    assert token_for(1.5, raw="1.50") == "1.50" and token_for("1.50") == "'1.50'" and token_for("-c") == "'-c'"


# ---------------------------------------------------------------------------------------------------------------
# The CLI: NUL fields read by bash exactly; a mistake prints nothing on stdout
# ---------------------------------------------------------------------------------------------------------------
READER = r"""
out=$(mktemp)
"$PYTHON" -m runner.sweep points --no-paths "$@" >"$out" || exit 2
mapfile -d '' -t F <"$out"
for ((i = 0; i < ${#F[@]}; i += 3 + F[i + 2])); do
  name=${F[i]} dir=${F[i + 1]} args=("${F[@]:i + 3:F[i + 2]}")
  printf '%s\0' "$name" "$dir" "${#args[@]}" "${args[@]}" >>"$RESULT"
done
rm -f -- "$out"
"""


def test_the_cli_output_round_trips_through_bash_exactly(tmp_path):
    values = "\n".join(f"    - {json.dumps(v)}" for v in TRICKY)  # a JSON string is a YAML scalar
    path = write(tmp_path / "dir with space/s.yaml", f"cfg: {DIGITS}\nroot: 'out $(x)'\ngrid:\n"
                                                      f"  LOG.MLFLOW_EXPERIMENT:\n{values}\n")
    extra = ["LOG.WANDB_ENTITY", "team 'a' $(touch PWNED3) \"b\""]
    result = tmp_path / "result"
    env = dict(os.environ, RESULT=str(result), PYTHON=sys.executable)
    proc = subprocess.run(["bash", "-c", READER, "reader", str(path), *extra], capture_output=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _, points = load_points(str(path), extra, check_paths=False)
    assert result.read_bytes() == encode(points)
    assert len(points) == len(TRICKY)
    for point, value in zip(points, TRICKY, strict=True):
        cfg, _ = load_config(list(point.argv), check_paths=False)
        assert (cfg.LOG.MLFLOW_EXPERIMENT, cfg.LOG.WANDB_ENTITY) == (value, extra[1])
        assert cfg.OUTPUT_DIR == str(tmp_path / "dir with space/out $(x)" / point.name)
    assert not any(p.name.startswith("PWNED") for p in tmp_path.rglob("*"))
    assert not list(ROOT.glob("PWNED*"))


def test_the_cli_says_a_mistake_in_one_line_and_prints_nothing(tmp_path):
    path = sweep_file(tmp_path, "grid: {TRAIN.LABEL_SMOOTHING: [0.1, 1.5]}\n")
    proc = cli("points", str(path))
    assert proc.returncode == 2 and proc.stdout == b""
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: sweep {path}: point label_smoothing=1.5: "), lines
    for args in (["points"], ["bogus", str(path)], ["points", "--nope", str(path)]):
        proc = cli(*args)
        assert (proc.returncode, proc.stdout) == (2, b"") and len(proc.stderr.splitlines()) == 1, args


def test_the_cli_root_option_moves_the_points(tmp_path):
    path = sweep_file(tmp_path, "grid: {SEED: [1]}\n")
    proc = cli("points", "--root", str(tmp_path / "elsewhere"), str(path))
    fields = proc.stdout.split(b"\0")
    assert proc.returncode == 0 and fields[1] == str(tmp_path / "elsewhere/seed=1").encode()


def test_the_sweep_package_imports_no_torch():
    code = ("import sys, runner.sweep.spec, runner.sweep.points, runner.sweep.__main__; "
            "bad = [m for m in ('torch', 'timm', 'torchvision') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
