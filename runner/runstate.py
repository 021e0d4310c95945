"""A run folder's state on disk: status file, results, the run lock, and "is this run already done?".

Light on purpose (no torch import): tools/train.py asks `finished_run` before importing anything heavy,
so re-running a finished sweep point costs only Python's start-up.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from runner.errors import UserError

# OUTPUT_DIR/run.json "status" values; results.json exists only for "done".
RUNNING, DONE, FAILED, PREEMPTED, NONFINITE, PROFILED, INTERRUPTED = (
    "running", "done", "failed", "preempted", "nonfinite", "profiled", "interrupted")


def temp_name(path: Path) -> Path:
    """The temporary file beside `path` that this process writes before renaming it onto `path`."""
    return path.with_name(f".{path.name}.tmp.{os.getpid()}")


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write JSON to a temporary file and rename it over `path`."""
    tmp = temp_name(path)
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def write_status(output_dir: str, status: str, **extra) -> None:
    """OUTPUT_DIR/run.json: the status the sweep summary reads."""
    obj = {"status": status, "pid": os.getpid(), "host": socket.gethostname(), "updated": time.time(), **extra}
    write_json_atomic(Path(output_dir) / "run.json", obj)


def read_json(path: Path) -> dict | None:
    """A JSON file's object, or None when missing or unreadable."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def changed_run_keys(cfg, stored_yaml: str) -> list[str]:
    """The keys that change the run (not only extend or observe it) whose values differ from `stored_yaml`."""
    from runner.config import RESUME_SAFE_KEYS, config_from_yaml_text, diff_configs

    old = config_from_yaml_text(stored_yaml)
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in diff_configs(old, cfg) if k not in RESUME_SAFE_KEYS]


def refuse_changed(cfg, stored_yaml: str, where: str) -> None:
    """UserError listing the run-changing keys that differ from the stored config."""
    changed = changed_run_keys(cfg, stored_yaml)
    if changed:
        raise UserError(
            f"the config differs from the one {where} in keys that change the run ({'; '.join(changed)}); "
            "use another OUTPUT_DIR, or CHECKPOINT.RESUME none to start over"
        )


def finished_run(cfg) -> dict | None:
    """results.json of this OUTPUT_DIR if the run finished with this config and length, else None."""
    out = Path(cfg.OUTPUT_DIR)
    results = read_json(out / "results.json")
    if not results or results.get("status") != DONE or cfg.CHECKPOINT.RESUME == "none":
        return None
    stored = out / "config.yaml"
    if stored.exists():
        refuse_changed(cfg, stored.read_text(), f"of the finished run in {out}")
    if results.get("epochs") != cfg.TRAIN.EPOCHS or results.get("max_steps", 0) != cfg.TRAIN.MAX_STEPS:
        return None  # the run was extended: train on from its last checkpoint
    return results


class RunLock:
    """An exclusive lock on OUTPUT_DIR/run.lock so two jobs never write one folder; the OS drops it on exit."""

    def __init__(self, output_dir: str):
        self.path = Path(output_dir) / "run.lock"
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise UserError naming the holder."""
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UserError(f"{self.path.parent} is in use by a running job ({holder}); "
                            "wait for it or choose another OUTPUT_DIR") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        self.fd = fd

    def release(self) -> None:
        """Drop the lock."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def is_locked(output_dir: str | os.PathLike) -> bool:
    """True while a job holds OUTPUT_DIR's run lock (used by the sweep summary to say 'running')."""
    import fcntl

    path = Path(output_dir) / "run.lock"
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
