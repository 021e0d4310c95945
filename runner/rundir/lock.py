"""The run lock: OUTPUT_DIR/run.lock, held by the one job that writes the folder; the OS drops it on exit.

Light on purpose (no torch import): tools/train.py takes it before anything heavy is imported.
"""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from runner.errors import UserError
from runner.rundir.layout import LOCK

# What the holder writes into the lock file; the one place its format is spelled (the pattern comes from it).
_HOLDER = "pid {pid} on {host}"
_HOLDER_RE = re.compile(_HOLDER.format(pid=r"\d+", host=".+"))


def holder_text() -> str:
    """This process, as the lock file names its holder: 'pid 123 on host'."""
    return _HOLDER.format(pid=os.getpid(), host=socket.gethostname())


def is_holder_text(text: str) -> bool:
    """True when `text` is what a holder writes (a bare run.lock of ours, left by a start-up)."""
    return _HOLDER_RE.fullmatch(text) is not None


class RunLock:
    """An exclusive lock on OUTPUT_DIR/run.lock so two jobs never write one folder; the OS drops it on exit."""

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise UserError naming the holder."""
        import fcntl

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a read-only or special file system: the checks before cannot see every case
            raise UserError(f"OUTPUT_DIR {self.path.parent} cannot be written ({e.strerror}); "
                            "choose another OUTPUT_DIR") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode(errors="replace").strip()
            os.close(fd)
            raise in_use(self.path.parent, holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, holder_text().encode())
        self.fd = fd
        _HELD.add(fd)

    def release(self) -> None:
        """Drop the lock."""
        if self.fd is not None:
            _HELD.discard(self.fd)
            os.close(self.fd)
            self.fd = None


# The lock descriptors this process holds. A forked child (a DataLoader worker) would share the lock with its
# parent, and one orphaned by a SIGKILLed run would keep OUTPUT_DIR locked for seconds after the run died (a
# requeue's rerun refused as "in use" by a dead pid): each child closes its copies at once. (Exec'd children
# never get them: os.open's descriptors are not inheritable.)
_HELD: set[int] = set()


def _close_in_child() -> None:
    """After fork, in the child: drop this process's copies of the lock descriptors (the parent keeps the lock)."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


IN_USE = "is in use by a running job"  # the refusal's words, which launchers read in a job's output


def in_use(out: Path, holder: str) -> UserError:
    """The error for a folder another job is writing."""
    return UserError(f"{out} {IN_USE} ({holder or 'another process'}); "
                     "wait for it or choose another OUTPUT_DIR")


def is_locked(output_dir: str | os.PathLike) -> bool:
    """True while a job holds OUTPUT_DIR's run lock (used by the sweep summary to say 'running')."""
    import fcntl

    path = Path(output_dir) / LOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def refuse_if_locked(output_dir: str | os.PathLike) -> None:
    """UserError naming the holder while another job holds OUTPUT_DIR's run lock."""
    out = Path(output_dir)
    if is_locked(out):
        raise in_use(out, (out / LOCK).read_text(errors="replace").strip())
