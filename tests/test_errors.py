"""runner.errors: a quiet rank that leaves the line to rank 0 exits at once when torchrun's SIGTERM comes, whichever
thread of the process the kernel hands the signal to."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from tests.utils import ROOT

CHILD = textwrap.dedent("""
    import signal, sys, threading, time
    from runner import errors

    # the signal may land on any thread that does not block it: block it here so that the kernel gives it to the
    # other thread, as it may give torchrun's SIGTERM to one of gloo's threads
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # started first: it keeps no block
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    print("waiting", flush=True)
    errors._leave_the_line_to_rank_0(2)
    print("spoke after the wait", flush=True)
""")


def test_a_quiet_rank_exits_with_its_code_when_sigterm_lands_on_another_thread() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.stdout.readline().strip() == "waiting"
    time.sleep(0.2)  # into the wait (an early signal is held until then, which the assertion covers as well)
    sent = time.monotonic()
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 2 and "spoke" not in out
    assert time.monotonic() - sent < 5  # not the whole RELAY_WAIT_S of 20 s
