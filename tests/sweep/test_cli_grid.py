"""A sweep from the command line (runner/sweep/grid.py, tools/sweeps/run.sh --cfg FILE --grid KEY V1,V2 ...):
written as a sweep file in its root, equal to the same sweep written by hand (same folders, same results); mistakes
in one line; `set:` interpolation that follows a swept key."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runner.config import load_config
from runner.errors import UserError
from runner.sweep.grid import grid_command, split_values
from runner.sweep.points import load_points
from runner.sweep.spec import read_sweep
from tests.sweep.test_launchers import DIGITS, TINY, run_sh, sweep_file
from tests.test_slurm import fake_sbatch, sbatch_calls, slurm_sh  # noqa: F401  (fake_sbatch: a fixture)
from tests.utils import ROOT, assert_user_error, read_jsonl

RESULT_KEYS = ("val/top1", "val/top5", "best/val/top1", "step")


def losses(run: Path) -> list[float]:
    """Every logged training loss of a run."""
    return [r["train/loss"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r]


def test_values_split_outside_brackets_and_quotes() -> None:
    assert split_values("[0.08,1.0],[0.5, 1.0]", "AUG.SCALE") == ["[0.08,1.0]", "[0.5, 1.0]"]
    assert split_values("'a,b',c", "MODEL.NAME") == ["'a,b'", "c"]
    with pytest.raises(UserError, match="unclosed quote or bracket"):
        split_values("[0.08,1.0", "AUG.SCALE")
    with pytest.raises(UserError, match="an empty value"):
        split_values("0.1,,0.2", "TRAIN.LR")


def test_the_written_file_is_the_command_line(tmp_path: Path) -> None:
    path = grid_command(["--root", str(tmp_path / "r"), "--cfg", str(DIGITS), "--grid", "TRAIN.LR", "0.1,1e-3",
                         "--grid", "AUG.SCALE", "[0.08,1.0],[0.5,1.0]", "MODEL.NAME", "18", "TRAIN.EPOCHS", "1"])
    assert path == str(tmp_path / "r" / "sweep.yaml")
    sweep = read_sweep(path)
    assert sweep.cfg == (str(DIGITS),) and sweep.root == str(tmp_path / "r")
    assert [v.value for v in sweep.grid["TRAIN.LR"]] == [0.1, 0.001]
    assert [v.value for v in sweep.grid["AUG.SCALE"]] == [(0.08, 1.0), (0.5, 1.0)]
    assert {k: v.value for k, v in sweep.fixed.items()} == {"MODEL.NAME": "18", "TRAIN.EPOCHS": 1}  # text kept


@pytest.mark.parametrize("args, fragment", [
    (["--cfg", str(DIGITS), "TRAIN.LR", "0.1"], "needs --cfg FILE and at least one --grid"),
    (["--cfg", str(DIGITS), "--grid", "TRAIN.LRR", "0.1,0.2"], "--grid TRAIN.LRR: unknown config key; did you mean"),
    (["--cfg", str(DIGITS), "--grid", "TRAIN.EPOCHS", "1,two"], "TRAIN.EPOCHS expects an integer, got 'two' (--grid)"),
    (["--cfg", "nope.yaml", "--grid", "TRAIN.LR", "0.1"], "--cfg nope.yaml: config file not found"),
    (["--cfg", str(DIGITS), "--grid", "TRAIN.LR", "0.1", "TRAIN.EPOCHS"], "TRAIN.EPOCHS has no value"),
])
def test_mistakes_are_one_line_and_write_nothing(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "runner.sweep", "grid", "--root", str(tmp_path / "r"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert_user_error(proc, fragment)
    assert not (tmp_path / "r").exists()


def test_set_interpolation_follows_the_swept_key(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, "set:\n  EVAL.IMG_SIZE: ${DATA.IMG_SIZE}\n  LOG.WANDB_PROJECT: p-${TRAIN.LR}\n"
                                "grid:\n  DATA.IMG_SIZE: [16, 24]\n")
    _, points = load_points(str(path), ["TRAIN.LR", "0.5"])
    assert [p.name for p in points] == ["data.img_size=16", "data.img_size=24"]  # named after the swept key only
    for point, size in zip(points, (16, 24), strict=True):
        cfg, _ = load_config(list(point.argv))
        assert (cfg.EVAL.IMG_SIZE, cfg.LOG.WANDB_PROJECT) == (size, "p-0.5")
    bad = sweep_file(tmp_path, "grid:\n  EVAL.IMG_SIZE: ['${DATA.IMG_SIZE}', 32]\n", "bad.yaml")
    with pytest.raises(UserError, match=r"bad.yaml:4: grid: EVAL.IMG_SIZE: \$\{...\} belongs in set:"):
        read_sweep(str(bad))


@pytest.mark.slow
def test_command_line_sweep_equals_the_same_sweep_as_a_file(tmp_path: Path) -> None:
    tiny = [a for pair in zip(TINY[::2], TINY[1::2], strict=True) if pair[0] != "DATA.IMG_SIZE" for a in pair]
    cli = run_sh("--cfg", str(DIGITS), "--grid", "TRAIN.LR", "0.1,0.05", "--grid", "AUG.SCALE",
                 "[0.5,1.0],[0.8,1.0]", *tiny, "EVAL.IMG_SIZE", "${DATA.IMG_SIZE}", "DATA.IMG_SIZE", "16",
                 SWEEP_ROOT=str(tmp_path / "cli"), JOBS="2")
    assert cli.returncode == 0, cli.stderr[-3000:]
    written = tmp_path / "cli" / "sweep.yaml"
    assert f"sweep: wrote {written}" in cli.stdout
    body = "set:\n" + "".join(f"  {k}: {v}\n" for k, v in zip(tiny[::2], tiny[1::2], strict=True))
    body += "  EVAL.IMG_SIZE: ${DATA.IMG_SIZE}\n  DATA.IMG_SIZE: 16\n"
    body += "grid:\n  TRAIN.LR: [0.1, 0.05]\n  AUG.SCALE: [[0.5, 1.0], [0.8, 1.0]]\n"
    by_hand = run_sh(str(sweep_file(tmp_path / "file", body)), JOBS="2")
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]
    names = {p.name for p in (tmp_path / "cli").iterdir() if (p / "results.json").exists()}
    assert names == {p.name for p in (tmp_path / "file" / "runs").iterdir() if (p / "results.json").exists()}
    assert names == {f"lr={lr},scale={s}" for lr in ("0.1", "0.05") for s in ("0.5_1.0", "0.8_1.0")}
    for name in names:
        runs = (tmp_path / "cli" / name, tmp_path / "file" / "runs" / name)
        a, b = (json.loads((run / "results.json").read_text()) for run in runs)
        assert [a[k] for k in RESULT_KEYS] == [b[k] for k in RESULT_KEYS], name
        assert [losses(run) for run in runs[:1]] == [losses(run) for run in runs[1:]], name
        stored = yaml.safe_load((tmp_path / "cli" / name / "config.yaml").read_text())
        assert stored["EVAL"]["IMG_SIZE"] == 16
    again = run_sh(str(written))  # the written file re-runs: every point is done
    assert again.returncode == 0 and again.stdout.count("(done)") == 4, again.stdout


def test_slurm_submits_the_command_line_sweep_as_its_file(tmp_path: Path, fake_sbatch: Path) -> None:  # noqa: F811
    root = tmp_path / "r"
    proc = slurm_sh(None, "--partition=gpu", "--cfg", str(DIGITS), "--grid", "TRAIN.LR", "0.1,0.05", "TRAIN.EPOCHS",
                    "1", SBATCH=str(fake_sbatch), SWEEP_ROOT=str(root))
    assert proc.returncode == 0, proc.stderr
    array = sbatch_calls(fake_sbatch)[0]
    assert "--partition=gpu" in array and "--job-name=sweep-r" in array
    manifest = Path(array[-1]).read_text().splitlines()
    assert [line.split("\t")[:3] for line in manifest] == [
        [name, str(root), str(root / name)] for name in ("lr=0.1", "lr=0.05")]
    assert read_sweep(str(root / "sweep.yaml")).fixed["TRAIN.EPOCHS"].value == 1
