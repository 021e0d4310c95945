"""One table of every run under a folder: overridden keys, status and results (no torch import).

A search's trial folders (ROOT/trial_N beside ROOT/study.journal) are shown in the search's own words when the
caller hands `summarize` a reader of studies (tools/summarize.py passes runner/sweep/table.py's `trial_views`, which
imports Optuna only then): the search's state, the rung reached and the metric there, the search's order and its
best trial. Without one, a paused trial is "paused", never "interrupted; re-run".
"""
from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runner.config import flatten, get_default_config, same_value
from runner.config.derived import best_mode
from runner.csvsafe import csv_text
from runner.rundir import reader
from runner.rundir.layout import METRICS, RESULTS, RUN_JSON
from runner.rundir.marker import PAUSED, is_done
from runner.rundir.reader import ACTIVE_S, find_runs

# Keys that differ in every run by construction, so they never make a column
IGNORED_KEYS = {"OUTPUT_DIR"}
# best/*: the values of the best evaluation by CHECKPOINT.BEST_METRIC (by default the highest top-1; best/val/top5 is
# the top-5 at it)
RESULT_COLUMNS = ("status", "val/top1", "best/val/top1", "val/top5", "best/val/top5", "test/top1", "epoch",
                  "wall_s", "train/img_per_s", "note")
# a column only when some run has a value: test/top1 is best.pth's top-1 on DATA.TEST_SPLIT
OPTIONAL_COLUMNS = ("test/top1",)
DEFAULT_SORT = "best/val/top1"
_CONFIG_KEY = re.compile(r"^[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)*$")
# runner/sweep/study.py's JOURNAL and search.py's trial folders, spelled here too: those modules import Optuna and
# the config (tests/sweep/test_best_answer.py checks that the names agree)
STUDY_JOURNAL = "study.journal"
_TRIAL_FOLDER = re.compile(r"trial_[0-9]+")
RUNG = "rung"  # a search trial's columns: the rung (epoch) it reached and, as "rung/METRIC", its metric there

try:  # the C loader is several times faster on hundreds of config files
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader


class Row(dict):
    """One table row (column name to value) that knows whether its run's config could be read, and, for a search's
    trial, its place in the search's order and whether it is the search's best."""

    config_known: bool = True
    search: tuple[str, int] | None = None  # (search root, rank in the search's order)
    search_best: bool = False
    best_line: str = ""  # the search's best trial: its table's 'best: ...' line and command


@dataclass(frozen=True)
class TrialView:
    """What a search's study says of one trial folder (runner/sweep/table.py `trial_views`)."""

    state: str  # one of table.STATES: done, training, paused, stopped, failed, to resume, to start
    note: str  # what it waits for or why ("at epoch 1, not promoted")
    rung: int  # the highest rung (epoch) it reached, 0 before the first
    value: float | None  # its metric at that rung
    metric: str
    rank: int  # its place in the search's order (highest rung, then the metric there, then the trial number)
    best: bool  # the search's answer: trained to the full length, the best metric there
    best_line: str = ""  # for the best trial: the table's 'best: ...' line and the command that trains it again


# A reader of a search's study: ROOT -> trial folder name -> its view (raises when the study cannot be read)
StudyReader = Callable[[Path], dict[str, TrialView]]


@dataclass
class Run:
    """What one run folder says about itself."""

    path: str
    status: str = ""
    config: dict[str, Any] | None = None  # every key of config.yaml, flattened; None when unreadable
    results: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    view: TrialView | None = None  # a search's trial: what its study says
    search_root: str = ""

    def row(self, keys: list[str], search_columns: Sequence[str] = ()) -> Row:
        """Column name to value: run, the given override keys, then the result columns (the search's after status)."""
        values = {} if self.config is None else {**default_values(), **self.config}
        row = Row(run=self.path, **{k: values.get(k) for k in keys})
        for column in RESULT_COLUMNS:
            row[column] = self.results.get(column)
            if column == "status":
                row.update({c: None for c in search_columns})
        row.update(status=self.status, note="; ".join(self.notes))
        row.config_known = self.config is not None
        if self.view is not None:
            row.update({RUNG: self.view.rung or None, f"{RUNG}/{self.view.metric}": self.view.value})
            row.search, row.search_best = (self.search_root, self.view.rank), self.view.best
            row.best_line = self.view.best_line
        return row


