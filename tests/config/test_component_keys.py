"""Registered components declare their own config keys (runner.keys.Key): a schedule with two knobs and a data source
with three, each added by one module of the user's (IMPORTS) and one registration line, are set from YAML and the
command line, listed by --help-keys, validated in one line, and refused on resume where a resume may not change them.
Nothing in runner/config/ is edited for them."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.utils import assert_user_error, read_jsonl, run_tool

# One module, and one line per component: the schedule's and the source's knobs are declared in their register line
PLUGIN = '''
"""A halving LR schedule with two knobs and the digits, cut to a fraction, with three."""
import logging

from runner.data.sources import register
from runner.keys import Key, above
from runner.optim import register_schedule


def halving(cfg, optimizer, steps_per_epoch):
    from timm.scheduler import StepLRScheduler

    every = max(1, round(cfg.TRAIN.HALVING_EVERY * steps_per_epoch))
    return StepLRScheduler(optimizer, decay_t=every, decay_rate=cfg.TRAIN.HALVING_RATE, t_in_epochs=False)


def build(cfg, dist):
    from runner.data import digits

    logging.getLogger("runner").info("cut_digits: fraction %s, order %s, note %r", cfg.DATA.CUT_FRACTION,
                                     cfg.DATA.CUT_ORDER, cfg.DATA.CUT_NOTE)
    return digits.build(cfg, dist)


register_schedule("halving", halving, reads=(), doc="LR times HALVING_RATE every HALVING_EVERY epochs", keys=(
    Key("TRAIN.HALVING_EVERY", 1.0, "halving: epochs between two cuts of the LR", check=above(0)),
    Key("TRAIN.HALVING_RATE", 0.5, "halving: the factor of each cut", check=(lambda x: 0 < x < 1, "in (0, 1)"))))
register("cut_digits", __name__, in_process=True, doc="a fraction of the digits", after="DATA.VAL_FRACTION", keys=(
    Key("DATA.CUT_FRACTION", 1.0, "cut_digits: the fraction of the digits kept",
        check=(lambda x: 0 < x <= 1, "in (0, 1]")),
    Key("DATA.CUT_ORDER", "kept", "cut_digits: kept | shuffled", choices=("kept", "shuffled")),
    Key("DATA.CUT_NOTE", "", "cut_digits: a note for the log (a resume may change it)", resume_safe=True)))
'''

RUN = ["DATA.NAME", "cut_digits", "TRAIN.SCHEDULER", "halving", "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "16",
       "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "1", "DATA.NUM_WORKERS", "0", "DEVICE", "cpu", "LOG.TENSORBOARD",
       "false"]


def plugin(tmp_path: Path, yaml_text: str = "") -> Path:
    """The user's module and a config file importing it (and setting `yaml_text`); the config's path."""
    module = tmp_path / "my_components.py"
    module.write_text(PLUGIN)
    config = tmp_path / "exp.yaml"
    config.write_text(f"IMPORTS: [{module}]\n{yaml_text}")
    return config


def test_knobs_set_from_yaml_and_the_command_line(tmp_path):
    config = plugin(tmp_path, "TRAIN:\n  HALVING_EVERY: 2\nDATA:\n  CUT_ORDER: shuffled\n")
    r = run_tool("train.py", ["--cfg", str(config), *RUN, "DATA.CUT_FRACTION", "0.5", "--explain"], timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert rows["TRAIN.HALVING_EVERY"].split()[1:] == ["2.0", "<-", f"{config}:3"]  # a float key: 2 fitted
    assert rows["DATA.CUT_ORDER"].split()[1:] == ["shuffled", "<-", f"{config}:5"]
    assert rows["DATA.CUT_FRACTION"].split(None, 3)[1:] == ["0.5", "<-", "command line"]
    assert "TRAIN.HALVING_RATE" not in rows  # at its declared default
    # the command line alone may import the module too (IMPORTS is paired before the other overrides)
    module = tmp_path / "my_components.py"
    r = run_tool("train.py", ["IMPORTS", f"[{module}]", *RUN, "TRAIN.HALVING_RATE", "0.25", "--print-config"],
                 timeout=60)
    assert r.returncode == 0, r.stderr
    # the schedule's knobs end their section (its line named no place); the source's stand where its line put them
    assert "  TIME_LIMIT: ''\n  HALVING_EVERY: 1.0\n  HALVING_RATE: 0.25\nDISTILL:\n" in r.stdout
    assert "  VAL_FRACTION: 0.2\n  CUT_FRACTION: 1.0\n  CUT_ORDER: kept\n  CUT_NOTE: ''\n  SYNTHETIC_SIZE:" in r.stdout


def test_help_keys_lists_the_knobs_and_the_tables_lists_the_names(tmp_path):
    config = plugin(tmp_path)
    r = run_tool("train.py", ["--cfg", str(config), "--help-keys", "DATA.CUT"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "DATA.CUT_FRACTION = 1.0", "    cut_digits: the fraction of the digits kept",
        "DATA.CUT_ORDER = kept", "    cut_digits: kept | shuffled",
        "DATA.CUT_NOTE = ''", "    cut_digits: a note for the log (a resume may change it)"]
    train = run_tool("train.py", ["--cfg", str(config), "--help-keys", "TRAIN"], timeout=60).stdout
    assert "TRAIN.HALVING_EVERY = 1.0\n    halving: epochs between two cuts of the LR\n" in train
    assert "  halving: LR times HALVING_RATE every HALVING_EVERY epochs\n" in train  # TRAIN.SCHEDULER's list
    name = run_tool("train.py", ["--cfg", str(config), "--help-keys", "DATA.NAME"], timeout=60).stdout
    assert "  cut_digits: a fraction of the digits\n" in name
    # without the module none of it exists: its knobs are unknown keys, with the usual one line
    assert_user_error(run_tool("train.py", ["DATA.CUT_FRACTION", "0.5"], timeout=60),
                      "unknown config key DATA.CUT_FRACTION on the command line")


@pytest.mark.parametrize("yaml_text, args, words", [
    ("DATA:\n  CUT_FRACTION: 0\n", [], "DATA.CUT_FRACTION must be in (0, 1], got 0.0 ({cfg}:3)"),
    ("", ["TRAIN.HALVING_RATE", "1.5"], "TRAIN.HALVING_RATE must be in (0, 1), got 1.5 (command line)"),
    ("", ["DATA.CUT_ORDER", "shufled"], "DATA.CUT_ORDER must be one of kept|shuffled, got 'shufled' (command "
                                        "line); did you mean shuffled?"),
    ("TRAIN:\n  HALVING_EVERY: soon\n", [], "TRAIN.HALVING_EVERY expects a number, got 'soon' ({cfg}:3)"),
])
def test_a_bad_value_is_one_line_exit_2(tmp_path, yaml_text, args, words):
    config = plugin(tmp_path, yaml_text)
    r = run_tool("train.py", ["--cfg", str(config), *RUN, *args, "OUTPUT_DIR", str(tmp_path / "run")], timeout=60)
    assert_user_error(r, words.format(cfg=config))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_components_train_and_a_resume_refuses_a_knob_that_is_not_resume_safe(tmp_path):
    config = plugin(tmp_path, "DATA:\n  CUT_FRACTION: 0.5\n")
    out = tmp_path / "run"
    argv = ["--cfg", str(config), *RUN, "OUTPUT_DIR", str(out)]
    r = run_tool("train.py", argv)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert [row["step"] for row in read_jsonl(out / "metrics.jsonl") if "train/loss" in row] == [1]
    assert "cut_digits: fraction 0.5, order kept, note ''" in (out / "log.txt").read_text()
    assert "  HALVING_EVERY: 1.0\n" in (out / "config.yaml").read_text()
    r = run_tool("train.py", [*argv, "TRAIN.HALVING_EVERY", "3"])
    assert_user_error(r, "keys that change the run", "TRAIN.HALVING_EVERY: 1.0 -> 3.0")
    r = run_tool("train.py", [*argv, "DATA.CUT_NOTE", "second look"])  # resume-safe: the finished run is done
    assert r.returncode == 0 and "done" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr


def test_a_key_declared_twice_is_one_line(tmp_path):
    """A knob named like a key of defaults.py or of another component: its module's import fails in one line."""
    module = tmp_path / "clash.py"
    module.write_text("from runner.keys import Key, declare\n"
                      "declare([Key('DATA.SHARD_WINDOW', 10, 'mine')], owner='source mine')\n")
    assert_user_error(run_tool("train.py", ["IMPORTS", f"[{module}]", "--print-config"], timeout=60),
                      f"IMPORTS: importing {module} failed (command line)",
                      "config key DATA.SHARD_WINDOW is declared by source shards already")
    module.write_text("from runner.keys import Key, declare\ndeclare([Key('TRAIN.LR', 1.0, 'mine')], owner='mine')\n")
    assert_user_error(run_tool("train.py", ["IMPORTS", f"[{module}]", "--print-config"], timeout=60),
                      "config key TRAIN.LR is in runner/config/defaults.py already")


def test_a_key_placed_after_a_key_nobody_declares_is_one_line(tmp_path):
    """after= naming a key that no module declares: refused once the IMPORTS are in, not left out of the defaults."""
    module = tmp_path / "misplaced.py"
    module.write_text("from runner.keys import Key, declare\n"
                      "declare([Key('DATA.MY_KNOB', 1, 'mine')], owner='source mine', after='DATA.NO_SUCH_KEY')\n")
    assert_user_error(run_tool("train.py", ["IMPORTS", f"[{module}]", "--print-config"], timeout=60),
                      "config key DATA.MY_KNOB (source mine) is declared after=DATA.NO_SUCH_KEY, a key that neither "
                      "defaults.py nor any imported module declares")
    # after= naming a key the same module declares later still waits for it and is placed there
    module.write_text("from runner.keys import Key, declare\n"
                      "declare([Key('DATA.MY_KNOB', 1, 'mine')], owner='source mine', after='DATA.MY_FIRST')\n"
                      "declare([Key('DATA.MY_FIRST', 0, 'first')], owner='source mine')\n")
    r = run_tool("train.py", ["IMPORTS", f"[{module}]", "--print-config"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "  MY_FIRST: 0\n  MY_KNOB: 1\n" in r.stdout
