"""`--help-keys [PREFIX]`: the config keys with their defaults and the comments of defaults.py."""
from __future__ import annotations

from runner.config.compare import flatten
from runner.config.defaults import _C
from runner.config.key_help import key_comments
from tests.utils import assert_user_error, run_tool


def test_every_key_has_its_comment():
    comments = key_comments()
    assert set(comments) == set(flatten(_C))
    assert [k for k, text in comments.items() if not text.strip()] == []
    assert comments["TRAIN.EPOCHS"] == "Number of epochs"  # no section banner or title in a key's text


def test_help_keys_lists_a_prefix_with_defaults_and_comments():
    r = run_tool("train.py", ["--help-keys", "train.ex"], timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "TRAIN.EXTEND = false" and lines[1].startswith("    Train a FINISHED run")
    assert all(line.startswith("    ") for line in lines[1:])  # one key only
    everything = run_tool("train.py", ["--help-keys"], timeout=60).stdout
    assert sum(not line.startswith(" ") for line in everything.splitlines()) == len(flatten(_C))
    assert_user_error(run_tool("train.py", ["--help-keys", "TRIAN"], timeout=60), "no config key starts with TRIAN",
                      "sections: MODEL, DATA")


def test_pretrained_help_says_what_is_true_for_a_user():
    """It spoke of the developers' machine ('this machine has no internet'); it says what the runner does."""
    text = key_comments()["MODEL.PRETRAINED"]
    assert "this machine" not in text and "internet" not in text
    assert "local Hugging Face cache only" in text and "never downloads" in text and "MODEL.CHECKPOINT" in text
