"""ROOT/report.html: a search's study on one self-contained page (inline SVG, no script, no server; opens from disk).

The metric against each sampled key (log keys on a log axis, choices as columns; the colour is the rung reached),
the distribution of the metric at each rung (pycls's sweep_analyze EDF: the fraction of trials at or better than a
value), the rung table, and the best trials' curves (their metric at each evaluation, from metrics.jsonl).
"""
from __future__ import annotations

import html
import math
import os

import optuna
from optuna.trial import FrozenTrial

from runner.fsutil import atomic_write
from runner.rundir import reader
from runner.sweep import asha
from runner.sweep.search import Search
from runner.sweep.table import STATES, best, best_line, ordered, render

REPORT = "report.html"
W, H, PAD = 360, 220, 40  # one chart's size and its margin (pixels)
COLOURS = ("#9e9e9e", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
BEST_CURVES = 5
STYLE = ("body{font-family:sans-serif;margin:2em}svg{border:1px solid #ddd;margin:4px}"
         "pre{background:#f6f6f6;padding:1em}.charts{display:flex;flex-wrap:wrap}")


def write_report(search: Search, study: optuna.Study) -> str:
    """Write ROOT/report.html (atomically) and return its path."""
    trials = study.get_trials(deepcopy=False)
    top = best(search, trials)  # the table's answer, and summarize's: one best
    answer = best_line(search, top) if top is not None else "no trial has trained to the full length yet"
    parts = [f"<h1>Search {html.escape(os.path.basename(search.sweep.path))}</h1>",
             f"<p>{search.metric} ({search.mode}); rungs at epochs {list(search.rungs)}; eta {search.eta}; "
             f"{len(trials)} of {search.trials} trials. Colour: the rung reached. States: "
             f"{html.escape(', '.join(STATES))}.</p>", f"<pre>{html.escape(answer)}</pre>",
             "<h2>The metric against each sampled key</h2>", _div([_by_key(search, trials, k) for k in search.space]),
             "<h2>Distribution of the metric at each rung (EDF)</h2>", _div([_edf(search, trials)]),
             "<h2>The best trials' curves</h2>", _div([_curves(search, trials)]),
             f"<h2>Trials</h2><pre>{html.escape(render(search, study))}</pre>"]
    page = f"<!doctype html><meta charset=utf-8><title>search</title><style>{STYLE}</style>{''.join(parts)}\n"
    path = os.path.join(search.root, REPORT)
    atomic_write(path, page)
    return path


def _div(charts: list[str]) -> str:
    """Charts side by side."""
    return f"<div class=charts>{''.join(charts)}</div>"


def _value(search: Search, trial: FrozenTrial) -> tuple[int, float | None]:
    """(rung reached, the metric there; None when it has none or a non-finite one, which no chart can place)."""
    epoch = asha.reached(trial, search.rungs)
    value = trial.intermediate_values.get(epoch) if epoch else None
    return epoch, value if value is not None and math.isfinite(value) else None


def _by_key(search: Search, trials: list[FrozenTrial], key: str) -> str:
    """Scatter of the metric (at the rung reached) against one sampled key."""
    dim = search.space[key]
    points = [(t.params[key], *_value(search, t)) for t in trials if key in t.params]
    points = [(x, y, search.rungs.index(e)) for x, e, y in points if y is not None]
    if dim.kind == "choice":
        labels = [str(v) for v in _unique(p[0] for p in points)]
        xs = [labels.index(str(p[0])) for p in points]
        axis = Axis(-0.5, len(labels) - 0.5, False, labels)
    else:
        xs = [float(p[0]) for p in points]
        axis = Axis(float(dim.args[0]), float(dim.args[1]), dim.kind == "log")
    dots = [(x, y, COLOURS[(rung + 1) % len(COLOURS)]) for x, (_, y, rung) in zip(xs, points, strict=True)]
    return _chart(key, axis, _y_axis([p[1] for p in points]), dots, [])


def _edf(search: Search, trials: list[FrozenTrial]) -> str:
    """At each rung, the fraction of its trials whose metric is at least as good as x."""
    lines = []
    for i, epoch in enumerate(search.rungs):
        values = sorted((t.intermediate_values[epoch] for t in trials if epoch in t.intermediate_values
                         and math.isfinite(t.intermediate_values[epoch])), reverse=search.maximize)
        steps = [(v, (j + 1) / len(values)) for j, v in enumerate(values)]
        lines.append((f"epoch {epoch}", COLOURS[(i + 1) % len(COLOURS)], steps))
    every = [x for _, _, s in lines for x, _ in s]
    return _chart(f"EDF of {search.metric}", _y_axis(every), Axis(0.0, 1.0, False), [], lines)


def _curves(search: Search, trials: list[FrozenTrial]) -> str:
    """The metric at each evaluation of the best trials (the highest rungs first)."""
    lines = []
    for i, trial in enumerate(ordered(search, trials)[:BEST_CURVES]):
        metrics = reader.read_metrics(search.trial_dir(trial.number))
        rows = [r for r in (metrics.rows if metrics else [])
                if _finite(r.get(search.metric)) and _finite(r.get("epoch"))]
        lines.append((f"trial {trial.number}", COLOURS[(i + 1) % len(COLOURS)],
                      [(float(r["epoch"]), float(r[search.metric])) for r in rows]))
    every = [y for _, _, s in lines for _, y in s]
    return _chart(f"{search.metric} per epoch", Axis(0.0, float(search.rungs[-1]), False), _y_axis(every), [], lines)


class Axis:
    """A linear or log axis from lo to hi (with text labels for choices)."""

    def __init__(self, lo: float, hi: float, log: bool, labels: list[str] | None = None):
        self.log, self.labels = log, labels
        self.lo, self.hi = (math.log10(lo), math.log10(hi)) if log else (lo, hi)
        if self.hi <= self.lo:
            self.lo, self.hi = self.lo - 1.0, self.hi + 1.0

    def at(self, value: float, length: float) -> float:
        """The position of `value` along `length` pixels."""
        v = math.log10(value) if self.log else value
        return (v - self.lo) / (self.hi - self.lo) * length

    def ticks(self) -> list[tuple[float, str]]:
        """(value, text) of the axis's labels: each choice, or the ends and the middle."""
        if self.labels is not None:
            return [(float(i), text) for i, text in enumerate(self.labels)]
        values = [self.lo, (self.lo + self.hi) / 2, self.hi]
        return [(10**v if self.log else v, f"{10**v if self.log else v:.3g}") for v in values]


def _y_axis(values: list[float]) -> Axis:
    """A linear axis over `values` with a little room."""
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    room = (hi - lo) * 0.05 or 1.0
    return Axis(lo - room, hi + room, False)


def _chart(title: str, xa: Axis, ya: Axis, dots: list, lines: list) -> str:
    """One SVG chart: dots (x, y, colour) and lines (name, colour, [(x, y)])."""
    cw, ch = W - 2 * PAD, H - 2 * PAD

    def px(x: float, y: float) -> str:
        return f"{PAD + xa.at(x, cw):.1f},{H - PAD - ya.at(y, ch):.1f}"

    out = [f"<svg width={W} height={H} xmlns='http://www.w3.org/2000/svg' font-size=10>",
           f"<text x={PAD} y=14 font-size=12>{html.escape(title)}</text>"]
    out += [f"<text x={PAD + xa.at(v, cw):.1f} y={H - PAD + 14} text-anchor=middle>{html.escape(t)}</text>"
            for v, t in xa.ticks()]
    out += [f"<text x={PAD - 4} y={H - PAD - ya.at(v, ch):.1f} text-anchor=end>{html.escape(t)}</text>"
            for v, t in ya.ticks()]
    out += [f"<circle cx={px(x, y).split(',')[0]} cy={px(x, y).split(',')[1]} r=4 fill='{c}' opacity=0.8/>"
            for x, y, c in dots]
    for i, (name, colour, pts) in enumerate(lines):
        out.append(f"<polyline fill=none stroke='{colour}' points='{' '.join(px(x, y) for x, y in pts)}'/>")
        out.append(f"<text x={W - PAD} y={PAD + 12 * i} fill='{colour}' text-anchor=end>{html.escape(name)}</text>")
    return "".join(out) + "</svg>"


def _finite(value) -> bool:
    """A number a chart can place (not a bool, NaN or an infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _unique(values) -> list:
    """The values in first-seen order, each once."""
    seen: list = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen
