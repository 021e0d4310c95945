"""ROOT/report.html: a search's study on one self-contained page (inline SVG and CSS, no script, no network; it opens
from disk).

Every chart has axis titles (with the metric's unit), a legend where colour or line width means something, and
each point and line named on hover (an SVG <title>: the trial, its sampled values, its metric and the rung):
- the best trial and the trials' table, in the words of runner/sweep/table.py (one answer and one vocabulary of
  states for the table, this page and tools/summarize.py);
- the metric at the rung each trial reached against each sampled key: a log range on a log axis, choices as
  columns, the colour the rung reached, the best trial ringed;
- parallel coordinates over the space: one line per trial through one axis per searched key and the metric's,
  coloured by the metric, thick where the trial trained to the full length;
- the EDF at each rung (pycls's sweep_analyze): the fraction of the rung's trials whose metric is at or below x,
  rising from 0 to 1;
- the rung table (trials recorded, gone on, best and median at each rung) and the best trials' curves (their
  metric at each evaluation, from metrics.jsonl).
The metric's axis keeps to the metric's range: top1/top5 within [0, 100] (%), a loss from 0.
"""
from __future__ import annotations

import functools
import html
import math
import os
import statistics
import time
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from runner.fsutil import atomic_write
from runner.rundir import reader
from runner.sweep import asha, table
from runner.sweep.search import Search, stored
from runner.sweep.worker import live

REPORT = "report.html"
W, H = 480, 300  # one chart's size (pixels)
LEFT, RIGHT, TOP, BOTTOM = 64, 150, 30, 48  # its margins: tick labels and axis titles, the legend on the right
AXIS_GAP = 130  # between two axes of the parallel coordinates
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
VIRIDIS = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")  # worse to better, readable in grey too
BEST_CURVES = 5
SVG_NS = "http://www.w3.org/2000/svg"
HALO = 'stroke="#fff" stroke-width="3" paint-order="stroke"'  # text readable over the lines that cross it
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px}svg{border:1px solid #ddd;margin:4px;"
         "font-family:sans-serif}pre{background:#f6f6f6;padding:1em;overflow-x:auto}.charts{display:flex;"
         "flex-wrap:wrap}p.note{color:#555;max-width:60em}table{border-collapse:collapse}td,th{border:1px solid "
         "#ccc;padding:2px 8px;text-align:right}circle:hover{stroke:#000;stroke-width:2}"
         ".parallel polyline:hover{stroke:#d62728;stroke-width:4;stroke-opacity:1}")


def write_report(search: Search, study: optuna.Study) -> str:
    """Write ROOT/report.html (atomically) and return its path."""
    trials = study.get_trials(deepcopy=False)
    top = table.best(search, trials)  # the table's answer, and summarize's: one best
    marks = _marks(search, trials)
    answer = table.best_line(search, top) if top is not None else "no trial has trained to the full length yet"
    better, name = "higher" if search.maximize else "lower", _esc(os.path.basename(search.sweep.path))
    parts = [f"<h1>Search {name}</h1>",
             f"<p>{_esc(search.metric)} ({search.mode}: {better} is better); scheduler {_esc(search.scheduler)}; "
             f"rungs at epochs {list(search.rungs)}; eta {search.eta}; {len(trials)} of {search.trials} trials. "
             f"States: {_esc(', '.join(table.STATES))}. Hover a point or a line to see its trial.</p>",
             f"<pre>{_esc(answer)}</pre>",
             "<h2>The metric against each sampled key</h2>",
             f"<p class=note>Each point is a trial at the highest rung it reached; colour: that rung. "
             f"{better.capitalize()} is better; the best trial is ringed.</p>",
             _div([_by_key(search, marks, key, top) for key in search.space]),
             "<h2>Parallel coordinates over the space</h2>",
             "<p class=note>One line per trial with a value, through each searched key's axis and the metric's; "
             "colour: the metric at the rung reached; thick: trained to the full length.</p>",
             _div([_parallel(search, marks)]),
             "<h2>EDF of the metric at each rung</h2>",
             f"<p class=note>The fraction of a rung's trials whose {_esc(search.metric)} is at or below x (it rises "
             f"from 0 to 1); a curve further {'right' if search.maximize else 'left'} is a better rung.</p>",
             _div([_edf(search, trials)]), "<h2>The rungs</h2>", _rung_table(search, trials),
             "<h2>The best trials' curves</h2>", _div([_curves(search, trials, marks)]),
             f"<h2>Trials</h2><pre>{_esc(table.render(search, study))}</pre>"]
    page = f"<!doctype html><meta charset=utf-8><title>search {name}</title><style>{STYLE}</style>{''.join(parts)}\n"
    path = os.path.join(search.root, REPORT)
    atomic_write(path, page)
    return path


