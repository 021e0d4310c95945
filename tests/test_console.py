"""The console on a real pseudo-terminal: the progress bar and the log lines never share a line, the bar shows
the epoch, the OUTPUT_DIR is named at the start and at the end, and log.txt holds the training lines."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from tests.utils import ROOT, TINY, TRAIN, env, read_jsonl

DIGITS = str(ROOT / "configs" / "digits" / "resnet18.yaml")
LOG_LINE = re.compile(r"\d\d:\d\d:\d\d [IWE] ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
TRAIN_LINE = re.compile(r"epoch (\d)/2 step (\d+)/\d+ loss [\d.]+ lr \S+ img/s \d+ eta ")


def run_on_pty(args: list[str]) -> tuple[int, str]:
    """tools/train.py with stdout and stderr on a pseudo-terminal of 100 columns; (exit code, all it wrote)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    p = subprocess.Popen([sys.executable, TRAIN, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                         cwd=ROOT, env=env(TERM="xterm"), start_new_session=True)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed its end
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        rc = p.wait(timeout=300)
    return rc, b"".join(chunks).decode(errors="replace")


def test_bar_and_log_lines_never_share_a_line(tmp_path):
    out = tmp_path / "run"
    rc, text = run_on_pty(["--cfg", DIGITS, "DATA.IMG_SIZE", "16", "DATA.BATCH_SIZE", "128", "TRAIN.EPOCHS", "2",
                           "LOG.PERIOD", "3", "DATA.NUM_WORKERS", "0", "LOG.TENSORBOARD", "false",
                           "OUTPUT_DIR", str(out)])
    assert rc == 0, text[-3000:]
    segments = re.split(r"[\r\n]", ANSI.sub("", text))
    bars = [s for s in segments if "%|" in s]
    assert any(s.startswith("epoch 1/2") for s in bars) and any(s.startswith("epoch 2/2") for s in bars), bars[:5]
    logs = [s for s in segments if LOG_LINE.search(s)]
    assert len(logs) >= 4
    for s in logs:  # each log line starts a line of its own and holds no piece of the bar
        assert LOG_LINE.match(s) and "%|" not in s and "step/s" not in s, repr(s)
    # the folder at the start (before training) and at the end (after the result)
    where = [i for i, s in enumerate(logs) if f"OUTPUT_DIR {out}" in s]
    assert len(where) == 2 and where[0] < [i for i, s in enumerate(logs) if " eval epoch 1 " in s][0]
    assert " done: val/top1 " in logs[where[1]] and where[1] == len(logs) - 1
    assert re.search(r"^CPU model +\S", (out / "env.txt").read_text(), re.MULTILINE)  # the run records its processor
    # on a terminal the training lines live in the bar; log.txt still has every one of them
    file_lines = (out / "log.txt").read_text().splitlines()
    trained = [m for m in map(TRAIN_LINE.search, file_lines) if m]
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]
    assert [(int(m.group(1)), int(m.group(2))) for m in trained] == [(r["epoch"], r["step"]) for r in rows]
    assert [r["step"] for r in rows] == [3, 6, 9, 12, 15, 18, 21, 22]  # 11 steps an epoch, a line per 3 and the last


def screen(text: str) -> list[str]:
    """What a terminal shows of `text`: each line as its carriage returns left it (a later piece overwrites the
    start of the earlier ones), escape codes dropped, trailing blanks cut."""
    shown = []
    for line in ANSI.sub("", text).split("\n"):
        cells = ""
        for piece in line.split("\r"):
            cells = piece + cells[len(piece):]
        shown.append(cells.rstrip())
    return [line for line in shown if line]


@pytest.mark.slow
def test_finished_bar_stays_above_the_done_line(tmp_path):
    """The bar is closed when training ends: complete, once, above the `done:` line (it was printed below it)."""
    rc, text = run_on_pty(["--cfg", str(ROOT / "configs" / "digits" / "test_resnet.yaml"), *TINY,
                           "TRAIN.MAX_STEPS", "6", "LOG.TENSORBOARD", "false", "OUTPUT_DIR", str(tmp_path / "run")])
    assert rc == 0, text[-3000:]
    lines = screen(text)
    assert " done: val/top1 " in lines[-1], lines[-4:]
    bars = [i for i, line in enumerate(lines) if "%|" in line]
    assert len(bars) == 1 and "6/6" in lines[bars[0]], lines[-6:]
    assert " eval epoch 0 step 6:" in lines[bars[0] - 1], lines[-6:]  # the last log line training printed
