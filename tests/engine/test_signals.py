"""StopFlag's signal handler: its line is written outside the handler."""
import io
import logging
import os
import signal

from runner.engine.signals import StopFlag


class SignalsItsOwnProcess(io.RawIOBase):
    """A raw stream whose first write sends SIGUSR1 to this process: the Python handler then runs inside the
    write, with the BufferedWriter above it busy, as when a write to a full pipe is interrupted."""

    def __init__(self):
        self.data, self.sent = bytearray(), False

    def writable(self):
        return True

    def write(self, b):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGUSR1)
        self.data += bytes(b)
        return len(b)


def test_a_signal_during_a_log_write_logs_its_line_after_it(capsys):
    raw = SignalsItsOwnProcess()
    stream = io.TextIOWrapper(io.BufferedWriter(raw), line_buffering=True)
    handler = logging.StreamHandler(stream)
    log = logging.getLogger("runner")
    log.addHandler(handler)
    old_level = log.level
    log.setLevel(logging.INFO)
    flag = StopFlag(None)
    flag.install()
    try:
        log.info("a line being written when the signal comes")
        assert flag.poll()  # the request holds, and poll writes the handler's line if still pending
    finally:
        flag.close()
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        log.removeHandler(handler)
        log.setLevel(old_level)
    stream.flush()
    text = raw.data.decode()
    assert raw.sent
    assert "Logging error" not in capsys.readouterr().err
    assert text.splitlines() == ["a line being written when the signal comes",
                                 "received SIGUSR1: finishing the current step, then saving and exiting"], text
