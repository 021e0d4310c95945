"""One table of every run under a folder: overridden keys, status and results (no torch import)."""
from __future__ import annotations

import csv
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runner.config import get_default_config

# A run with no results.json counts as running when one of its files changed this recently (seconds)
ACTIVE_S = 120.0
# Subfolders of a run that never hold runs themselves; skipping them keeps the walk fast
SKIP_DIRS = {"checkpoints", "profile"}
# Files whose modification time shows that a run is alive
ACTIVITY_FILES = ("metrics.jsonl", "log.txt", "checkpoints/last.pth")
# Keys that differ in every run by construction, so they never make a column
IGNORED_KEYS = {"OUTPUT_DIR"}
RESULT_COLUMNS = ("status", "val/top1", "best/val/top1", "val/top5", "best/val/top5", "epoch", "wall_s",
                  "train/img_per_s", "note")
DEFAULT_SORT = "best/val/top1"

try:  # the C loader is several times faster on hundreds of config files
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader


@dataclass
class Run:
    """What one run folder says about itself."""

    path: str
    status: str = ""
    config_files: str = ""
    changed: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def row(self, keys: list[str]) -> dict[str, Any]:
        """Column name to value: run, config, the given override keys, then the result columns."""
        row = {"run": self.path, "config": self.config_files, **{k: self.changed.get(k) for k in keys}}
        row.update({k: self.results.get(k) for k in RESULT_COLUMNS})
        row.update(status=self.status, note="; ".join(self.notes))
        return row


def find_runs(root: Path) -> list[Path]:
    """Every folder under root (root included) that holds a config.yaml, in sorted order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        if "config.yaml" in filenames:
            found.append(Path(dirpath))
    return found


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings to {"A.B": value}; tuples become lists so YAML and defaults compare equal."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: list(node) if isinstance(node, tuple) else node}


_DEFAULTS: dict[str, Any] | None = None


def default_values() -> dict[str, Any]:
    """The defaults of runner.config, flattened (computed once)."""
    global _DEFAULTS
    if _DEFAULTS is None:
        _DEFAULTS = flatten(get_default_config())
    return _DEFAULTS


def changed_keys(config: dict[str, Any]) -> dict[str, Any]:
    """Keys of a loaded config.yaml whose value differs from the defaults (unknown keys included)."""
    defaults = default_values()
    flat = flatten(config)
    return {k: v for k, v in sorted(flat.items())
            if k not in IGNORED_KEYS and (k not in defaults or defaults[k] != v)}


def read_config(run: Run, folder: Path) -> None:
    """Fill the changed keys and the config file names from config.yaml; a bad file becomes a note."""
    text = (folder / "config.yaml").read_text(errors="replace")
    try:
        config = yaml.load(text, Loader=_Loader)
        if not isinstance(config, dict):
            raise ValueError("not a mapping of keys")
    except (yaml.YAMLError, ValueError) as e:
        run.notes.append(f"config.yaml unreadable ({_first_line(e)})")
        return
    run.changed = changed_keys(config)
    run.config_files = _config_files(text)


def _config_files(text: str) -> str:
    """The --cfg file(s) a run came from, when the loader recorded them in a leading comment."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line.lstrip("# ").partition(":")
        if key.strip().lower() in ("cfg", "config", "config files", "from"):
            return value.strip()
    return ""


def read_metrics(run: Run, folder: Path) -> dict[str, Any]:
    """Final/best val metrics, epoch and img/s from metrics.jsonl; bad lines are skipped and noted."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return {}
    lines = path.read_bytes().splitlines()
    out: dict[str, Any] = {}
    bad = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError
        except ValueError:
            bad.append(number)
            continue
        _fold_metrics(out, record)
    if bad == [len(lines)]:
        run.notes.append("partial last line of metrics.jsonl ignored")
    elif bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        run.notes.append(f"metrics.jsonl: {len(bad)} unreadable line(s) skipped (line {shown})")
    return out


def _fold_metrics(out: dict[str, Any], record: dict[str, Any]) -> None:
    """Update the running final/best values with one metrics.jsonl record."""
    if isinstance(record.get("epoch"), (int, float)):
        out["epoch"] = record["epoch"]
    for key in ("val/top1", "val/top5", "train/img_per_s"):
        value = record.get(key)
        if isinstance(value, (int, float)):
            out[key] = value
            best = f"best/{key}"
            if key.startswith("val/") and (best not in out or value > out[best]):
                out[best] = value


def read_results(run: Run, folder: Path) -> dict[str, Any] | None:
    """results.json as a dict, or None when there is none; an unreadable one becomes a note."""
    path = folder / "results.json"
    if not path.is_file():
        return None
    try:
        results = json.loads(path.read_text())
        if not isinstance(results, dict):
            raise ValueError("not a JSON object")
        return results
    except (ValueError, OSError) as e:
        run.notes.append(f"results.json unreadable ({_first_line(e)})")
        return None


def is_active(folder: Path, now: float, active_s: float = ACTIVE_S) -> bool:
    """A live process id in run.pid, or a log/metrics/checkpoint file changed within active_s."""
    pid = _read_pid(folder / "run.pid")
    if pid is not None:
        return _pid_alive(pid)
    for name in ACTIVITY_FILES:
        try:
            if now - (folder / name).stat().st_mtime < active_s:
                return True
        except OSError:
            continue
    return False


def _read_pid(path: Path) -> int | None:
    """The process id written in a pid file, or None when there is no usable file."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def status_from_results(results: dict[str, Any]) -> tuple[str, str]:
    """(status, note) from the status the engine wrote into results.json."""
    raw = str(results.get("status", ""))
    if raw == "done":
        return "done", ""
    if raw == "preempted":  # state saved on a signal: re-running continues it, like a killed run
        return "interrupted", "preempted; re-run to continue"
    if raw == "failed":
        return "failed", str(results.get("error", ""))
    return "failed", f"results.json status {raw!r}"


