"""The slot pool of `python -m runner.sweep run`: N processes at a time, a signal passed on, each end judged.

A slot runs one point (or one search worker) at a time. With more than one slot each process's output is appended
to ROOT/logs/NAME.log after a header line (never truncated: an earlier run's lines are its record); with one it
goes to the console. Ctrl-C or SIGTERM stops the sweep: no new process starts, the running ones get SIGTERM (they
save and exit 75) and the sweep exits 75. A process started here ignores SIGINT and SIGQUIT, as a shell's
background job does: a Ctrl-C reaches it as the one SIGTERM sent here (a runner counts a second stop signal as
"stop at once"). Exit codes, as tools/sweeps/run.sh always gave them: 0 done (busy points included), 1 some
process failed, 75 some process stopped (saved) or the sweep was stopped.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from runner.errors import EXIT_OK, EXIT_PREEMPTED, EXIT_USER
from runner.process import signalsafe
from runner.rundir import reader

EXIT_FAILED = 1
SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=@%+-")


def say(text: str, err: bool = False) -> None:
    """One line of the launcher's own, flushed (the processes it starts write to the same streams)."""
    print(text, file=sys.stderr if err else sys.stdout, flush=True)


def shell_word(text: str) -> str:
    """`text` as bash's printf %q writes it, so that a logged command can be pasted back into a shell."""
    if not text:
        return "''"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "$'" + text.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"
    # ~ and # mean something to a shell only at a word's start
    return "".join(c if c in SAFE or ord(c) > 127 or (i and c in "~#") else "\\" + c for i, c in enumerate(text))


@dataclass
class Running:
    """One started process: its name, its point's folder (None for a search worker) and its rendezvous port."""

    name: str
    proc: subprocess.Popen
    folder: str | None
    port: int | None = None