# ---------------------------------------------------------------------------------------------------------------
# The trials as the charts show them
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """One trial on the charts: its sampled values, the rung it reached, its metric there, its hover text."""

    number: int
    params: dict
    epoch: int  # the highest rung reached (0: none yet)
    value: float | None  # the metric there; None when it has none or a non-finite one (no chart can place it)
    label: str


def _marks(search: Search, trials: list[FrozenTrial]) -> list[Mark]:
    """Each trial's mark, its state in the table's words (table.py decides them)."""
    is_live = functools.partial(live, search, now=time.time())
    ended = table.ended_with_budget(search, trials, is_live)
    out = []
    for trial in trials:
        epoch, value = table.rung_value(search, trial)
        value = value if _finite(value) else None
        state = table.state_text(*table.trial_state(trial, search.rungs, is_live, ended))
        out.append(Mark(trial.number, dict(trial.params), epoch, value,
                        _label(search, trial.number, trial.params, epoch, value, state)))
    return out


def _label(search: Search, number: int, params: dict, epoch: int, value: float | None, state: str) -> str:
    """'trial 3: TRAIN.LR=0.001; val/top1 91.20 at epoch 3 (rung 2 of 2); done': a trial's hover text."""
    keys = ", ".join(f"{k}={_text(params[k])}" for k in search.space if k in params)
    if value is None:
        where = f"no {search.metric} yet" if not epoch else f"no finite {search.metric} at epoch {epoch}"
    else:
        where = (f"{search.metric} {value:.4f}{_unit(search.metric)} at epoch {epoch} "
                 f"(rung {search.rungs.index(epoch) + 1} of {len(search.rungs)})")
    return f"trial {number}: {keys or 'no values yet'}; {where}; {state}"


def _placed(marks: list[Mark]) -> list[Mark]:
    """The marks with a value to place."""
    return [m for m in marks if m.value is not None]


# ---------------------------------------------------------------------------------------------------------------
# Axes
# ---------------------------------------------------------------------------------------------------------------
class Axis:
    """An axis from lo to hi (a log10 scale when `log`; a choice axis places its labels at 0, 1, ...), its title and
    its ticks (value, text)."""

    def __init__(self, lo: float, hi: float, title: str, ticks: list[tuple[float, str]], log: bool = False,
                 labels: list[str] | None = None):
        self.lo, self.hi, self.title, self.ticks, self.log, self.labels = lo, hi, title, ticks, log, labels

    def at(self, value: float) -> float:
        """Where `value` lies from lo (0) to hi (1)."""
        if self.log:
            lo, hi, value = math.log10(self.lo), math.log10(self.hi), math.log10(value)
        else:
            lo, hi = self.lo, self.hi
        return (value - lo) / (hi - lo) if hi > lo else 0.5

    def place(self, raw) -> float | None:
        """A sampled value's place on this axis (a choice: its column; None: not a value of this axis)."""
        if self.labels is not None:
            return float(self.labels.index(str(raw))) if str(raw) in self.labels else None
        if not _finite(raw) or (self.log and raw <= 0):
            return None
        return float(raw)


def _bounds(metric: str) -> tuple[float | None, float | None, str]:
    """(the lowest and highest value the metric can take, its unit): top1/top5 in [0, 100] %, a loss from 0."""
    name = metric.rsplit("/", 1)[-1]
    if name in ("top1", "top5"):
        return 0.0, 100.0, "%"
    return (0.0, None, "") if name == "loss" else (None, None, "")


