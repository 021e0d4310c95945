"""runner/config/loader.py: layering, user mistakes with file:line, --print-config, --explain, the real CLI."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from runner.config import (
    ConfigInfo,
    build_parser,
    default_output_dir,
    diff_configs,
    get_default_config,
    handle_info_flags,
)
from runner.errors import UserError, cli
from runner.preflight import load_config  # the config with its data source's rules

REPO = Path(__file__).resolve().parents[2]
CHAIN = REPO / "configs" / "test" / "chain"
TRAIN_PY = REPO / "tools" / "train.py"


def write(folder: Path, name: str, text: str) -> str:
    """Write a YAML file under `folder` and return its path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def user_error_line(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run load_config the way tools do (under `cli`); assert exit 2 and one stderr line; return it."""

    @cli
    def main() -> int:
        cfg, info = load_config(argv)
        return 0 if handle_info_flags(cfg, info) else 0

    with pytest.raises(SystemExit) as exit_info:
        main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    return err.strip()


# ---------------------------------------------------------------------------------------------------------
# Layering
# ---------------------------------------------------------------------------------------------------------
def test_three_level_base_chain_with_lists_at_two_levels():
    cfg, info = load_config(["--cfg", str(CHAIN / "top.yaml")])
    assert cfg.MODEL.NAME == "resnet10t"  # only r1 (level 3, via mid/a.yaml)
    assert cfg.TRAIN.WEIGHT_DECAY == 1e-4  # r2, read from "1e-4" (text in YAML 1.1)
    assert cfg.TRAIN.EPOCHS == 3  # mid/a.yaml's own key beats its bases
    assert cfg.DATA.IMG_SIZE == 24  # r3 (through b.yaml, the later base) beats r1
    assert cfg.DATA.BATCH_SIZE == 16 and cfg.TRAIN.OPTIMIZER == "adamw"
    assert cfg.TRAIN.LR == 0.05  # top's own key beats r1 and r2
    assert cfg.AMP.DTYPE == "float16"
    assert info.provenance["TRAIN.LR"].endswith("top.yaml:6")
    assert info.provenance["DATA.IMG_SIZE"].endswith("r3.yaml:4")
    assert [v for v, _ in info.history["TRAIN.LR"]] == [0.5, 0.2, 0.05]


def test_repeated_cfg_later_file_wins_and_overrides_win_over_files(tmp_path):
    a = write(tmp_path, "a.yaml", "TRAIN:\n  LR: 0.3\n  EPOCHS: 4\n")
    b = write(tmp_path, "b.yaml", "TRAIN:\n  LR: 0.2\n")
    cfg, info = load_config(["--cfg", a, "--cfg", b, "TRAIN.EPOCHS", "5"])
    assert (cfg.TRAIN.LR, cfg.TRAIN.EPOCHS) == (0.2, 5)
    assert info.files == [a, b] and info.overrides == [("TRAIN.EPOCHS", 5)]
    assert info.provenance["TRAIN.EPOCHS"] == "command line"


def test_base_relative_to_naming_file_absolute_and_diamond(tmp_path):
    root = write(tmp_path, "root.yaml", "SEED: 7\n")
    write(tmp_path, "x/left.yaml", "_BASE_: ../root.yaml\nMODEL: {NAME: left}\n")
    write(tmp_path, "x/right.yaml", f"_BASE_: {root}\nDATA: {{IMG_SIZE: 20}}\n")
    top = write(tmp_path, "x/y/top.yaml", "_BASE_: [../left.yaml, ../right.yaml]\n")
    cfg, _ = load_config(["--cfg", top])
    assert (cfg.SEED, cfg.MODEL.NAME, cfg.DATA.IMG_SIZE) == (7, "left", 20)


def test_empty_file_empty_section_and_yaml_anchors_are_fine(tmp_path):
    empty = write(tmp_path, "empty.yaml", "# nothing yet\n")
    cfg, _ = load_config(["--cfg", empty])
    assert diff_configs(cfg, get_default_config()) == [("OUTPUT_DIR", default_output_dir([empty], []), "")]
    anchors = write(tmp_path, "anch.yaml", "TRAIN:\n  LR: &lr 0.3\n  MIN_LR: *lr\nAMP:\n")
    cfg, _ = load_config(["--cfg", anchors])
    assert cfg.TRAIN.MIN_LR == 0.3 and cfg.AMP.ENABLED is False


def test_dotted_keys_and_yaml_merge_keys_in_files(tmp_path):
    text = "TRAIN.LR: 0.3\nAMP:\n  <<: {ENABLED: true, DTYPE: float16}\n  DTYPE: bfloat16\n"
    f = write(tmp_path, "f.yaml", text)
    cfg, info = load_config(["--cfg", f])
    assert (cfg.TRAIN.LR, cfg.AMP.ENABLED, cfg.AMP.DTYPE) == (0.3, True, "bfloat16")
    assert info.provenance["AMP.DTYPE"] == f"{f}:4"


def test_result_is_frozen():
    cfg, _ = load_config(["TRAIN.LR", "0.2"])
    with pytest.raises(AttributeError):
        cfg.TRAIN.LR = 0.3


def test_caller_parser_extra_arguments_reach_info_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--count", type=int, default=0)
    cfg, info = load_config(["--dry-run", "TRAIN.LR", "0.3"], parser)
    assert info.args.dry_run and info.args.cfg == [] and cfg.TRAIN.LR == 0.3
    parser2 = build_parser(description="x")
    parser2.add_argument("--extra", type=int, default=1)
    _, info2 = load_config(["--extra", "3"], parser2)
    assert info2.args.extra == 3
    with pytest.raises(UserError, match=r"did you mean --extra\? \(options: .*--extra"):
        load_config(["--extar", "3"], parser2)
    with pytest.raises(UserError, match=r"argument --count: invalid int value"):
        load_config(["--count", "x"], parser)  # a caller's plain parser also fails in one line


def test_yaml_file_values_get_the_same_friendly_coercion(tmp_path):
    f = write(tmp_path, "f.yaml", "MODEL:\n  NAME: 18\nTRAIN:\n  LR: 1\n  WEIGHT_DECAY: 1e-4\n  EMA: True\n"
                                  "AUG:\n  AUTO_AUGMENT: 1.0e-3\n  SCALE: [1, 1]\nDATA:\n  MEAN: [0, 0, 1]\n")
    cfg, _ = load_config(["--cfg", f])
    assert cfg.MODEL.NAME == "18" and cfg.AUG.AUTO_AUGMENT == "1.0e-3"  # the text as written
    assert cfg.TRAIN.LR == 1.0 and isinstance(cfg.TRAIN.LR, float) and cfg.TRAIN.WEIGHT_DECAY == 1e-4
    assert cfg.TRAIN.EMA is True
    assert cfg.AUG.SCALE == (1.0, 1.0) and cfg.DATA.MEAN == (0.0, 0.0, 1.0)
    assert all(isinstance(x, float) for x in cfg.DATA.MEAN)


# ---------------------------------------------------------------------------------------------------------
# User mistakes: exit code 2, one line, no traceback
# ---------------------------------------------------------------------------------------------------------
FILES = {
    "dup.yaml": "TRAIN:\n  LR: 0.1\n  EPOCHS: 2\n  LR: 0.2\n",
    "dup_top.yaml": "TRAIN:\n  LR: 0.1\nTRAIN:\n  EPOCHS: 2\n",
    "unknown.yaml": "TRAIN:\n  LRR: 0.1\n",
    "via.yaml": "_BASE_: [empty.yaml, unknown.yaml]\n",
    "empty.yaml": "",
    "cycle1.yaml": "_BASE_: sub/cycle2.yaml\n",
    "sub/cycle2.yaml": "_BASE_: ../cycle1.yaml\n",
    "self.yaml": "_BASE_: self.yaml\n",
    "pytag.yaml": "TRAIN:\n  LR: !!python/object/apply:os.system ['echo hacked']\n",
    "pyname.yaml": "MODEL: !!python/name:os.system\n",
    "syntax.yaml": "TRAIN:\n  LR: 0.1\n   EPOCHS: 2\n",
    "flow.yaml": "DATA:\n  MEAN: [0.5, 0.5\n",
    "list.yaml": "- TRAIN.LR\n- 0.1\n",
    "scalar.yaml": "just text\n",
    "missing_base.yaml": "_BASE_: nowhere.yaml\n",
    "deep_missing.yaml": "_BASE_: missing_base.yaml\n",
    "base_int.yaml": "_BASE_: 3\n",
    "bad_type.yaml": "DATA:\n  BATCH_SIZE: big\n",
    "section_value.yaml": "TRAIN: 0.1\n",
    "leaf_mapping.yaml": "TRAIN:\n  LR: {value: 0.1}\n",
    "int_key.yaml": "1: 2\n",
    "base_py.yaml": "_BASE_: evil.py\n",
    "custom_tag.yaml": "TRAIN:\n  LR: !mytag 0.1\n",
    "null_text.yaml": "DATA:\n  ROOT:\n",
    "flat_dup.yaml": "TRAIN.LR: 0.3\nTRAIN:\n  LR: 0.2\n",
}


@pytest.mark.parametrize("argv, expected", [
    (["--cfg", "{}/nope.yaml"], r"config file .*nope.yaml not found \(from --cfg\)"),
    (["--cfg", "{}/emtpy.yaml"], r"not found .*did you mean .*empty.yaml\?"),
    (["--cfg", "{}"], "is a directory"),
    (["--cfg", "{}/evil.py"], r"evil.py \(from --cfg\): Python config files are not supported"),
    (["--cfg", "{}/base_py.yaml"], "Python config files are not supported"),
    (["--cfg", "{}/dup.yaml"], r"dup.yaml:4: duplicate key TRAIN.LR \(first set at line 2\)"),
    (["--cfg", "{}/flat_dup.yaml"], r"flat_dup.yaml:3: duplicate key TRAIN.LR \(first set at .*dup.yaml:1\)"),
    (["--cfg", "{}/dup_top.yaml"], r"dup_top.yaml:3: duplicate key TRAIN \(first set at line 1\)"),
    (["--cfg", "{}/unknown.yaml"], r"key TRAIN.LRR \(.*unknown.yaml:2\); did you mean TRAIN.LR\?$"),
    (["--cfg", "{}/via.yaml"], r"TRAIN.LRR \(.*unknown.yaml:2; chain .*via.yaml -> .*unknown.yaml\)"),
    (["--cfg", "{}/cycle1.yaml"], r"_BASE_ cycle: .*cycle1.yaml -> .*cycle2.yaml -> .*cycle1.yaml$"),
    (["--cfg", "{}/self.yaml"], r"_BASE_ cycle: .*self.yaml -> .*self.yaml$"),
    (["--cfg", "{}/pytag.yaml"], r"pytag.yaml:2: Python-tagged YAML .* is refused"),
    (["--cfg", "{}/pyname.yaml"], r"pyname.yaml:1: Python-tagged YAML"),
    (["--cfg", "{}/custom_tag.yaml"], r"custom_tag.yaml:2: unsupported YAML tag !mytag"),
    (["--cfg", "{}/syntax.yaml"], r"syntax.yaml:3: YAML syntax error"),
    (["--cfg", "{}/flow.yaml"], r"flow.yaml:\d: YAML syntax error: while parsing a flow .* \(from line 2\)"),
    (["--cfg", "{}/list.yaml"], r"list.yaml:1: the top level of a config file must be a mapping .* list"),
    (["--cfg", "{}/scalar.yaml"], r"must be a mapping .* got a single value"),
    (["--cfg", "{}/missing_base.yaml"], r"nowhere.yaml not found \(from _BASE_ at .*missing_base.yaml:1\)"),
    (["--cfg", "{}/deep_missing.yaml"], r"not found .*; chain .*deep_missing.yaml -> .*missing_b"),
    (["--cfg", "{}/base_int.yaml"], r"_BASE_ must be a path or a list of paths, got 3"),
    (["--cfg", "{}/bad_type.yaml"], r"DATA.BATCH_SIZE expects an integer, got 'big' \(.*bad_type.yaml:2\)"),
    (["--cfg", "{}/section_value.yaml"], r"TRAIN is a section, not a value"),
    (["--cfg", "{}/leaf_mapping.yaml"], r"TRAIN.LR expects a number, got '\{value: 0.1\}'"),
    (["--cfg", "{}/int_key.yaml"], r"int_key.yaml:1: config keys are names, got 1"),
    (["--cfg", "{}/null_text.yaml"], r"DATA.ROOT cannot be null \(.*null_text.yaml:2\).*use '' for empty"),
    (["--cfg"], r"argument --cfg: expected one argument"),
    (["--cgf", "x.yaml"], r"unknown option --cgf"),
    (["TRAIN.LR", "0.1", "--lr", "0.1"], r"unknown option --lr"),
    (["-x"], r"unknown option -x"),
    (["--print-confg"], r"option --print-confg; did you mean --print-config\? \(options: .*--explain"),
    (["--TRAIN.LR", "0.1"], r"unknown option --TRAIN.LR: config keys take no dashes"),
    (["TRAIN.LR"], r"TRAIN.LR has no value"),
    (["TRAIN.LR", "AMP.ENABLED", "true"], r"TRAIN.LR has no value \(it is followed by the key AMP.ENABLED\)"),
    (["0.1"], r"value '0.1' has no key"),
    (["TRAIN.LR", "0.1", "resnet18"], r"value 'resnet18' has no key \(after TRAIN.LR 0.1\)"),
    (["TRAIN.LRR", "0.1"], r"unknown config key TRAIN.LRR on the command line; did you mean TRAIN.LR\?"),
    (["train.lr", "0.1"], r"did you mean TRAIN.LR\?"),
    (["BATCH_SIZE", "8"], r"did you mean DATA.BATCH_SIZE\?"),
    (["TRAIN", "0.1"], r"TRAIN is a section, not a key"),
    (["TRAIN.LR", "fast"], r"TRAIN.LR expects a number, got 'fast' \(command line\)"),
    (["TRAIN.LR", "true"], r"TRAIN.LR expects a number, got 'true'"),
    (["TRAIN.LR", "nan"], r"TRAIN.LR must be a finite number"),
    (["DATA.BATCH_SIZE", "2.5"], r"DATA.BATCH_SIZE expects an integer, got '2.5'"),
    (["DATA.BATCH_SIZE", "true"], r"DATA.BATCH_SIZE expects an integer"),
    (["AMP.ENABLED", "1"], r"AMP.ENABLED expects true or false, got '1'"),
    (["AMP.ENABLED", "maybe"], r"AMP.ENABLED expects true or false"),
    (["MODEL.NAME", "null"], r"MODEL.NAME cannot be null"),
    (["MODEL.NAME", "[a, b]"], r"MODEL.NAME expects text, got '\[a, b\]'"),
    (["DATA.MEAN", "0.5"], r"DATA.MEAN expects a list like \[0.485, 0.456, 0.406\], got '0.5'"),
    (["DATA.MEAN", "[a, 0.5, 0.5]"], r"DATA.MEAN\[0\] expects a number, got 'a'"),
    (["AMP.DTYPE", "fp16"], r"AMP.DTYPE must be one of bfloat16\|float16, got 'fp16' \(command line\)"),
    (["DEVICE", "gpu"], r"DEVICE must be one of auto\|cpu\|cuda"),
    (["DATA.NAME", "cifar"], r"DATA.NAME must be one of digits\|folder\|synthetic"),
    (["TRAIN.SCHEDULER", "cos"], r"cosine\|tanh\|poly\|step\|multistep\|plateau\|constant\|none, got 'cos' "
                                 r"\(command line\); did you mean cosine"),
    (["TRAIN.CLIP_MODE", "norms"], r"TRAIN.CLIP_MODE must be one of norm\|value\|agc"),
    (["DIST.BACKEND", "mpi"], r"DIST.BACKEND must be one of auto\|nccl\|gloo"),
    (["LOG.PROGRESS", "fancy"], r"LOG.PROGRESS must be one of auto\|bar\|plain"),
    (["TRAIN.OPTIMIZER", "adamx"], r"TRAIN.OPTIMIZER must be a timm optimizer name .*did you mean adamax\?"),
    (["DATA.BATCH_SIZE", "0"], r"DATA.BATCH_SIZE must be >= 1, got 0 \(command line\)"),
    (["DATA.IMG_SIZE", "-8"], r"DATA.IMG_SIZE must be in \[1, 8192\]"),
    (["TRAIN.EPOCHS", "0"], r"TRAIN.EPOCHS must be >= 1"),
    (["TRAIN.ACCUM_STEPS", "0"], r"TRAIN.ACCUM_STEPS must be >= 1"),
    (["LOG.PERIOD", "0"], r"LOG.PERIOD must be >= 1"),
    (["TRAIN.LR", "0"], r"TRAIN.LR must be > 0"),
    (["AMP.INIT_SCALE", "0.5"], r"AMP.INIT_SCALE must be in \[1, 2\*\*126\], got 0.5"),
    (["AUG.MIXUP", "-0.1"], r"AUG.MIXUP must be >= 0"),
    (["AUG.CUTMIX", "-1"], r"AUG.CUTMIX must be >= 0"),
    (["AUG.HFLIP", "1.5"], r"AUG.HFLIP must be in \[0, 1\]"),
    (["DATA.NUM_WORKERS", "-2"], r"DATA.NUM_WORKERS must be in \[0, 256\] \(or -1 for auto\)"),
    (["DATA.NAME", "folder"], r"DATA.NAME folder needs DATA.ROOT"),
    (["DATA.NAME", "folder", "DATA.ROOT", "/no/such/dir"], r"DATA.ROOT '/no/such/dir' is not a folder"),
    (["MODEL.IN_CHANS", "1", "DATA.MEAN", "[0.5, 0.5, 0.5]"],
     r"DATA.MEAN needs one value per input channel \(MODEL.IN_CHANS 1\)"),
    (["AUG.SCALE", "[0.9, 0.1]"], r"AUG.SCALE must be \[low, high\]"),
    (["TRAIN.MIN_LR", "1"], r"TRAIN.MIN_LR \(1.0\) must not exceed TRAIN.LR"),
    (["TRAIN.WARMUP_EPOCHS", "10"], r"TRAIN.WARMUP_EPOCHS \(10.0\) must be less than TRAIN.EPOCHS"),
    (["DIST.BACKEND", "nccl", "DEVICE", "cpu"], r"DIST.BACKEND nccl needs GPUs"),
    (["PROFILE.ONLY", "true"], r"PROFILE.ONLY needs PROFILE.ENABLED true"),
    (["CHECKPOINT.RESUME", "''"], r"CHECKPOINT.RESUME must be auto, none or a checkpoint path"),
    (["CHECKPOINT.RESUME", "/no/such.pth"], r"CHECKPOINT.RESUME '/no/such.pth' is not a file"),
    (["MODEL.CHECKPOINT", "/no/weights.pth"], r"MODEL.CHECKPOINT '/no/weights.pth' is not a file"),
])
def test_user_mistake_is_one_line_exit_2(tmp_path, capsys, argv, expected):
    for name, text in FILES.items():
        write(tmp_path, name, text)
    marker = tmp_path / "executed"
    write(tmp_path, "evil.py", f"open({str(marker)!r}, 'w').write('x')\n")
    line = user_error_line([a.format(tmp_path) for a in argv], capsys)
    assert re.search(expected, line), line
    assert not marker.exists()


def test_mistake_in_file_reports_where_it_was_set(tmp_path, capsys):
    f = write(tmp_path, "f.yaml", "# header\nAMP:\n  DTYPE: half\n")
    line = user_error_line(["--cfg", f], capsys)
    assert f"({f}:3)" in line and "AMP.DTYPE must be one of bfloat16|float16, got 'half'" in line


def test_cfg_without_argument_names_help(capsys):
    assert "(see --help)" in user_error_line(["--cfg"], capsys)


# ---------------------------------------------------------------------------------------------------------
# --print-config and --explain
# ---------------------------------------------------------------------------------------------------------
def test_print_config_shows_coerced_values_under_their_sections(capsys):
    cfg, info = load_config(["--cfg", str(CHAIN / "top.yaml"), "TRAIN.LR", "1", "AMP.ENABLED", "true",
                             "--print-config"])
    assert handle_info_flags(cfg, info) is True
    out = capsys.readouterr().out
    assert re.search(r"^TRAIN:\n(  .*\n)*?  LR: 1\.0$", out, re.M)
    assert re.search(r"^AMP:\n  ENABLED: true$", out, re.M)
    assert yaml.safe_load(out)["TRAIN"]["OPTIMIZER"] == "adamw"


def test_no_info_flags_means_carry_on(capsys):
    cfg, info = load_config([])
    assert handle_info_flags(cfg, info) is False and capsys.readouterr().out == ""


def test_explain_names_file_line_and_command_line(capsys):
    top = str(CHAIN / "top.yaml")
    cfg, info = load_config(["--cfg", top, "TRAIN.LR", "1", "--explain"])
    assert handle_info_flags(cfg, info)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if not line.startswith("#")}
    assert rows["TRAIN.LR"].split("<-")[1].strip().startswith("command line")
    assert "0.05 from " + top + ":6" in rows["TRAIN.LR"]  # the value it replaced, and where that was
    assert rows["MODEL.NAME"].rstrip().endswith(str(CHAIN / "mid" / ".." / "r1.yaml").replace("mid/../", "")
                                                + ":3")
    assert rows["TRAIN.EPOCHS"].split("<-")[1].split()[0] == str(CHAIN / "mid" / "a.yaml") + ":4"
    assert "OUTPUT_DIR" in rows and "SEED" not in rows  # only keys that differ from the defaults


def test_explain_with_defaults_only():
    cfg, info = load_config([])
    info.provenance.pop("OUTPUT_DIR")
    assert "OUTPUT_DIR" in info.explain_text(cfg)
    plain = get_default_config()
    plain.freeze()
    assert info.explain_text(plain) == "# every key has its default value\n"


def test_loader_fills_output_dir_from_overrides_but_keeps_an_explicit_one():
    cfg, info = load_config(["--cfg", str(CHAIN / "top.yaml"), "TRAIN.LR", "0.3", "TRAIN.EPOCHS", "9"])
    assert cfg.OUTPUT_DIR == "output/test/chain/top-epochs=9-lr=0.3" == default_output_dir(info.files, info.overrides)
    cfg, _ = load_config(["OUTPUT_DIR", "/tmp/mine", "TRAIN.LR", "0.3"])
    assert cfg.OUTPUT_DIR == "/tmp/mine"


def test_config_info_is_a_plain_record():
    info = ConfigInfo(args=argparse.Namespace(print_config=False), files=[], overrides=[])
    assert info.provenance == {} and info.history == {}


# ---------------------------------------------------------------------------------------------------------
# The real command line (subprocess): speed, no heavy imports, one-line errors
# ---------------------------------------------------------------------------------------------------------
_DRIVER = """
import runpy, sys, time
t = time.perf_counter()
sys.argv = ["tools/train.py"] + sys.argv[1:]
try:
    runpy.run_path({train!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "timm", "numpy") if m in sys.modules)
print("HEAVY", heavy, "CODE", code, file=sys.stderr)
"""


def run_train(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run tools/train.py (through a tiny wrapper that reports heavy imports) and time it."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _DRIVER.format(train=str(TRAIN_PY)), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    return proc, time.perf_counter() - t


def test_print_config_command_is_fast_and_light():
    proc, seconds = run_train("--cfg", "configs/test/chain/top.yaml", "TRAIN.LR", "1", "AMP.ENABLED", "true",
                              "--print-config")
    assert "HEAVY [] CODE 0" in proc.stderr, proc.stderr
    assert re.search(r"^TRAIN:\n(  .*\n)*?  LR: 1\.0$", proc.stdout, re.M)
    assert re.search(r"^AMP:\n  ENABLED: true$", proc.stdout, re.M)
    assert seconds < 3.0


def test_print_config_plain_process_exit_code_and_time():
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, str(TRAIN_PY), "--cfg", "configs/test/chain/top.yaml",
                           "--explain"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "" and time.perf_counter() - t < 3.0
    assert "configs/test/chain/top.yaml:8" in proc.stdout


@pytest.mark.parametrize("args, expected", [
    (["--cfg", "configs/test/chain/nope.yaml"], "not found"),
    (["--cfg", "configs/test/chain/top.yaml", "TRAIN.LRR", "1"], "did you mean TRAIN.LR?"),
    (["TRAIN.LR"], "TRAIN.LR has no value"),
    (["--print-confg"], "unknown option --print-confg"),
])
def test_cli_mistakes_exit_2_with_one_line(args, expected):
    proc = subprocess.run([sys.executable, str(TRAIN_PY), *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and expected in proc.stderr and "Traceback" not in proc.stderr


def test_absurd_num_workers_is_refused_before_anything_starts(tmp_path):
    from tests.utils import assert_user_error, run_tool

    out = tmp_path / "run"
    r = run_tool("train.py", ["--cfg", "configs/digits/test_resnet.yaml", "DATA.NUM_WORKERS", "1000",
                              "OUTPUT_DIR", str(out)], timeout=60)
    assert_user_error(r, "DATA.NUM_WORKERS must be in [0, 256]", "got 1000")
    assert not out.exists()
