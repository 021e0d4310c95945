"""runner/config/ keeps a user's paths and folders apart, ends every bad input in one line (through
tools/train.py's main, in this process) and takes every accepted value of DEVICE, DIST.BACKEND and LOG.PROGRESS."""
from __future__ import annotations

import os
import re
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from runner import distributed
from runner.config import ENUMS, default_output_dir, dump_config
from runner.errors import UserError
from runner.preflight import load_config  # the config with its data source's rules
from tests.utils import TINY, assert_user_error, env, run_tool

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> str:
    """Write `text` to `path` (making its folder) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------------------------------------------------
# "~" and relative paths: expanded once, seen the same by validation, config.yaml and every later use
# ---------------------------------------------------------------------------------------------------------
def test_tilde_is_expanded_in_every_path_key_before_validation(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    write(home / "w.pth", "x")
    write(home / "c.pth", "x")
    monkeypatch.setenv("HOME", str(home))
    cfg, _ = load_config(["DATA.NAME", "folder", "DATA.ROOT", "~/data", "OUTPUT_DIR", "~/out",
                          "MODEL.CHECKPOINT", "~/w.pth", "CHECKPOINT.RESUME", "~/c.pth"])
    assert (cfg.DATA.ROOT, cfg.OUTPUT_DIR) == (str(home / "data"), str(home / "out"))
    assert (cfg.MODEL.CHECKPOINT, cfg.CHECKPOINT.RESUME) == (str(home / "w.pth"), str(home / "c.pth"))
    dumped = yaml.safe_load(dump_config(cfg))
    assert dumped["DATA"]["ROOT"] == str(home / "data") and "~" not in dump_config(cfg)
    for word in ("auto", "none"):
        assert load_config(["CHECKPOINT.RESUME", word])[0].CHECKPOINT.RESUME == word
    # relative paths stay relative to the current folder
    (tmp_path / "rel" / "data").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    cfg, _ = load_config(["DATA.NAME", "folder", "DATA.ROOT", "rel/data", "OUTPUT_DIR", "runs/x"])
    assert (cfg.DATA.ROOT, cfg.OUTPUT_DIR) == ("rel/data", "runs/x")


def test_tilde_in_cfg_and_base_paths(tmp_path, monkeypatch):
    home = tmp_path / "home"
    write(home / "shared" / "base.yaml", "TRAIN:\n  LR: 0.025\n")
    write(home / "exp" / "r.yaml", "_BASE_: ~/shared/base.yaml\nTRAIN:\n  EPOCHS: 3\n")
    monkeypatch.setenv("HOME", str(home))
    cfg, _ = load_config(["--cfg=~/exp/r.yaml"])  # the shell leaves "~" after "=" alone
    assert (cfg.TRAIN.LR, cfg.TRAIN.EPOCHS) == (0.025, 3)


def test_tilde_data_root_in_a_real_process(tmp_path):
    home = tmp_path / "home"
    (home / "imgs").mkdir(parents=True)
    proc = run_tool("train.py", ["DATA.NAME", "folder", "DATA.ROOT", "~/imgs", "--print-config"],
                    env=env(HOME=str(home)), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["DATA"]["ROOT"] == str(home / "imgs")


# ---------------------------------------------------------------------------------------------------------
# Default output folders
# ---------------------------------------------------------------------------------------------------------
def test_default_output_dirs_of_same_named_configs_never_collide(tmp_path, monkeypatch):
    work = tmp_path / "work"
    a = write(work / "configs" / "a" / "r.yaml", "TRAIN:\n  LR: 0.05\n")
    b = write(work / "configs" / "b" / "r.yaml", "TRAIN:\n  LR: 0.05\n")
    outside = write(tmp_path / "elsewhere" / "r.yaml", "TRAIN:\n  LR: 0.05\n")
    loose = write(work / "a" / "r.yaml", "TRAIN:\n  LR: 0.05\n")  # not under configs/
    monkeypatch.chdir(work)
    dirs = [load_config(["--cfg", f])[0].OUTPUT_DIR for f in ("configs/a/r.yaml", "configs/b/r.yaml", outside,
                                                             "a/r.yaml")]
    assert dirs[:2] == ["output/a/r", "output/b/r"]
    assert re.fullmatch(r"output/r-[0-9a-f]{8}", dirs[2]) and re.fullmatch(r"output/r-[0-9a-f]{8}", dirs[3])
    assert len(set(dirs)) == 4
    # the same command in the same folder: the same folder, however the path is spelled
    assert load_config(["--cfg", a])[0].OUTPUT_DIR == "output/a/r"
    assert load_config(["--cfg", "./configs/b/../b/r.yaml"])[0].OUTPUT_DIR == "output/b/r"
    assert load_config(["--cfg", outside])[0].OUTPUT_DIR == dirs[2]
    assert load_config(["--cfg", loose, "TRAIN.LR", "0.3"])[0].OUTPUT_DIR == dirs[3] + "-lr=0.3"
    # layered files: every path counts, in order
    ab, ba = (load_config(["--cfg", x, "--cfg", y])[0].OUTPUT_DIR for x, y in ((a, b), (b, a)))
    ab2 = load_config(["--cfg", a, "--cfg", outside])[0].OUTPUT_DIR
    assert re.fullmatch(r"output/a/r__r-[0-9a-f]{8}", ab) and len({ab, ba, ab2}) == 3


def test_example_config_folder_is_readable():
    assert default_output_dir(["configs/digits/resnet18.yaml"], [], cwd=str(REPO)) == "output/digits/resnet18"
    assert default_output_dir([str(REPO / "configs/imagenet/resnet50.yaml")], [("TRAIN.LR", 0.2)],
                              cwd=str(REPO)) == "output/imagenet/resnet50-lr=0.2"


# ---------------------------------------------------------------------------------------------------------
# Bad inputs: exit 2, one line, no traceback, quickly (through tools/train.py)
# ---------------------------------------------------------------------------------------------------------
def _laughs_list() -> str:
    """Nine nested anchors, each a list of nine aliases of the one before: 9**10 values once expanded."""
    node = "&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"
    for i in range(1, 10):
        node = f"&a{i} [{node}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    return f"DATA:\n  MEAN: {node}\n"


def _laughs_merge(section: str = "") -> str:
    """The same with YAML merge keys (<<:), which PyYAML flattens by copying every pair."""
    node = "&m0 {" + ", ".join(f"K{c}: 1" for c in "ABCDEFGHI") + "}"
    for i in range(1, 10):
        node = f"&m{i} {{<<: [{node}, " + ", ".join([f"*m{i - 1}"] * 8) + "]}"
    return f"{section}:\n  <<: {node}\n" if section else f"<<: {node}\n"


FILES = {
    "deep_map.yaml": "MODEL: " + "{a: " * 10_000 + "1" + "}" * 10_000 + "\n",
    "deep_list.yaml": "DATA:\n  MEAN: " + "[" * 10_000 + "]" * 10_000 + "\n",
    "deep_block.yaml": "".join("  " * i + "a:\n" for i in range(3000)),
    "laughs_list.yaml": _laughs_list(),
    "laughs_merge.yaml": _laughs_merge(),
    "laughs_merge_section.yaml": _laughs_merge("TRAIN"),
    "merge_loop.yaml": "TRAIN: &m {<<: *m}\n",
    "nul_name.yaml": 'MODEL:\n  NAME: "resnet\\0"\n',
    "nul_output.yaml": 'OUTPUT_DIR: "out\\0put"\n',
    "base_dir.yaml": "_BASE_: basedir\n",
    "basedir/inside.yaml": "TRAIN:\n  LR: 0.1\n",
}

BAD = [
    (["--cfg", "{d}/deep_map.yaml"], "deep_map.yaml:1: YAML nested deeper than 32 levels"),
    (["--cfg", "{d}/deep_list.yaml"], "deep_list.yaml:2: YAML nested deeper than 32 levels"),
    (["--cfg", "{d}/deep_block.yaml"], "YAML nested deeper than 32 levels"),
    (["--cfg", "{d}/laughs_list.yaml"], "laughs_list.yaml:2: YAML anchors and aliases (or merge keys <<:) expand"),
    (["--cfg", "{d}/laughs_merge.yaml"], "laughs_merge.yaml:1: YAML anchors and aliases (or merge keys"),
    (["--cfg", "{d}/laughs_merge_section.yaml"], "expand to more than 100000 values"),
    (["--cfg", "{d}/merge_loop.yaml"], "merge_loop.yaml:1: alias *m points into the node that holds it"),
    (["--cfg", "{d}/binary.yaml"], "binary.yaml: not a YAML text file (character #x0000 at offset 2"),
    (["--cfg", "{d}/nul_name.yaml"], "MODEL.NAME contains a NUL character (/"),
    (["--cfg", "{d}/nul_output.yaml"], "OUTPUT_DIR contains a NUL character"),
    (["--cfg", "{d}/base_dir.yaml"], "basedir is a directory, not a config file (from _BASE_ at"),
    (["--cfg="], "empty config file path (from --cfg)"),
    (["--cfg", "/dev/null"], "config file /dev/null is not a regular file"),
    (["DIST.TIMEOUT_S", "1e300"], "DIST.TIMEOUT_S must be in [1, 604800] (at most 7 days), got 1e300"),
    (["DIST.TIMEOUT_S", str(10**9)], "DIST.TIMEOUT_S must be in [1, 604800] (at most 7 days), got 1000000000"),
    (["OUTPUT_DIR", "{d}/afile"], "afile is a file, not a folder; choose another OUTPUT_DIR"),
    (["DATA.NAME", "synthetic", "DATA.SYNTHETIC_SIZE", str(10**30)], "DATA.SYNTHETIC_SIZE must be an integer in"),
    (["TRAIN.LR", str(10**400)], "TRAIN.LR must be a finite number, got '1000000000"),
    (["TRAIN.OPTIMIZER", "adahessian"], "TRAIN.OPTIMIZER adahessian is not supported: it needs second-order"),
]


@pytest.mark.parametrize("args, fragment", BAD, ids=[f"{i}-{a[-1][-24:]}" for i, (a, _) in enumerate(BAD)])
def test_bad_input_is_one_line_and_quick(tmp_path, in_process, args, fragment):
    for name, text in FILES.items():
        write(tmp_path / name, text)
    (tmp_path / "binary.yaml").write_bytes(b"a:\x00\x01\x02" + bytes(range(3, 128)) * 8)
    write(tmp_path / "afile", "mine")
    t = time.perf_counter()
    proc = in_process("train.py", [a.format(d=tmp_path) for a in args])
    line = assert_user_error(proc, fragment.format(d=tmp_path))
    assert time.perf_counter() - t < 5, "refused, but not quickly"
    assert len(line) < 400, line
    if "_BASE_" in line:  # names a file in the folder, not the file that named the folder
        assert line.endswith(f"; did you mean {tmp_path}/basedir/inside.yaml?"), line
    assert (tmp_path / "afile").read_text() == "mine"


# ---------------------------------------------------------------------------------------------------------
# Tools that read no data do not ask for it
# ---------------------------------------------------------------------------------------------------------
def test_flops_and_info_flags_skip_the_data_path_checks(in_process):
    assert not os.path.isdir("/data/imagenet")
    small = ["--cfg", "configs/imagenet/resnet50.yaml", "MODEL.NAME", "resnet10t", "DATA.IMG_SIZE", "32"]
    proc = in_process("flops.py", small)
    assert proc.returncode == 0, proc.stderr
    assert '"model": "resnet10t"' in proc.stdout.splitlines()[-1]
    for flag in ("--print-config", "--explain"):
        proc = in_process("train.py", ["--cfg", "configs/imagenet/resnet50.yaml", flag])
        assert proc.returncode == 0 and "/data/imagenet" in proc.stdout, proc.stderr
    with pytest.raises(UserError, match="DATA.ROOT '/data/imagenet' is not a folder"):
        load_config(["--cfg", str(REPO / "configs/imagenet/resnet50.yaml")])  # training still checks


# ---------------------------------------------------------------------------------------------------------
# Every accepted value of DEVICE, DIST.BACKEND, MODEL.COMPILE_MODE, LOG.PROGRESS works
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_one_line(tmp_path, in_process):
    proc = in_process("train.py", [*TINY, "DEVICE", "cuda", "OUTPUT_DIR", str(tmp_path / "o")])
    assert_user_error(proc, "DEVICE is 'cuda' but no CUDA device is visible; use DEVICE cpu or DEVICE auto")


def test_compile_modes_are_torchs_own():
    import torch._inductor

    assert set(ENUMS["MODEL.COMPILE_MODE"]) <= set(torch._inductor.list_mode_options())  # no compiling


@pytest.mark.parametrize("mode", ENUMS["LOG.PROGRESS"])
def test_every_progress_mode(tmp_path, mode):
    from runner.sinks import MetricWriter

    cfg, _ = load_config(["LOG.PROGRESS", mode, "LOG.TENSORBOARD", "false"])
    writer = MetricWriter(str(tmp_path), cfg, 0, True, 4)
    try:
        writer.write(1, 0, {"train/loss": 1.0})
        assert (writer.bar is not None) == (mode == "bar")  # pytest's stdout is no terminal: auto is plain
    finally:
        writer.close()
    assert '"train/loss": 1.0' in (tmp_path / "metrics.jsonl").read_text()


def _fake_torchrun(monkeypatch) -> None:
    """The environment torchrun gives a single worker, on a free local port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)