def _unit(metric: str) -> str:
    """The metric's unit as a suffix ('%' or '')."""
    return _bounds(metric)[2]


def _metric_title(metric: str, extra: str = "") -> str:
    """'val/top1 (%)' and what follows."""
    unit = _unit(metric)
    return f"{metric}{f' ({unit})' if unit else ''}{extra}"


def _metric_axis(metric: str, values: list[float], title: str) -> Axis:
    """A linear axis over `values` with a little room, kept within the metric's bounds (a loss from 0)."""
    low, high, _ = _bounds(metric)
    if values:
        lo, hi = min(values), max(values)
        room = (hi - lo) * 0.08 or max(abs(hi) * 0.05, 0.5)
        lo, hi = lo - room, hi + room
    else:
        lo, hi = 0.0, 100.0 if high is not None else 1.0
    if metric.endswith("loss"):
        lo = 0.0
    # the bounds never cut a value off (a metric outside them would be a bug elsewhere, shown as it is)
    floor = None if low is None else min([low, *values])
    ceiling = None if high is None else max([high, *values])
    lo, hi, step = _nice(*_clamp(lo, hi, floor, ceiling))
    lo, hi = _clamp(lo, hi, floor, ceiling)
    return Axis(lo, hi, title, _linear_ticks(lo, hi, step))


def _clamp(lo: float, hi: float, floor: float | None, ceiling: float | None) -> tuple[float, float]:
    """(lo, hi) kept within [floor, ceiling] (None: unbounded on that side)."""
    return (lo if floor is None else max(lo, floor)), (hi if ceiling is None else min(hi, ceiling))


def _nice(lo: float, hi: float, count: int = 5) -> tuple[float, float, float]:
    """(lo, hi, step): the range widened to whole steps of 1, 2 or 5 times a power of ten, about `count` of them."""
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    raw = (hi - lo) / count
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if raw <= m * mag * (1 + 1e-9))
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step, step


def _linear_ticks(lo: float, hi: float, step: float) -> list[tuple[float, str]]:
    """The whole multiples of `step` from lo to hi, written with the digits the step needs."""
    digits = max(0, -math.floor(math.log10(step) + 1e-9))
    first = math.ceil(lo / step - 1e-9)
    values = [k * step for k in range(first, math.floor(hi / step + 1e-9) + 1)]
    return [(v, f"{v:.{digits}f}") for v in values]


def _key_axis(search: Search, key: str) -> Axis:
    """A searched key's axis over its whole range: log for a log range, one column per choice."""
    dim = search.space[key]
    if dim.kind == "choice":
        labels = [str(stored(dim, v)) for v in dim.args]
        return Axis(-0.5, len(labels) - 0.5, f"{key} (choice)", [(float(i), _short(t)) for i, t in enumerate(labels)],
                    labels=labels)
    lo, hi = float(dim.args[0]), float(dim.args[1])
    if dim.kind == "log":
        return Axis(lo, hi, f"{key} (log scale)", _log_ticks(lo, hi), log=True)
    step = _nice(lo, hi)[2]
    if dim.kind == "int":
        step = max(step, 1.0)
    return Axis(lo, hi, key, _linear_ticks(lo, hi, step))


def _log_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """The powers of ten from lo to hi (at most 6 of them), or the ends and the middle of a range within a decade."""
    first, last = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
    powers = list(range(first, last + 1))
    powers = powers[:: math.ceil(len(powers) / 6)] if powers else []
    if len(powers) >= 2:
        return [(10.0**k, f"{10.0**k:g}") for k in powers]
    return [(v, f"{v:.3g}") for v in (lo, math.sqrt(lo * hi), hi)]


