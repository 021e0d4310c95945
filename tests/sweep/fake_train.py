"""A stand-in for tools/train.py in the search's tests (no torch): it keeps tools/train.py's pause contract.

`fake_train.py --cfg=... KEY VALUE ... OUTPUT_DIR DIR [--pause-after-epoch E]` appends one evaluation row per epoch
from the last one in DIR/metrics.jsonl to E (TRAIN.EPOCHS without the flag), val/top1 a function of TRAIN.LR and
the epoch, writes run.json (paused or done) and DIR/calls.txt (one line per call: the epochs it trained), exits 0.
FAKE_FAIL_ABOVE=X: a TRAIN.LR above X fails (exit 1, 'boom' on stderr). FAKE_EXIT=N:E makes a call that
would train epoch E exit N first (75: preempted, nothing written), once per DIR. FAKE_SIGNAL=S:E:K: a call that
would train epoch E dies of signal S instead (after writing nothing), K times per DIR (default once). FAKE_GROUP_TERM=E:
a call that would train epoch E first sends SIGTERM to its process group (a stop of the whole job while it starts).
A call that pauses prints "paused after epoch E", as tools/train.py does.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path


def settings(argv: list[str]) -> tuple[dict[str, str], int | None]:
    """KEY -> VALUE of the command line (later wins) and the pause epoch."""
    pause = None
    if "--pause-after-epoch" in argv:
        i = argv.index("--pause-after-epoch")
        pause = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    pairs = [a for a in argv if not a.startswith("--cfg")]
    return dict(zip(pairs[::2], pairs[1::2], strict=True)), pause


def top1(lr: float, epoch: int) -> float:
    """Best near LR 0.003; a later epoch is better."""
    return round(90.0 - 10.0 * abs(math.log10(lr) + 2.5) + epoch, 6)


def main() -> int:
    """Train (pretend) to the pause epoch."""
    keys, pause = settings(sys.argv[1:])
    out = Path(keys["OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    done = rows[-1]["epoch"] if rows else 0
    end = min(pause or 10**9, int(keys.get("TRAIN.EPOCHS", "3")))
    if float(keys["TRAIN.LR"]) > float(os.environ.get("FAKE_FAIL_ABOVE", "inf")):
        print("RuntimeError: boom", file=sys.stderr)
        return 1
    code, _, at = os.environ.get("FAKE_EXIT", "0:0").partition(":")
    flag = out / "fake_exit_done"
    if code != "0" and done < int(at) <= end and not flag.exists():
        flag.write_text("")
        return int(code)
    if killed(out, done, end):
        return 1  # not reached: the signal ends the process
    with open(metrics, "a") as f:
        for epoch in range(done + 1, end + 1):
            f.write(json.dumps({"step": epoch * 10, "epoch": epoch, "val/top1": top1(float(keys["TRAIN.LR"]), epoch),
                                "val/loss": 1.0 / epoch}) + "\n")
    with open(out / "calls.txt", "a") as f:
        f.write(f"{done + 1}-{end}\n")
    status = "done" if end >= int(keys.get("TRAIN.EPOCHS", "3")) else "paused"
    (out / "run.json").write_text(json.dumps({"status": status, "epoch": end}))
    if status == "paused":
        print(f"paused after epoch {end}", flush=True)
    return 0


def killed(out: Path, done: int, end: int) -> bool:
    """FAKE_GROUP_TERM and FAKE_SIGNAL: end this call by a signal, as the module's docstring says."""
    group = os.environ.get("FAKE_GROUP_TERM")
    if group and done < int(group) <= end and not (out / "fake_group_done").exists():
        (out / "fake_group_done").write_text("")
        os.killpg(os.getpgrp(), signal.SIGTERM)  # the default action: this process dies of it too
        time.sleep(30)
    sig, _, rest = os.environ.get("FAKE_SIGNAL", "0:0").partition(":")
    at, _, times = rest.partition(":")
    count = out / "fake_signal_count"
    n = int(count.read_text()) if count.exists() else 0
    if sig != "0" and done < int(at) <= end and n < int(times or 1):
        count.write_text(str(n + 1))
        os.kill(os.getpid(), int(sig))
        time.sleep(30)
    return False


if __name__ == "__main__":
    sys.exit(main())