def _timeout(group) -> timedelta:
    """The timeout a gloo process group was created with."""
    import torch

    return group._get_backend(torch.device("cpu")).options._timeout


@pytest.mark.parametrize("backend", ENUMS["DIST.BACKEND"])
def test_every_backend_under_torchrun_and_the_control_group_timeout(monkeypatch, backend):
    _fake_torchrun(monkeypatch)
    cfg, _ = load_config(["DIST.BACKEND", backend, "DIST.TIMEOUT_S", "77"])
    if backend == "nccl":  # this machine has no GPU: one clear line instead of NCCL's own failure
        with pytest.raises(UserError, match="DIST.BACKEND nccl needs CUDA devices"):
            distributed.setup(cfg)
        return
    dist = distributed.setup(cfg)
    try:
        assert dist.distributed and dist.world_size == 1
        assert _timeout(distributed.control_group()) == timedelta(seconds=77)
    finally:
        distributed.teardown()


def test_control_group_beside_a_non_gloo_world_honours_the_timeout(monkeypatch):
    import torch.distributed as tdist

    _fake_torchrun(monkeypatch)
    distributed.setup(load_config(["DIST.BACKEND", "gloo", "DIST.TIMEOUT_S", "55"])[0])
    distributed.teardown()
    # a world whose backend is not plain "gloo" (as nccl's is) gets a separate gloo group for stop flags
    tdist.init_process_group("cpu:gloo", timeout=timedelta(seconds=300))
    try:
        assert _timeout(distributed.control_group()) == timedelta(seconds=55)  # DIST.TIMEOUT_S, not 30 min
        assert _timeout(distributed.control_group(timedelta(seconds=9))) == timedelta(seconds=9)
    finally:
        tdist.destroy_process_group()