def summarize_run(folder: Path, root: Path, now: float, active_s: float = ACTIVE_S) -> Run:
    """Everything the summary shows about one run folder."""
    run = Run(path=folder.relative_to(root).as_posix() or ".")
    read_config(run, folder)
    results = read_results(run, folder)
    if results is not None and results.get("status") == "done":
        run.results = results  # results.json already holds the final and best values
    else:
        run.results = {**read_metrics(run, folder), **_numbers(results or {})}
    if results is not None and "status" in results:
        run.status, note = status_from_results(results)
    elif is_active(folder, now, active_s):
        run.status, note = "running", ""
    else:
        run.status = "interrupted"
        has_progress = (folder / "checkpoints").is_dir() or (folder / "metrics.jsonl").is_file()
        note = "" if has_progress else "no metrics or checkpoints"
    if note:
        run.notes.insert(0, note)
    return run


def _numbers(results: dict[str, Any]) -> dict[str, Any]:
    """The numeric entries of a results.json (used for runs that did not finish)."""
    return {k: v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _first_line(e: BaseException) -> str:
    """First line of an exception message, for one-line notes."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def summarize(root: Path, active_s: float = ACTIVE_S) -> list[dict[str, Any]]:
    """One row per run under root; override columns are the union over all runs."""
    now = time.time()
    runs = [summarize_run(folder, root, now, active_s) for folder in find_runs(root)]
    keys = sorted({k for run in runs for k in run.changed})
    rows = [run.row(keys) for run in runs]
    if rows and not any(row["config"] for row in rows):
        for row in rows:
            del row["config"]
    return rows


def sort_rows(rows: list[dict[str, Any]], key: str = DEFAULT_SORT, descending: bool = True) -> list[dict]:
    """Rows sorted by one column: numbers, then text, then empty cells (always last); ties keep run order."""
    def is_number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    numbers = [r for r in rows if is_number(r.get(key))]
    empty = [r for r in rows if r.get(key) is None or r.get(key) == ""]
    text = [r for r in rows if not is_number(r.get(key)) and r.get(key) not in (None, "")]
    return (sorted(numbers, key=lambda r: r[key], reverse=descending)
            + sorted(text, key=lambda r: str(r[key]), reverse=descending) + empty)


def best_index(rows: list[dict[str, Any]], key: str = DEFAULT_SORT) -> int | None:
    """Index of the row with the highest value of key (the best run), or None when none has one."""
    scored = [(row[key], i) for i, row in enumerate(rows) if isinstance(row.get(key), (int, float))]
    return max(scored, key=lambda t: (t[0], -t[1]))[1] if scored else None


def format_value(value: Any) -> str:
    """Compact text for a table cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def to_markdown(rows: list[dict[str, Any]], best: int | None) -> str:
    """A markdown table; the best row gets a * in the first column and a bold run name."""
    if not rows:
        return ""
    columns = list(rows[0])
    lines = ["|   | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for i, row in enumerate(rows):
        cells = [format_value(row[c]).replace("|", "\\|") for c in columns]
        if i == best:
            cells[0] = f"**{cells[0]}**"
        lines.append(f"| {'*' if i == best else ' '} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict[str, Any]], best: int | None) -> str:
    """CSV with a header line, raw values and a best column (1 for the best run)."""
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    columns = list(rows[0])
    writer.writerow([*columns, "best"])
    for i, row in enumerate(rows):
        cells = [json.dumps(v) if isinstance(v, (list, bool)) else ("" if v is None else v)
                 for v in (row[c] for c in columns)]
        writer.writerow([*cells, int(i == best)])
    return buffer.getvalue()
