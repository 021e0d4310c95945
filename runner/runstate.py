"""A run folder's state on disk: status file, results, whose folder it is, and "is this run already done?".

Light on purpose (no torch import): tools/train.py asks `finished_run` before importing anything heavy,
so re-running a finished sweep point costs only Python's start-up.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

from runner.errors import UserError
from runner.fsutil import atomic_write
from runner.lock import LOCK_NAME, is_holder_text, refuse_if_locked

# OUTPUT_DIR/run.json "status" values; results.json exists only for "done".
RUNNING, DONE, FAILED, PREEMPTED, NONFINITE, PROFILED, INTERRUPTED, HUNG = (
    "running", "done", "failed", "preempted", "nonfinite", "profiled", "interrupted", "hung")


# run.json's "format": the marker that says a folder is a run of ours and may be written into; a newer version
# is refused (this code cannot know what that runner keeps in the folder)
RUN_VERSION = 1
RUN_FORMAT = f"runner-run/{RUN_VERSION}"
_FORMAT_RE = re.compile(r"runner-run/([0-9]+)")
# what an earlier version's run.json held (no "format" yet); still recognised as ours
_LEGACY_RUN_KEYS = {"status", "pid", "host", "updated"}
_STATUSES = {RUNNING, DONE, FAILED, PREEMPTED, NONFINITE, PROFILED, INTERRUPTED, HUNG}


def write_json_atomic(path: Path, obj: dict) -> None:
    """Write JSON through the one atomic writer (temporary file, fsync, rename)."""
    atomic_write(path, json.dumps(obj, indent=2) + "\n")


def write_status(output_dir: str, status: str, **extra) -> None:
    """OUTPUT_DIR/run.json: the status the sweep summary reads, and the marker that the folder is our run."""
    obj = {"format": RUN_FORMAT, "status": status, "pid": os.getpid(), "host": socket.gethostname(),
           "updated": time.time(), **extra}
    write_json_atomic(Path(output_dir) / "run.json", obj)


def read_json(path: Path) -> dict | None:
    """A JSON file's object, or None when missing or unreadable."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def is_our_run(out: Path) -> bool:
    """True when `out` holds our marker: a run.json we wrote (or a bare run.lock left by a start-up)."""
    obj = read_json(out / "run.json")
    if obj is not None:
        return obj.get("format") == RUN_FORMAT or (_LEGACY_RUN_KEYS <= set(obj) and obj["status"] in _STATUSES)
    try:
        entries = [p.name for p in out.iterdir()]
        lock_text = (out / LOCK_NAME).read_text(errors="replace") if entries == [LOCK_NAME] else ""
    except OSError:
        return False
    return is_holder_text(lock_text)  # another job is starting in it


def has_run_data(out: Path) -> str:
    """What an earlier run left in `out` (checkpoints, results, metrics), described in a few words; '' if none."""
    results = read_json(out / "results.json")
    if results is not None:
        return f"a finished run (step {results.get('step')}, epoch {results.get('epoch')})"
    ckpts = out / "checkpoints"
    if ckpts.is_dir() and any(p.suffix == ".pth" for p in ckpts.iterdir()):
        return "an earlier run's checkpoints"
    metrics = out / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        return "an earlier run's metrics"
    return ""


def check_output_dir(cfg) -> None:
    """Refuse an OUTPUT_DIR that is not ours to write, or a start that would mix two runs in one folder."""
    out = Path(cfg.OUTPUT_DIR)
    if out.exists() and not out.is_dir():
        raise UserError(f"OUTPUT_DIR {out} is a file, not a folder; choose another OUTPUT_DIR")
    if not out.is_dir():
        _refuse_unmakeable(out)
        return
    try:
        entries = sorted(p.name for p in out.iterdir())
    except OSError as e:
        raise UserError(f"OUTPUT_DIR {out} cannot be read ({e.strerror}); choose another OUTPUT_DIR") from None
    refuse_if_locked(out)
    _refuse_unreadable_marker(out)
    if entries and not is_our_run(out):
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise UserError(f"OUTPUT_DIR {out} is not empty and holds no run of ours (found {shown}; no run.json "
                        "from this runner); nothing was written there: choose a new or empty folder")
    _refuse_mixing(cfg, out)
    _refuse_another_config(cfg, out)


def _refuse_unreadable_marker(out: Path) -> None:
    """A run.json that is damaged (not JSON) or made by a newer runner: refused in one line, nothing written."""
    path = out / "run.json"
    try:
        raw = path.read_bytes()
    except OSError:  # missing (or unreadable: is_our_run then finds no marker and says so)
        return
    try:
        obj = json.loads(raw)
    except ValueError as e:
        what = "empty" if not raw.strip() else f"not JSON: {str(e).splitlines()[0]}"
        fix = json.dumps({"format": RUN_FORMAT, "status": FAILED})
        raise UserError(f"{path} is damaged ({what}); nothing was written there: if the folder holds a run of "
                        f"this runner, replace run.json with {fix} to continue it, or choose another "
                        "OUTPUT_DIR") from None
    version = _FORMAT_RE.fullmatch(str(obj.get("format", ""))) if isinstance(obj, dict) else None
    if version is not None and int(version.group(1)) > RUN_VERSION:
        raise UserError(f"OUTPUT_DIR {out} was made by a newer runner (format {int(version.group(1))}; this one "
                        f"reads up to {RUN_VERSION}): continue it with that runner, or choose another OUTPUT_DIR")


