"""A run's identity includes how long it runs: an epochs ablation on the default OUTPUT_DIR is one run per value."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.utils import ROOT, TRAIN, env

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
# tiny: 16 px, batches of 128 (11 full steps an epoch), the default OUTPUT_DIR (no OUTPUT_DIR given)
TINY = ["--cfg", DIGITS, "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "128", "DATA.NUM_WORKERS", "0",
        "LOG.PROGRESS", "plain", "LOG.TENSORBOARD", "false"]


def train(cwd, *args: str) -> subprocess.CompletedProcess:
    """tools/train.py in `cwd`, so that its default output/ folder lands there."""
    return subprocess.run([sys.executable, TRAIN, *TINY, *args], capture_output=True, text=True, cwd=cwd,
                          env=env(), timeout=300)


@pytest.mark.slow
def test_epochs_ablation_gives_one_result_per_value(tmp_path):
    """TRAIN.EPOCHS 1, 2, 3 on the default OUTPUT_DIR: three folders, three results of their own length."""
    for epochs in (1, 2, 3):
        r = train(tmp_path, "TRAIN.EPOCHS", str(epochs))
        assert r.returncode == 0 and r.stderr == "", r.stdout[-2000:] + r.stderr
    folders = sorted(p.parent for p in (tmp_path / "output").rglob("results.json"))
    assert [f.name.rsplit("-", 1)[-1] for f in folders] == ["epochs=1", "epochs=2", "epochs=3"]
    results = [json.loads((f / "results.json").read_text()) for f in folders]
    assert [(r["epochs"], r["epoch"], r["step"]) for r in results] == [(1, 1, 11), (2, 2, 22), (3, 3, 33)]
    assert all("extended_from" not in r for r in results)
    # the same value again answers from its own folder; nothing is rewritten
    before = (folders[1] / "results.json").read_bytes()
    r = train(tmp_path, "TRAIN.EPOCHS", "2")
    assert r.returncode == 0 and "already done" in r.stdout and "it ran 2 epochs, 22 steps" in r.stdout
    assert (folders[1] / "results.json").read_bytes() == before


def test_training_a_finished_run_on_is_explicit_and_says_how_the_lr_continues(tmp_path):
    """finished_run/keep_finished_result on a finished folder (no training: the rule itself)."""
    from runner.config import dump_config, load_config
    from runner.errors import UserError
    from runner.rundir import marker, rules

    def cfg(*extra: str):
        return load_config(["--cfg", DIGITS, "OUTPUT_DIR", str(tmp_path), "TRAIN.EPOCHS", "2", *extra])[0]

    marker.write_status(str(tmp_path), marker.DONE)
    (tmp_path / "config.yaml").write_text(dump_config(cfg("TRAIN.MAX_STEPS", "20")))
    done = {"status": "done", "epoch": 1, "step": 20, "epochs": 2, "max_steps": 20, "val/top1": 90.0}
    marker.write_json_atomic(tmp_path / "results.json", done)
    assert rules.finished_run(cfg("TRAIN.MAX_STEPS", "20"))[1].startswith("it ran 20 steps")
    # more steps of the same 2-epoch schedule: refused without TRAIN.EXTEND, and the line says the LR goes on
    with pytest.raises(UserError, match="add TRAIN.EXTEND True .* results-step20.json; the LR follows the same"):
        rules.finished_run(cfg("TRAIN.MAX_STEPS", "30"))
    # more epochs: the cosine is re-derived, and the line says so
    with pytest.raises(UserError, match="re-derived for 3 epochs instead of 2 .* warm restart"):
        rules.finished_run(cfg("TRAIN.EPOCHS", "3"))
    extend = cfg("TRAIN.MAX_STEPS", "30", "TRAIN.EXTEND", "true")
    assert rules.finished_run(extend) is None
    assert "kept as results-step20.json" in rules.keep_finished_result(extend)
    assert json.loads((tmp_path / "results-step20.json").read_text()) == done
    assert not (tmp_path / "results.json").exists()
