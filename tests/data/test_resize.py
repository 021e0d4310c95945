"""Progressive resizing (DATA.IMG_SIZE_SCHEDULE): the size of each epoch is the schedule's, a pure function of the
config and the epoch; each training batch is resized on the device; mistakes in one line; a run killed at a size
change and resumed ends bit-identical to the run left alone."""
from __future__ import annotations

import signal
import sys

import pytest
import torch

from runner import preflight
from runner.config import get_default_config, load_config
from runner.config.derived import train_img_size
from runner.data import sources
from runner.data.resize import ResizedLoader, resize_batch
from runner.errors import UserError
from tests.utils import TRAIN, read_jsonl


def sizes(schedule, epochs: int, img_size: int = 192) -> list[int]:
    """The training size of each epoch of a run of `epochs` epochs."""
    cfg = get_default_config()
    cfg.DATA.IMG_SIZE, cfg.TRAIN.EPOCHS, cfg.DATA.IMG_SIZE_SCHEDULE = img_size, epochs, tuple(schedule)
    return [train_img_size(cfg, e) for e in range(epochs)]


def test_fractions_of_the_run_and_whole_epochs():
    assert sizes([[0, 128], [0.5, 160], [0.9, 192]], 10) == [128] * 5 + [160] * 4 + [192]
    assert sizes([[0, 128], [2, 160]], 4) == [128, 128, 160, 160]  # whole starts: after 2 epochs
    assert sizes([], 3, img_size=32) == [32, 32, 32]  # no schedule: DATA.IMG_SIZE
    assert sizes([[0, 64]], 2) == [64, 64]
    # a longer run: epochs stay where they were, fractions follow TRAIN.EPOCHS (as a length-shaped LR schedule)
    assert sizes([[0, 128], [2, 160]], 8)[:4] == sizes([[0, 128], [2, 160]], 4)
    assert sizes([[0, 128], [0.5, 160]], 8) == [128] * 4 + [160] * 4


@pytest.mark.parametrize("value, words", [
    ("[[0.5, 160], [0, 128]]", "starts must increase from 0"),
    ("[[0, 128], [0.5, 128], [0.5, 160]]", "starts must increase from 0"),
    ("[[0.2, 128]]", "starts must increase from 0"),
    ("[[0, 0]]", "sizes must be whole numbers of pixels above 0"),
    ("[[0, -16]]", "sizes must be whole numbers of pixels above 0"),
    ("[[0, 12.5]]", "sizes must be whole numbers of pixels above 0"),
    ("[[0, 128], [0.5, 160], [3, 192]]", "a mix is ambiguous"),
    ("[[0, 128], [1.5, 160]]", "a mix is ambiguous"),
    ("[128, 160]", "must be a list of [start, size] pairs"),
    ("[[0, 128, 1]]", "must be a list of [start, size] pairs"),
])
def test_mistakes_are_one_line(value, words):
    with pytest.raises(UserError) as e:
        load_config(["DATA.IMG_SIZE_SCHEDULE", value])
    line = str(e.value)
    assert line.startswith("DATA.IMG_SIZE_SCHEDULE ") and words in line and "(command line)" in line
    assert "\n" not in line


def test_a_source_that_cannot_resize_refuses_the_key(monkeypatch):
    monkeypatch.setattr(sources, "SOURCES", dict(sources.SOURCES))
    sources.register("vectors", "runner.data.synthetic", in_process=True, resizes=False)
    with pytest.raises(UserError, match=r"^DATA.NAME vectors cannot resize its training batches, so it takes no "
                                        r"DATA.IMG_SIZE_SCHEDULE .*; remove the key \(command line\)$"):
        preflight.load_config(["DATA.NAME", "vectors", "DATA.IMG_SIZE_SCHEDULE", "[[0, 16]]"])
    preflight.load_config(["DATA.NAME", "vectors"])  # without the key it is fine
    for name in ("digits", "synthetic", "folder", "shards"):  # every built-in source resizes
        assert sources.SOURCES[name].resizes