# ---------------------------------------------------------------------------------------------------------------
# Charts
# ---------------------------------------------------------------------------------------------------------------
class Plot:
    """A chart with an x and a y axis: pixels from values, the frame, its ticks and its axis titles."""

    def __init__(self, xa: Axis, ya: Axis, width: int = W, height: int = H):
        self.xa, self.ya, self.width, self.height = xa, ya, width, height

    def x(self, value: float) -> float:
        """The pixel column of an x value."""
        return LEFT + self.xa.at(value) * (self.width - LEFT - RIGHT)

    def y(self, value: float) -> float:
        """The pixel row of a y value."""
        return self.height - BOTTOM - self.ya.at(value) * (self.height - TOP - BOTTOM)

    def frame(self) -> list[str]:
        """Axis lines, grid, ticks and the axis titles."""
        x0, x1, y0, y1 = LEFT, self.width - RIGHT, self.height - BOTTOM, TOP
        out = [f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" stroke="#999"/>']
        for v, text in self.xa.ticks:
            px = self.x(v)
            out.append(f'<line x1="{px:.1f}" y1="{y0}" x2="{px:.1f}" y2="{y0 + 4}" stroke="#999"/>'
                       f'<text class="xtick" x="{px:.1f}" y="{y0 + 15}" text-anchor="middle">{_esc(text)}</text>')
        for v, text in self.ya.ticks:
            py = self.y(v)
            out.append(f'<line x1="{x0}" y1="{py:.1f}" x2="{x1}" y2="{py:.1f}" stroke="#eee"/>'
                       f'<text class="ytick" x="{x0 - 5}" y="{py + 3:.1f}" text-anchor="end">{_esc(text)}</text>')
        out.append(f'<text class="xtitle" x="{(x0 + x1) / 2:.1f}" y="{self.height - 10}" text-anchor="middle" '
                   f'font-size="11">{_esc(self.xa.title)}</text>')
        out.append(f'<text class="ytitle" transform="translate(14,{(y0 + y1) / 2:.1f}) rotate(-90)" '
                   f'text-anchor="middle" font-size="11">{_esc(self.ya.title)}</text>')
        return out


def _svg(kind: str, title: str, body: list[str], legend: list[tuple[str, str, str]], width: int = W,
         height: int = H, empty: str = "") -> str:
    """One chart: its title, its body, its legend (kind, colour, text) on the right, and a note when empty."""
    out = [f'<svg class="chart {kind}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'xmlns="{SVG_NS}" font-size="10" role="img" aria-label="{_esc(title)}">',
           f'<text class="title" x="{LEFT}" y="16" font-size="12" font-weight="bold">{_esc(title)}</text>', *body]
    if empty:
        out.append(f'<text x="{(LEFT + width - RIGHT) / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" '
                   f'fill="#777">{_esc(empty)}</text>')
    out += _legend(legend, width - RIGHT + 12)
    return "".join(out) + "</svg>"


def _legend(items: list[tuple[str, str, str]], x: int) -> list[str]:
    """The legend: per item a swatch (dot, ring, line, thick, thin or dash) in its colour and its text."""
    out = [f'<g class="legend"><text x="{x}" y="{TOP + 2}" font-weight="bold">legend</text>'] if items else []
    for i, (kind, colour, text) in enumerate(items):
        y = TOP + 18 + 15 * i
        if kind in ("dot", "ring"):
            fill, stroke = ("none", "#000") if kind == "ring" else (colour, "none")
            out.append(f'<circle cx="{x + 6}" cy="{y - 3}" r="4" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>')
        else:
            width = {"thick": 3, "thin": 1}.get(kind, 2)
            dash = ' stroke-dasharray="3,3"' if kind == "dash" else ""
            out.append(f'<line x1="{x}" y1="{y - 3}" x2="{x + 14}" y2="{y - 3}" stroke="{colour}" '
                       f'stroke-width="{width}"{dash}/>')
        out.append(f'<text x="{x + 20}" y="{y}">{_esc(text)}</text>')
    return out + ["</g>"] if items else out


def _dot(x: float, y: float, colour: str, label: str, r: float = 4, ring: bool = False) -> str:
    """A point named on hover (its <title>)."""
    stroke = ' stroke="#000" stroke-width="2"' if ring else ""
    return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}" fill-opacity="0.85"{stroke}>'
            f"<title>{_esc(label)}</title></circle>")


