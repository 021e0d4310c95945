"""The table of data sources (runner/data/sources.py): a new source is one module and one line, an unknown
DATA.NAME is one line naming the known ones, and importing the table imports no torch."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from runner import preflight
from runner.config import load_config
from runner.data import sources
from runner.errors import UserError
from tests.utils import ROOT, env

# The whole of a new source: build (torch inside it only), its own config check, its size known without loading
TOY_MODULE = '''
"""DATA.NAME toy: 16 seeded random images of 3 classes, in memory."""


def check(cfg, fail, check_files, world):
    if cfg.DATA.IMG_SIZE > 16:
        fail("DATA.IMG_SIZE", f"DATA.NAME toy makes images of at most 16 px, got DATA.IMG_SIZE {cfg.DATA.IMG_SIZE}")


def known_split(cfg):
    return 16, 3


def build(cfg, dist):
    import torch

    from runner.data.build import in_memory_bundle

    g = torch.Generator().manual_seed(cfg.SEED)
    x = torch.randn(24, cfg.MODEL.IN_CHANS, cfg.DATA.IMG_SIZE, cfg.DATA.IMG_SIZE, generator=g)
    y = torch.arange(24) % 3
    return in_memory_bundle(cfg, dist, (x[:16], y[:16], x[16:], y[16:]), ["a", "b", "c"])
'''

TOY_RUN = ["DEVICE", "cpu", "DATA.NAME", "toy", "MODEL.NAME", "resnet10t", "MODEL.NUM_CLASSES", "3",
           "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "4", "TRAIN.EPOCHS", "1", "TRAIN.MAX_STEPS", "1",
           "LOG.TENSORBOARD", "false"]


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy source's module written to an importable folder and registered with its one line."""
    (tmp_path / "toy_source.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sources, "SOURCES", dict(sources.SOURCES))  # the built-in table, untouched after the test
    return sources.register("toy", "toy_source", in_process=True)  # the one line


def test_a_new_source_is_one_module_and_one_line_and_trains(toy, tmp_path):
    from runner.engine import build_trainer

    out = tmp_path / "run"
    cfg, _ = preflight.load_config([*TOY_RUN, "OUTPUT_DIR", str(out)])
    preflight.check_before_claim(cfg, 1)
    trainer = build_trainer(cfg)
    try:
        results = trainer.train()
    finally:
        trainer.close()
    assert results["status"] == "done" and results["step"] == 1
    assert json.loads((out / "results.json").read_text())["step"] == 1
    assert "toy" in sources.names() and sources.source("toy") is toy


def test_a_new_sources_rules_are_said_before_the_claim(toy, tmp_path):
    with pytest.raises(UserError, match=r"^DATA.NAME toy makes images of at most 16 px, got DATA.IMG_SIZE 32 "
                                        r"\(command line\)$"):
        preflight.load_config([*TOY_RUN, "DATA.IMG_SIZE", "32", "OUTPUT_DIR", str(tmp_path / "run")])
    cfg, _ = load_config([*TOY_RUN, "MODEL.NUM_CLASSES", "2", "OUTPUT_DIR", str(tmp_path / "run")])
    with pytest.raises(UserError, match="DATA.NAME toy has 3 classes but MODEL.NUM_CLASSES is 2"):
        preflight.check_before_claim(cfg, 1)  # known_split: the classes checked before any data is made
    assert not (tmp_path / "run").exists()


def test_an_unknown_name_is_one_line_naming_the_known_ones():
    with pytest.raises(UserError) as e:
        sources.source("cifar")
    assert str(e.value) == "DATA.NAME must be one of digits|folder|synthetic|shards|hf|torchvision, got 'cifar'"
    with pytest.raises(UserError, match=r"got 'digit' \(command line\); did you mean digits\?$"):
        preflight.load_config(["DATA.NAME", "digit"])


def test_the_table_says_what_the_runner_asks():
    assert sources.names() == ["digits", "folder", "synthetic", "shards", "hf", "torchvision"]
    assert [n for n in sources.names() if sources.source(n).run_class_map] == ["folder", "hf", "torchvision"]
    assert [n for n in sources.names() if sources.source(n).in_process] == ["digits", "synthetic"]
    assert {n: sources.source(n).files for n in sources.names()} == {
        "digits": "", "folder": "folder", "synthetic": "", "shards": "shards", "hf": "hf",
        "torchvision": "torchvision"}


def test_the_table_and_the_checks_import_no_torch(tmp_path):
    """The table, each built-in source's module and its checks run before the claim, where torch is not loaded."""
    for split in ("train", "val"):  # the folder's check before the claim lists the class folders
        (tmp_path / split / "a").mkdir(parents=True)
        (tmp_path / split / "a" / "x.jpg").write_bytes(b"")
    code = textwrap.dedent(f"""
        import sys
        from runner import preflight
        from runner.data import sources
        for name in sources.names():
            sources.source(name)._load()
        argv = ["DATA.NAME", "folder", "DATA.ROOT", {str(tmp_path)!r}, "OUTPUT_DIR", {str(tmp_path / "out")!r}]
        cfg, _ = preflight.load_config(argv)
        preflight.check_before_claim(cfg, 1)
        heavy = sorted(m for m in ("torch", "torchvision", "timm", "webdataset") if m in sys.modules)
        print("HEAVY", heavy)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env(),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout, proc.stdout