@functools.cache
def default_values() -> dict[str, Any]:
    """The defaults of runner.config, flattened (computed once), tuples as lists as config.yaml reads back; an
    "auto" key as a run without pretrained weights stores it (so only weights' own values make a column)."""
    from runner.config.schema import AUTO_KEYS, is_auto

    flat = {k: AUTO_KEYS[k] if is_auto(k, v) else v for k, v in flatten(get_default_config()).items()}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}


def changed_keys(config: dict[str, Any]) -> dict[str, Any]:
    """Keys of a flattened config whose value differs from the defaults (unknown keys included)."""
    from runner.config.schema import is_auto

    defaults = default_values()
    return {k: v for k, v in sorted(config.items()) if k not in IGNORED_KEYS and not is_auto(k, v)
            and (k not in defaults or not same_value(defaults[k], v))}


def read_config(run: Run, folder: Path) -> None:
    """Fill the run's config from config.yaml; an unreadable file becomes a note."""
    try:
        text = reader.config_text(folder)
        config = yaml.load(text, Loader=_Loader)
        if not isinstance(config, dict):
            raise ValueError("not a mapping of keys")
    except FileNotFoundError:
        run.notes.append("no config.yaml")
        return
    except (OSError, yaml.YAMLError, ValueError) as e:
        run.notes.append(f"config.yaml unreadable ({_first_line(e)})")
        return
    run.config = flatten(config)


def read_metrics(run: Run, folder: Path) -> dict[str, Any]:
    """Final/best val metrics, epoch and img/s from metrics.jsonl; bad lines are skipped and noted."""
    found = reader.read_metrics(folder)
    if found is None:
        return {}
    out: dict[str, Any] = {}
    config = run.config or {}
    metric = config.get("CHECKPOINT.BEST_METRIC", "val/top1")
    mode = best_mode(metric, config.get("CHECKPOINT.BEST_MODE", "auto"))
    for record in found.rows:
        _fold_metrics(out, record, metric, mode)
    out.pop("_best", None)
    speeds = out.pop("_img_per_s", None)
    if speeds:
        out["train/img_per_s"] = sum(speeds) / len(speeds)
    bad = found.bad
    if bad == [found.lines]:
        run.notes.append(f"partial last line of {METRICS} ignored")
    elif bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        run.notes.append(f"{METRICS}: {len(bad)} unreadable line(s) skipped (line {shown})")
    return out


def _fold_metrics(out: dict[str, Any], record: dict[str, Any], metric: str = "val/top1", mode: str = "max") -> None:
    """Update the final and best val metrics, the epoch and the img/s sum with one metrics.jsonl record.

    As results.json has them: best/val/top1 and best/val/top5 those of the best evaluation by `metric` in `mode`
    (CHECKPOINT.BEST_METRIC; the first of equal ones), by default the highest top-1 and the top-5 at it.
    """
    for key in ("val/top1", "val/top5"):
        value = record.get(key)
        if _is_number(value):
            out[key] = value
            if _is_number(record.get("epoch")):
                out["epoch"] = record["epoch"]  # evaluations come at epoch ends: epochs done
    value, ref = record.get(metric), out.get("_best")
    if is_finite(value) and (ref is None or (value > ref if mode == "max" else value < ref)):
        out["_best"] = value
        for key in ("val/top1", "val/top5"):
            out[f"best/{key}"] = record.get(key) if _is_number(record.get(key)) else None
    if _is_number(record.get("train/img_per_s")):
        out["_img_per_s"] = [*out.get("_img_per_s", []), record["train/img_per_s"]]


def _is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite(value: Any) -> bool:
    """A number that is neither NaN nor infinite (JSON's NaN and Infinity read back as such floats)."""
    return _is_number(value) and math.isfinite(value)


