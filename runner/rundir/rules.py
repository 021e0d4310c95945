"""The refusal rules of a run folder (torch-free): whose folder it is, two runs never mixed in one, a changed config
refused, and "is this run already done?".

Light on purpose: tools/train.py asks `check_output_dir` and `finished_run` before importing anything heavy, so
re-running a finished sweep point costs only Python's start-up.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from runner.errors import UserError
from runner.rundir import reader
from runner.rundir.checkpoints import has_checkpoints
from runner.rundir.layout import CHECKPOINTS, CONFIG, METRICS, RESULTS, RUN_JSON, kept_results_name
from runner.rundir.lock import refuse_if_locked
from runner.rundir.marker import FAILED, FORMAT_RE, RUN_FORMAT, RUN_VERSION, is_done, is_our_run


def has_run_data(out: Path) -> str:
    """What an earlier run left in `out` (checkpoints, results, metrics), described in a few words; '' if none."""
    results = reader.results(out)
    if results is not None:
        return f"a finished run (step {results.get('step')}, epoch {results.get('epoch')})"
    if has_checkpoints(out):
        return "an earlier run's checkpoints"
    metrics = out / METRICS
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
    path = out / RUN_JSON
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
    version = FORMAT_RE.fullmatch(str(obj.get("format", ""))) if isinstance(obj, dict) else None
    if version is not None and int(version.group(1)) > RUN_VERSION:
        raise UserError(f"OUTPUT_DIR {out} was made by a newer runner (format {int(version.group(1))}; this one "
                        f"reads up to {RUN_VERSION}): continue it with that runner, or choose another OUTPUT_DIR")


def _refuse_another_config(cfg, out: Path) -> None:
    """A run-changing config on a folder whose run has no checkpoint yet (killed or failed early) but had another.

    With a checkpoint, claiming the folder compares the checkpoint's own config (and names the file). Without
    config.yaml (killed between the claim and writing it) the claim's run.json holds the config; a set-up that
    failed rewrote run.json without it, so a corrected config may take the folder on.
    """
    if has_checkpoints(out) or not is_our_run(out):
        return
    state = "finished" if (out / RESULTS).exists() else "unfinished"
    if (out / CONFIG).is_file():
        refuse_changed(cfg, (out / CONFIG).read_text(), f"of the {state} run in {out}")
        return
    claimed = (reader.status(out) or {}).get("config")
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
    own = Path(resume).resolve().parent == (out / CHECKPOINTS).resolve()
    if not own or (out / RESULTS).exists():
        why = "another folder's checkpoint" if not own else "a checkpoint of a finished run"
        raise UserError(f"CHECKPOINT.RESUME {resume} is {why} but OUTPUT_DIR {out} holds {earlier}; resuming "
                        "would mix two runs in one folder: choose another (new) OUTPUT_DIR")


def changed_run_keys(cfg, stored_yaml: str) -> list[str]:
    """The keys that change the run (not only extend or observe it) whose values differ from `stored_yaml`."""
    from runner.config import RESUME_SAFE_KEYS, config_from_yaml_text, diff_configs
    from runner.config.schema import is_auto

    old = config_from_yaml_text(stored_yaml)
    # "auto" takes the stored value on resume (the run resolved it once): it never changes the run
    return [f"{k}: {a!r} -> {b!r}" for k, a, b in diff_configs(old, cfg)
            if k not in RESUME_SAFE_KEYS and not is_auto(k, b)]


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
    results = reader.results(out)
    if not is_done(results) or cfg.CHECKPOINT.RESUME != "auto" or not is_our_run(out):
        return None
    if (out / CONFIG).exists():
        refuse_changed(cfg, (out / CONFIG).read_text(), f"of the finished run in {out}")
    stop = results.get("early_stop")
    if isinstance(stop, dict):  # early stopping ended it: done, whatever length is asked (TRAIN.EXTEND included)
        return results, f"it stopped early at step {stop.get('step')}: {stop.get('reason')}"
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
                        f"{kept_results_name(step)}; {_schedule_on(cfg, results)}), or choose another OUTPUT_DIR "
                        "for a fresh run")
    return None  # the run is extended: train on from its last checkpoint


def _schedule_on(cfg, results: dict) -> str:
    """How the LR schedule continues when the finished run of `results` is trained on with `cfg`."""
    from runner.optim import schedule_on_extension  # only a refusal or an extension says it: the done path skips it

    return schedule_on_extension(cfg, results.get("epochs"), results.get("step"))


def keep_finished_result(cfg) -> str:
    """Rename OUTPUT_DIR's results.json to results-step<N>.json before the run is trained on; '' if none."""
    out = Path(cfg.OUTPUT_DIR)
    results = reader.results(out)
    if not cfg.TRAIN.EXTEND or not is_done(results):
        return ""
    kept = kept_results_name(results.get("step", 0))
    os.replace(out / RESULTS, out / kept)
    return f"training the finished run on: its results.json is kept as {kept}; {_schedule_on(cfg, results)}"


def done_line(cfg, results: dict, why: str) -> str:
    """What a re-run of a finished run prints: its result, and why nothing trains (nothing is rewritten)."""
    top1 = results.get("val/top1")
    shown = f"{top1:.2f}" if isinstance(top1, (int, float)) else "-"
    return f"{cfg.OUTPUT_DIR}: already done (val/top1 {shown}; {why}); nothing to train, nothing rewritten"