def _line(points: list[tuple[float, float]], colour: str, label: str, width: float = 1.5, extra: str = "") -> str:
    """A polyline named on hover (its <title>)."""
    text = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return (f'<polyline fill="none" stroke="{colour}" stroke-width="{width}" points="{text}"{extra}>'
            f"<title>{_esc(label)}</title></polyline>")


def _rung_colour(search: Search, epoch: int) -> str:
    """The colour of a rung (by its place among the rungs)."""
    return COLOURS[search.rungs.index(epoch) % len(COLOURS)]


def _rung_name(search: Search, epoch: int) -> str:
    """'epoch 3' ('epoch 9 (full length)' for the last rung)."""
    return f"epoch {epoch}{' (full length)' if epoch == search.rungs[-1] else ''}"


def _by_key(search: Search, marks: list[Mark], key: str, top: FrozenTrial | None) -> str:
    """Scatter of the metric (at the rung reached) against one sampled key; the colour is the rung."""
    xa = _key_axis(search, key)
    points = [(xa.place(m.params.get(key)), m) for m in _placed(marks) if key in m.params]
    points = [(x, m) for x, m in points if x is not None]
    plot = Plot(xa, _metric_axis(search.metric, [m.value for _, m in points],
                                 _metric_title(search.metric, " at the rung reached")))
    body = plot.frame() + [_dot(plot.x(x), plot.y(m.value), _rung_colour(search, m.epoch), m.label,
                                ring=top is not None and m.number == top.number) for x, m in points]
    legend = [("dot", _rung_colour(search, e), _rung_name(search, e)) for e in search.rungs]
    legend += [("ring", "#000", f"best: trial {top.number}")] if top is not None else []
    return _svg("scatter", f"{search.metric} against {key}", body, legend,
                empty="" if points else "no trial has a value yet")


def _edf(search: Search, trials: list[FrozenTrial]) -> str:
    """At each rung, the fraction of its trials whose metric is at or below x: a step line rising from 0 to 1."""
    by_rung = {epoch: sorted((t.intermediate_values[epoch], t.number) for t in trials
                             if _finite(t.intermediate_values.get(epoch))) for epoch in search.rungs}
    every = [v for values in by_rung.values() for v, _ in values]
    fraction = Axis(0.0, 1.0, "fraction of the rung's trials ≤ x", [(q, f"{q:g}") for q in (0, .25, .5, .75, 1)])
    plot = Plot(_metric_axis(search.metric, every, "x: " + _metric_title(search.metric)), fraction)
    body, legend = plot.frame(), []
    for epoch, values in by_rung.items():
        if not values:
            continue
        colour, n = _rung_colour(search, epoch), len(values)
        steps = [(plot.x(plot.xa.lo), plot.y(0.0))]
        for j, (v, _) in enumerate(values):
            steps += [(plot.x(v), plot.y(j / n)), (plot.x(v), plot.y((j + 1) / n))]
        steps.append((plot.x(plot.xa.hi), plot.y(1.0)))
        body.append(_line(steps, colour, f"epoch {epoch}: {n} trials", width=2))
        body += [_dot(plot.x(v), plot.y((j + 1) / n), colour, f"trial {number}: {search.metric} {v:.4f}"
                      f"{_unit(search.metric)} at epoch {epoch}; {j + 1} of {n} at or below", r=3)
                 for j, (v, number) in enumerate(values)]
        legend.append(("line", colour, f"epoch {epoch} ({n} trial{'s' if n > 1 else ''})"))
    return _svg("edf", f"EDF of {search.metric} at each rung", body, legend,
                empty="" if every else "no trial has a value yet")


def _parallel(search: Search, marks: list[Mark]) -> str:
    """Parallel coordinates: one vertical axis per searched key, then the metric's; one line per trial with a value,
    coloured by its metric (at the rung reached), thick when it trained to the full length."""
    placed = _placed(marks)
    axes = [_key_axis(search, key) for key in search.space]
    axes.append(_metric_axis(search.metric, [m.value for m in placed], _metric_title(search.metric)))
    width = _axis_x(len(axes) - 1) + 20 + RIGHT  # the legend starts 32 px right of the last axis
    lines, scale = _parallel_lines(search, placed, axes), _scale(search, [m.value for m in placed])
    legend = [("thick", "#555", "full length"), ("thin", "#555", "stopped earlier")]
    return _svg("parallel", f"Parallel coordinates: {len(search.space)} keys and {search.metric}",
                lines + _parallel_axes(axes) + scale, legend, width=width,
                empty="" if placed else "no trial has a value yet")