def read_json(run: Run, folder: Path, name: str) -> dict[str, Any] | None:
    """A JSON object file of the run, or None when missing; an unreadable one becomes a note."""
    obj, why = reader.read_object(folder, name)
    if why:
        run.notes.append(f"{name} unreadable ({why})")
    return obj


def summarize_run(folder: Path, root: Path, now: float, active_s: float = ACTIVE_S,
                  view: TrialView | None = None) -> Run:
    """Everything the summary shows about one run folder (a search's trial: in the search's words, `view`)."""
    run = Run(path=folder.relative_to(root).as_posix() or ".")
    results = read_json(run, folder, RESULTS)
    read_config(run, folder)
    state = read_json(run, folder, RUN_JSON)
    if is_done(results):
        run.status, note = "done", ""
        run.results = results  # the final and best values, without reading metrics.jsonl
    elif reader.stopped_in_setup(folder, state):
        run.status, note = reader.SETUP_FAILED
    else:
        run.status, note = reader.unfinished_state(folder, state, now, active_s)
        run.results = read_metrics(run, folder)
    if view is not None:
        run.status, note, run.view, run.search_root = view.state, view.note, view, str(folder.parent)
    elif search_root(folder) is not None and (state or {}).get("status") == PAUSED and run.status == "interrupted":
        # its study was not read: the search, not a re-run of the trial's command, decides whether it goes on
        run.status, note = "paused", "a search's trial, paused at a rung: the search decides whether it goes on"
    if note:
        run.notes.insert(0, note)
    return run


def search_root(folder: Path) -> Path | None:
    """The search whose trial `folder` is (ROOT/trial_N beside ROOT/study.journal), or None."""
    parent = folder.parent
    return parent if _TRIAL_FOLDER.fullmatch(folder.name) and (parent / STUDY_JOURNAL).is_file() else None


def trial_views(folders: list[Path], studies: StudyReader | None) -> tuple[dict[Path, TrialView], dict[Path, str]]:
    """(each search trial folder's view, each search whose study could not be read -> why), one read per study."""
    views: dict[Path, TrialView] = {}
    unread: dict[Path, str] = {}
    read: dict[Path, dict[str, TrialView]] = {}
    for folder in folders:
        root = search_root(folder)
        if root is None or studies is None or root in unread:
            continue
        if root not in read:
            try:
                read[root] = studies(root)
            except Exception as e:  # a damaged or foreign journal: its trials are shown as plain runs, with why
                unread[root] = f"{STUDY_JOURNAL} unreadable ({_first_line(e)}): shown as a plain run"
                continue
        if folder.name in read[root]:
            views[folder] = read[root][folder.name]
    return views, unread