def _quiet_child() -> None:
    """In the child before exec: SIGINT and SIGQUIT ignored (the launcher passes a stop on as SIGTERM)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


@dataclass
class Pool:
    """`slots` processes at a time under `root`; `unit` names them (point, worker); `torchrun`: a refusal of a
    busy folder may come as torchrun's 1."""

    slots: int
    root: str
    unit: str = "point"
    torchrun: bool = False
    running: list[Running | None] = field(default_factory=list)
    stopping: bool = False
    failed: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.running = [None] * self.slots

    def install(self) -> None:
        """Ctrl-C and SIGTERM stop the sweep (see the module's docstring)."""
        signalsafe.start()
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGTERM, self._stop)

    def _stop(self, signum, frame) -> None:
        """Start nothing more; ask every running process to save and exit."""
        self.stopping = True
        signalsafe.later(say, "sweep: stopping; running points save their state (re-run the same command to continue)",
                         True)
        for run in self.running:
            if run is not None and run.proc.returncode is None:
                try:
                    run.proc.send_signal(signal.SIGTERM)
                except OSError:
                    pass

    def free_slot(self) -> int:
        """A free slot's number, waiting for a running process to end while every slot is taken."""
        while None not in self.running:
            self.reap_one()
        return self.running.index(None)

    def ports(self) -> set[int]:
        """The rendezvous ports of the running processes."""
        return {run.port for run in self.running if run is not None and run.port is not None}

    def start(self, slot: int, name: str, argv: list[str], env: dict[str, str], folder: str | None = None,
              port: int | None = None) -> None:
        """Run `argv` in slot `slot` (nothing once the sweep is stopping)."""
        if self.stopping:
            return
        if self.slots == 1:
            say(f"sweep: start {name}")
            proc = subprocess.Popen(argv, env=env, preexec_fn=_quiet_child)
        else:
            log = os.path.join(self.root, "logs", f"{name}.log")
            os.makedirs(os.path.dirname(log), exist_ok=True)
            say(f"sweep: start {name} in slot {slot} (output: {log})")
            with open(log, "ab") as out:  # appended: an earlier run's lines (a finished study's) are its record
                out.write(header(name, argv, env).encode("utf-8", "surrogateescape"))
                out.flush()
                proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_quiet_child)
        self.running[slot] = Running(name, proc, folder, port)

    def reap_one(self) -> None:
        """Wait for one running process to end and judge its exit code."""
        pid, status = os.waitpid(-1, 0)  # every child of this process is a slot's (the table runs after them)
        slot = next((i for i, r in enumerate(self.running) if r is not None and r.proc.pid == pid), None)
        if slot is None:
            return
        run, self.running[slot] = self.running[slot], None
        code = os.waitstatus_to_exitcode(status)
        run.proc.returncode = code
        self.judge(run, 128 - code if code < 0 else code)  # a signal's death as a shell reports it

    def judge(self, run: Running, code: int) -> None:
        """Say how the process ended and note a failure, a stop or a busy folder."""
        if code == EXIT_OK:
            say(f"sweep: {run.name} finished")
        elif code == EXIT_PREEMPTED:  # saved and stopped (SIGTERM/USR1, TRAIN.TIME_LIMIT): a re-run continues it
            self.stopped.append(run.name)
            say(f"sweep: {run.name} stopped with exit code 75 (its state is saved; re-run the same command to "
                "continue it)", err=True)
        elif self.refused_busy(run, code):  # another job (a second launcher, a SLURM task) trains it
            self.busy.append(run.name)
            say(f"sweep: {run.name} is busy: another job holds {run.folder} (skipped; that job trains it)")
        else:
            self.failed.append(f"{run.name} (exit code {code})")
            say(f"sweep: {run.name} failed with exit code {code}", err=True)

    def refused_busy(self, run: Running, code: int) -> bool:
        """True when the point was refused because another job holds its folder's run lock: train.py's exit 2
        (torchrun's 1), and the folder still held by the other job or its run done since."""
        if run.folder is None or not (code == EXIT_USER or (self.torchrun and code == EXIT_FAILED)):
            return False
        return reader.state(run.folder) in ("running", "done")

    def wait_all(self) -> None:
        """Until no process runs."""
        while any(run is not None for run in self.running):
            self.reap_one()

    def verdict(self, skipped: int) -> int:
        """Say what was skipped, busy, stopped or failed; the sweep's exit code."""
        unit = self.unit
        signalsafe.drain()  # the stop's own line, if still pending, comes first
        if skipped:
            say(f"sweep: {skipped} finished point(s) skipped without starting Python; after raising TRAIN.EPOCHS or "
                "TRAIN.MAX_STEPS, re-run with SWEEP_RECHECK=1 so that train.py extends them")
        if self.busy:
            say(f"sweep: {len(self.busy)} point(s) busy, skipped: another job held their folder (re-run the same "
                "command after it ends to check them):")
            say("\n".join(f"  {name}" for name in self.busy))
        if self.stopping:
            say("sweep: stopped; re-run the same command to continue", err=True)
            return EXIT_PREEMPTED
        if self.stopped:
            say(f"sweep: {len(self.stopped)} {unit}(s) stopped before their end, state saved (re-run the same "
                "command to continue):", err=True)
            say("\n".join(f"  {name}" for name in self.stopped), err=True)
        if self.failed:
            say(f"sweep: {len(self.failed)} {unit}(s) failed (see their log; re-running retries them):", err=True)
            say("\n".join(f"  {name}" for name in self.failed), err=True)
            return EXIT_FAILED
        return EXIT_PREEMPTED if self.stopped else EXIT_OK


def header(name: str, argv: list[str], env: dict[str, str]) -> str:
    """The log's line before a start: when, what, where, and the command as a shell would take it back."""
    shown = [*([f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}"] if "CUDA_VISIBLE_DEVICES" in env else []),
             *argv]
    when = time.strftime("%Y-%m-%d %H:%M:%S %z")
    return (f"=== {when} start {name} on {socket.gethostname()} (sweep pid {os.getpid()}):"
            f"{''.join(' ' + shell_word(a) for a in shown)}\n")