def _axis_x(i: int) -> float:
    """The pixel column of the parallel coordinates' axis i."""
    return LEFT + 40 + AXIS_GAP * i


def _axis_y(axis: Axis, value: float) -> float:
    """The pixel row of a value on a vertical axis of the parallel coordinates."""
    return H - BOTTOM - axis.at(value) * (H - TOP - BOTTOM)


def _parallel_axes(axes: list[Axis]) -> list[str]:
    """Each axis: its line, its ticks and its title below it."""
    out = []
    for i, axis in enumerate(axes):
        x = _axis_x(i)
        out.append(f'<g class="axis" data-title="{_esc(axis.title)}"><line x1="{x}" y1="{TOP}" x2="{x}" '
                   f'y2="{H - BOTTOM}" stroke="#666"/>')
        out += [f'<text class="tick" x="{x - 4}" y="{_axis_y(axis, v) + 3:.1f}" text-anchor="end" {HALO}>'
                f"{_esc(t)}</text>" for v, t in axis.ticks]
        out.append(f'<text class="atitle" x="{x}" y="{H - BOTTOM + 16 + 12 * (i % 2)}" text-anchor="middle" '
                   f'font-size="11">{_esc(axis.title)}</text></g>')
    return out


def _parallel_lines(search: Search, placed: list[Mark], axes: list[Axis]) -> list[str]:
    """One line per trial with a value, the worse drawn first (the better ones on top)."""
    values = [m.value for m in placed]
    lo, hi = min(values, default=0.0), max(values, default=0.0)
    out = []
    for m in sorted(placed, key=lambda m: m.value if search.maximize else -m.value):
        spots = [a.place(m.params.get(k)) for a, k in zip(axes[:-1], search.space, strict=True)] + [m.value]
        if any(s is None for s in spots):
            continue  # a value outside the space (not placeable): the scatter shows the rest
        points = [(_axis_x(i), _axis_y(a, s)) for i, (a, s) in enumerate(zip(axes, spots, strict=True))]
        good = (m.value - lo) / (hi - lo) if hi > lo else 1.0
        out.append(_line(points, _viridis(good if search.maximize else 1.0 - good), m.label,
                         width=3 if m.epoch == search.rungs[-1] else 1.2, extra=' stroke-opacity="0.85"'))
    return out


def _scale(search: Search, values: list[float]) -> list[str]:
    """The colour scale of the parallel coordinates: a bar from the worst value (bottom) to the best (top)."""
    if not values:
        return []
    worst, top = (min(values), max(values)) if search.maximize else (max(values), min(values))
    x, y0, y1 = _axis_x(len(search.space)) + 32, TOP + 60, H - BOTTOM  # under the legend
    stops = "".join(f'<stop offset="{i / (len(VIRIDIS) - 1):g}" stop-color="{c}"/>' for i, c in enumerate(VIRIDIS))
    unit = _unit(search.metric)
    return [f'<defs><linearGradient id="metric-scale" x1="0" y1="1" x2="0" y2="0">{stops}</linearGradient></defs>',
            f'<g class="scale"><rect x="{x}" y="{y0}" width="12" height="{y1 - y0}" fill="url(#metric-scale)"/>',
            f'<text x="{x + 16}" y="{y0 + 8}">{top:.4g}{unit} (best)</text>',
            f'<text x="{x + 16}" y="{y1}">{worst:.4g}{unit} (worst)</text>',
            f'<text x="{x}" y="{y0 - 6}">colour: {_esc(search.metric)}</text></g>']


def _viridis(t: float) -> str:
    """The colour at t in [0, 1] of the viridis-like scale (0 worst, 1 best)."""
    t = min(max(t, 0.0), 1.0) * (len(VIRIDIS) - 1)
    i = min(int(t), len(VIRIDIS) - 2)
    a, b = (tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in VIRIDIS[i:i + 2])
    return "#" + "".join(f"{round(x + (y - x) * (t - i)):02x}" for x, y in zip(a, b, strict=True))