def _first_line(e: BaseException) -> str:
    """First line of an exception message, for one-line notes."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def summarize(root: Path, active_s: float = ACTIVE_S, studies: StudyReader | None = None) -> list[dict[str, Any]]:
    """One row per run under root; override columns are the union over all runs (`studies`: see the module)."""
    now = time.time()
    folders = find_runs(root)
    views, unread = trial_views(folders, studies)
    runs = [summarize_run(folder, root, now, active_s, views.get(folder)) for folder in folders]
    for folder, run in zip(folders, runs, strict=True):
        if search_root(folder) in unread:
            run.notes.append(unread[search_root(folder)])
    # a key that one run changed becomes a column, with every run's value in it (the default included)
    keys = sorted({k for run in runs if run.config is not None for k in changed_keys(run.config)})
    search_columns = sorted({c for run in runs if run.view for c in (RUNG, f"{RUNG}/{run.view.metric}")},
                            key=lambda c: (c != RUNG, c))
    rows = [run.row(keys, search_columns) for run in runs]
    for column in OPTIONAL_COLUMNS:
        if all(row[column] is None for row in rows):
            for row in rows:
                del row[column]
    return rows


def sort_rows(rows: list[dict[str, Any]], key: str | None = DEFAULT_SORT, descending: bool = True) -> list[dict]:
    """Rows sorted by one column: finite numbers, then NaN and infinities, then text, then empty cells (always
    last); ties keep run order. `key` None: a search's trials in the search's order (its table's), then the rest
    by DEFAULT_SORT."""
    if key is None:
        trials = sorted((r for r in rows if getattr(r, "search", None)), key=lambda r: r.search)
        return trials + sort_rows([r for r in rows if not getattr(r, "search", None)], DEFAULT_SORT, descending)
    numbers = [r for r in rows if is_finite(r.get(key))]
    odd = [r for r in rows if _is_number(r.get(key)) and not is_finite(r.get(key))]
    empty = [r for r in rows if r.get(key) is None or r.get(key) == ""]
    text = [r for r in rows if not _is_number(r.get(key)) and r.get(key) not in (None, "")]
    return (sorted(numbers, key=lambda r: r[key], reverse=descending) + odd
            + sorted(text, key=lambda r: str(r[key]), reverse=descending) + empty)


def best_index(rows: list[dict[str, Any]], key: str = DEFAULT_SORT) -> int | None:
    """Index of the best run's row, or None: a search's own best trial where the rows hold a search (the first such
    row); else the highest finite value of `key` (NaN and infinities never win), a tie going to the run whose
    folder comes first (numbers in its name compared as numbers: trial_2 before trial_10), whatever the order."""
    searched = [i for i, row in enumerate(rows) if getattr(row, "search_best", False)]
    if searched:
        return searched[0]
    scored = [(row[key], natural_key(str(row.get("run", ""))), i) for i, row in enumerate(rows)
              if is_finite(row.get(key))]
    return min(scored, key=lambda t: (-t[0], t[1]))[2] if scored else None


def natural_key(name: str) -> list:
    """A folder name as text and numbers, so that trial_2 comes before trial_10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"([0-9]+)", name) if part]


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


def constant_keys(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Config-key columns with one value in every row whose config is known (when there are several such rows).

    A run whose config.yaml cannot be read has no values, not other values: it must not turn every key that
    the sweep never varied into a column.
    """
    known = [row for row in rows if getattr(row, "config_known", True)]
    if len(known) < 2:
        return {}
    return {c: known[0][c] for c in known[0]
            if _CONFIG_KEY.match(c) and all(row[c] == known[0][c] for row in known)}


def to_markdown(rows: list[dict[str, Any]], best: int | None) -> str:
    """A markdown table of the keys that vary; the best row gets a * and a bold run name.

    Keys set to the same value in every run go in one line above the table, so a sweep's table shows
    exactly the swept keys.
    """
    if not rows:
        return ""
    same = constant_keys(rows)
    columns = [c for c in rows[0] if c not in same]
    label = "Same in every run" if all(getattr(r, "config_known", True) for r in rows) else (
        "Same in every run whose config could be read")
    lines = [f"{label}: {', '.join(f'{k}={format_value(v)}' for k, v in same.items())}", ""] if same else []
    lines += ["|   | " + " | ".join(map(_md_cell, columns)) + " |", "|---|" + "---|" * len(columns)]
    for i, row in enumerate(rows):
        cells = [_md_cell(format_value(row[c])) for c in columns]
        if i == best:
            cells[0] = f"**{cells[0]}**"
        lines.append(f"| {'*' if i == best else ' '} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    """Text that stays inside one markdown table cell: | escaped, line breaks made spaces."""
    return " ".join(text.replace("|", "\\|").splitlines())


def to_csv(rows: list[dict[str, Any]], best: int | None) -> str:
    """CSV with a header line, raw values and a best column (1 for the best run); spreadsheet-safe text."""
    if not rows:
        return ""
    columns = list(rows[0])
    lines = [[*columns, "best"]]
    for i, row in enumerate(rows):
        cells = [_csv_cell(row[c]) for c in columns]
        lines.append([*cells, int(i == best)])
    return csv_text(lines)  # a run's name, note or string value that looks like a formula stays text


def _csv_cell(value: Any) -> Any:
    """A value as to_csv writes it: lists and booleans as JSON, None empty, NaN and infinities as text (so that
    csv_text quotes -inf, which a spreadsheet would read as a formula), numbers and text as they are."""
    if isinstance(value, (list, bool)):
        return json.dumps(value)
    if _is_number(value) and not is_finite(value):
        return str(value)
    return "" if value is None else value