def _refuse_another_config(cfg, out: Path) -> None:
    """A run-changing config on a folder whose run has no checkpoint yet (killed or failed early) but had another.

    With a checkpoint, claiming the folder compares the checkpoint's own config (and names the file). Without
    config.yaml (killed between the claim and writing it) the claim's run.json holds the config; a set-up that
    failed rewrote run.json without it, so a corrected config may take the folder on.
    """
    stored, ckpts = out / "config.yaml", out / "checkpoints"
    if ckpts.is_dir() and any(p.suffix == ".pth" for p in ckpts.iterdir()):
        return
    if not is_our_run(out):
        return
    state = "finished" if (out / "results.json").exists() else "unfinished"
    if stored.is_file():
        refuse_changed(cfg, stored.read_text(), f"of the {state} run in {out}")
        return
    claimed = (read_json(out / "run.json") or {}).get("config")
    if isinstance(claimed, str):
        refuse_changed(cfg, claimed, f"that claimed {out} (its run.json; the run stopped before config.yaml)")


def _refuse_unmakeable(out: Path) -> None:
    """A missing OUTPUT_DIR that cannot be created: under a file, or in a folder we may not write."""
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"OUTPUT_DIR {out} cannot be made: {parent} is a file; choose another OUTPUT_DIR")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"OUTPUT_DIR {out} cannot be made: {parent} is not writable; choose another OUTPUT_DIR")


def _refuse_mixing(cfg, out: Path) -> None:
    """CHECKPOINT.RESUME none, or another folder's checkpoint, on a folder that already holds a run."""
    resume = cfg.CHECKPOINT.RESUME
    if resume == "auto":
        return
    earlier = has_run_data(out)
    if not earlier:
        return
    if resume == "none":
        raise UserError(f"OUTPUT_DIR {out} holds {earlier}; CHECKPOINT.RESUME none would mix two runs in one "
                        "folder: choose another OUTPUT_DIR, or delete that folder to start over")
    own = Path(resume).resolve().parent == (out / "checkpoints").resolve()
    if not own or (out / "results.json").exists():
        why = "another folder's checkpoint" if not own else "a checkpoint of a finished run"
        raise UserError(f"CHECKPOINT.RESUME {resume} is {why} but OUTPUT_DIR {out} holds {earlier}; resuming "
                        "would mix two runs in one folder: choose another (new) OUTPUT_DIR")


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
            "two runs never share a folder: use another OUTPUT_DIR, or delete that folder to start over"
        )


def finished_run(cfg) -> tuple[dict, str] | None:
    """(results.json, why nothing will train) when OUTPUT_DIR's finished run already covers this config."""
    out = Path(cfg.OUTPUT_DIR)
    results = read_json(out / "results.json")
    if not results or results.get("status") != DONE or cfg.CHECKPOINT.RESUME != "auto" or not is_our_run(out):
        return None
    stored = out / "config.yaml"
    if stored.exists():
        refuse_changed(cfg, stored.read_text(), f"of the finished run in {out}")
    epochs, step = results.get("epoch", 0), results.get("step", 0)
    if cfg.TRAIN.EPOCHS <= epochs:
        same = cfg.TRAIN.EPOCHS == results.get("epochs")
        more = "" if same else f"; TRAIN.EPOCHS {cfg.TRAIN.EPOCHS} asks for no more"
        return results, f"it ran {epochs} epochs, {step} steps{more}"
    if 0 < cfg.TRAIN.MAX_STEPS <= step:
        return results, f"it ran {step} steps; TRAIN.MAX_STEPS {cfg.TRAIN.MAX_STEPS} asks for no more"
    if not cfg.TRAIN.EXTEND:  # a longer run over a finished one would replace its result unseen
        raise UserError(f"OUTPUT_DIR {out} holds a finished run ({epochs} epochs, {step} steps) and this config asks "
                        f"for more: add TRAIN.EXTEND True to train that run on (its results.json is kept as "
                        f"{kept_results_name(step)}; {schedule_on(cfg, results)}), or choose another OUTPUT_DIR "
                        "for a fresh run")
    return None  # the run is extended: train on from its last checkpoint


def kept_results_name(step: int) -> str:
    """The name a finished run's results.json keeps when the run is trained on (TRAIN.EXTEND)."""
    return f"results-step{step}.json"


def schedule_on(cfg, results: dict) -> str:
    """How the LR schedule continues when a run of `results` is trained on with `cfg`."""
    old = results.get("epochs")
    if old == cfg.TRAIN.EPOCHS or cfg.TRAIN.SCHEDULER != "cosine":  # only cosine's shape depends on the length
        return "the LR follows the same schedule on"
    return (f"the LR schedule is re-derived for {cfg.TRAIN.EPOCHS} epochs instead of {old} and continues from step "
            f"{results.get('step')}: a {cfg.TRAIN.SCHEDULER} schedule that had ended starts again (a warm restart)")


def keep_finished_result(cfg) -> str:
    """Rename OUTPUT_DIR's results.json to results-step<N>.json before the run is trained on; '' if none."""
    out = Path(cfg.OUTPUT_DIR)
    results = read_json(out / "results.json")
    if not cfg.TRAIN.EXTEND or not results or results.get("status") != DONE:
        return ""
    kept = kept_results_name(results.get("step", 0))
    os.replace(out / "results.json", out / kept)
    return f"training the finished run on: its results.json is kept as {kept}; {schedule_on(cfg, results)}"


def done_line(cfg, results: dict, why: str) -> str:
    """What a re-run of a finished run prints: its result, and why nothing trains (nothing is rewritten)."""
    top1 = results.get("val/top1")
    shown = f"{top1:.2f}" if isinstance(top1, (int, float)) else "-"
    return f"{cfg.OUTPUT_DIR}: already done (val/top1 {shown}; {why}); nothing to train, nothing rewritten"