def _curves(search: Search, trials: list[FrozenTrial], marks: list[Mark]) -> str:
    """The metric at each evaluation of the best trials (the highest rungs first); dashed lines at the rungs."""
    labels = {m.number: m.label for m in marks}
    series = []
    for trial in table.ordered(search, trials)[:BEST_CURVES]:
        metrics = reader.read_metrics(search.trial_dir(trial.number))
        rows = [r for r in (metrics.rows if metrics else [])
                if _finite(r.get(search.metric)) and _finite(r.get("epoch"))]
        if rows:
            series.append((trial.number, [(float(r["epoch"]), float(r[search.metric])) for r in rows]))
    last = float(search.rungs[-1])
    xa = Axis(0.0, last, "epoch", [(float(e), str(e)) for e in (0, *search.rungs)])  # the rungs' epochs
    plot = Plot(xa, _metric_axis(search.metric, [y for _, pts in series for _, y in pts],
                                 _metric_title(search.metric, " at each evaluation")))
    body = plot.frame() + [f'<line x1="{plot.x(e):.1f}" y1="{TOP}" x2="{plot.x(e):.1f}" y2="{H - BOTTOM}" '
                           f'stroke="#bbb" stroke-dasharray="3,3"/>' for e in search.rungs]
    legend = []
    for i, (number, pts) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        body.append(_line([(plot.x(x), plot.y(y)) for x, y in pts], colour, labels[number], width=2))
        body += [_dot(plot.x(x), plot.y(y), colour, f"trial {number}, epoch {x:g}: {search.metric} {y:.4f}"
                      f"{_unit(search.metric)}", r=2.5) for x, y in pts]
        legend.append(("line", colour, f"trial {number}"))
    legend.append(("dash", "#bbb", "a rung"))
    return _svg("curves", f"{search.metric} per epoch, the best trials", body, legend,
                empty="" if series else "no evaluation logged yet")


# ---------------------------------------------------------------------------------------------------------------
# The rung table
# ---------------------------------------------------------------------------------------------------------------
def _rung_table(search: Search, trials: list[FrozenTrial]) -> str:
    """Per rung: the trials recorded there, how many went on to a later rung, the best and the median metric."""
    head = ("rung", "epoch", "trials recorded", "gone on", f"best {search.metric} (trial)", f"median {search.metric}")
    rows = []
    for k, epoch in enumerate(search.rungs):
        recorded = [t for t in trials if _finite(t.intermediate_values.get(epoch))]
        gone = sum(1 for t in recorded if asha.reached(t, search.rungs) > epoch
                   or (t.user_attrs.get(asha.JOB) or {}).get("epoch", 0) > epoch)
        values = [t.intermediate_values[epoch] for t in recorded]
        top = asha.ranked(recorded, epoch, search.maximize)[:1]
        rows.append((str(k + 1), f"{epoch}{' (full length)' if epoch == search.rungs[-1] else ''}",
                     str(len(recorded)), "-" if epoch == search.rungs[-1] else str(gone),
                     f"{top[0].intermediate_values[epoch]:.4f} (trial {top[0].number})" if top else "-",
                     f"{statistics.median(values):.4f}" if values else "-"))
    cells = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class=rungs><tr>{''.join(f'<th>{_esc(h)}</th>' for h in head)}</tr>{cells}</table>"


def _div(charts: list[str]) -> str:
    """Charts side by side."""
    return f"<div class=charts>{''.join(charts)}</div>"


def _esc(text: str) -> str:
    """Text for HTML and SVG (XML-safe: quotes escaped too)."""
    return html.escape(str(text), quote=True)


def _short(text: str, most: int = 16) -> str:
    """A tick label cut to `most` characters."""
    return text if len(text) <= most else text[: most - 1] + "…"


def _text(value) -> str:
    """A sampled value as hover text (floats to 4 significant digits)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _finite(value) -> bool:
    """A number a chart can place (not a bool, NaN or an infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