class FakeLoader:
    """Batches of 2 images at 16 px; remembers the epoch it was set to."""

    def __init__(self, channels_last: bool = False):
        self.epoch, self.sampler = None, "the sampler"
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def set_epoch(self, epoch, start_batch=0):
        self.epoch = (epoch, start_batch)

    def __len__(self):
        return 3

    def __iter__(self):
        for i in range(3):
            x = torch.full((2, 3, 16, 16), float(i)).contiguous(memory_format=self.memory_format)
            yield x, torch.tensor([i, i])


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_loader_resizes_each_batch_to_its_epochs_size(channels_last):
    cfg = get_default_config()
    cfg.DATA.IMG_SIZE, cfg.TRAIN.EPOCHS, cfg.DATA.IMG_SIZE_SCHEDULE = 16, 3, ((0, 8), (1, 16), (2, 24))
    loader = ResizedLoader(FakeLoader(channels_last), cfg)
    assert len(loader) == 3 and loader.sampler == "the sampler"  # the rest is the inner loader's
    for epoch, side in enumerate((8, 16, 24)):
        loader.set_epoch(epoch, 1)
        assert loader.loader.epoch == (epoch, 1) and loader.img_size == side
        batches = list(loader)
        assert [tuple(x.shape) for x, _ in batches] == [(2, 3, side, side)] * 3
        assert all(x.is_contiguous(memory_format=loader.loader.memory_format) for x, _ in batches)
        assert torch.equal(batches[2][0], torch.full((2, 3, side, side), 2.0))  # a flat image stays flat
    same = torch.randn(2, 3, 16, 16)
    assert resize_batch(same, 16) is same  # nothing to do: the very tensor


# ---- slow: tools/train.py on the digits, killed at the size change ------------------------------------------
def resize_argv(out) -> list[str]:
    """The resume tests' digits run (DATA.IMG_SIZE 16) with 12 px in its first epoch and 14 px in its second: neither
    is DATA.IMG_SIZE, so a resume that fell back to it would show."""
    from tests.engine.test_resume import BASE

    return [sys.executable, TRAIN, *BASE, "DATA.IMG_SIZE_SCHEDULE", "[[0, 12], [0.5, 14]]", "OUTPUT_DIR", str(out)]


@pytest.mark.slow
def test_killed_at_the_size_change_resumes_bit_identical(tmp_path):
    from tests.engine.test_resume import STEPS_PER_EPOCH, Launch, assert_same_run

    ref, out, logs = tmp_path / "ref", tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    reference = Launch(resize_argv(ref), logs, "reference")
    # killed at the first step at 14 px (resumed from the epoch's end or just after), then mid-epoch 2
    for i, target in enumerate((STEPS_PER_EPOCH + 1, STEPS_PER_EPOCH + 5)):
        run = Launch(resize_argv(out), logs, f"run{i}")
        run.wait_step(target)
        run.p.send_signal(signal.SIGKILL)
        assert run.finish(timeout=60) == -signal.SIGKILL
    final = Launch(resize_argv(out), logs, "final")
    assert final.finish() == 0, final.stdout[-3000:] + final.stderr
    assert reference.finish() == 0, reference.stdout[-3000:] + reference.stderr
    assert_same_run(out, ref)
    assert "resumed from" in final.stdout and "epoch 2 trains at 14 px (DATA.IMG_SIZE_SCHEDULE)" in final.stdout
    assert "epoch 1 trains at 12 px" in reference.stdout and "epoch 2 trains at 14 px" in reference.stdout
    for folder in (ref, out):
        rows = [r for r in read_jsonl(folder / "metrics.jsonl") if "train/loss" in r]
        by_epoch = {(r["epoch"], r["train/img_size"]) for r in rows}
        assert by_epoch == {(1, 12), (2, 14)}, by_epoch


@pytest.mark.slow
def test_image_folders_train_at_the_schedules_sizes(tmp_path):
    """DATA.NAME folder (timm's transforms at DATA.IMG_SIZE, workers) takes the schedule too; val stays 16 px."""
    from runner.data.memory import export_digits_jpegs
    from tests.utils import TINY, run_tool

    root = export_digits_jpegs(tmp_path / "digits", size=16, per_class=20)
    out = tmp_path / "run"
    r = run_tool("train.py", ["--cfg", "configs/digits/resnet18.yaml", *TINY, "DATA.NAME", "folder",
                              "DATA.ROOT", str(root), "DATA.BATCH_SIZE", "32", "TRAIN.EPOCHS", "2", "LOG.PERIOD", "1",
                              "DATA.NUM_WORKERS", "1", "DATA.IMG_SIZE_SCHEDULE", "[[0, 12], [1, 16]]",
                              "OUTPUT_DIR", str(out)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    rows = [row for row in read_jsonl(out / "metrics.jsonl") if "train/loss" in row]
    assert {(row["epoch"], row["train/img_size"]) for row in rows} == {(1, 12), (2, 16)}
    assert [row["val/top1"] for row in read_jsonl(out / "metrics.jsonl") if "val/top1" in row]  # its loader as ever
