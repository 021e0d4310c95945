"""ROOT/report.html read as a reader would (issue 47, item 7): each chart's <svg> parsed as XML. Axis titles and a
legend on every chart, every point named by its trial on hover, the metric's axis within the metric's bounds, an EDF
that rises, parallel coordinates with one line per trial and one axis per searched key, the rung table; a study
with a choice key and a log key, and empty and one-trial studies, all render."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from runner.sweep import worker
from runner.sweep.report import write_report
from runner.sweep.search import load_search
from runner.sweep.study import open_study
from tests.sweep.test_search import record, search_file

NS = "{http://www.w3.org/2000/svg}"
LOG_AND_CHOICE = "    TRAIN.LR: {log: [1.0e-4, 1.0]}\n    TRAIN.OPTIMIZER: {choice: [sgd, adamw]}\n"
# rungs 1, 3, 9: trials 0-5 at rung 1, 0-1 at rung 3, trial 0 at 9; one top1 close to 100, one trial with no value
VALUES = [{1: 90.0, 3: 97.0, 9: 99.6}, {1: 85.0, 3: 88.0}, {1: 40.0}, {1: 60.0}, {1: 70.0}, {1: 75.0}, {}]


def made(tmp_path: Path, search: str = "", space: str = LOG_AND_CHOICE, trials: int = 9, epochs: int = 9):
    """(search, study) with ASHA eta 3 from epoch 1 over `epochs` epochs, in ROOT=tmp/out, no trials yet."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = search_file(tmp_path, f"trials: {trials}\n{search}asha: {{eta: 3, min_epochs: 1}}\n", space,
                       epochs=epochs)
    found = load_search(str(path))
    with worker.locked(found.root):
        return found, open_study(found)


def report(search, study) -> tuple[str, dict[str, list[ET.Element]]]:
    """The page and its charts by kind (each <svg> parsed as XML: the page must hold well-formed SVG)."""
    page = Path(write_report(search, study)).read_text()
    charts: dict[str, list[ET.Element]] = {}
    for text in re.findall(r"<svg\b.*?</svg>", page, re.DOTALL):
        svg = ET.fromstring(text)
        charts.setdefault(svg.get("class").split()[1], []).append(svg)
    return page, charts


def texts(svg: ET.Element, cls: str) -> list[str]:
    """The text of the chart's <text class=cls> elements."""
    return [t.text or "" for t in svg.iter(f"{NS}text") if cls in (t.get("class") or "").split()]


def data_marks(svg: ET.Element, tag: str) -> list[ET.Element]:
    """The chart's circles or polylines outside its legend (the data)."""
    legend = {id(e) for g in svg.iter(f"{NS}g") if g.get("class") == "legend" for e in g.iter()}
    return [e for e in svg.iter(f"{NS}{tag}") if id(e) not in legend]


def hover(element: ET.Element) -> str:
    """An element's <title> text (what a browser shows on hover)."""
    title = element.find(f"{NS}title")
    assert title is not None and title.text, ET.tostring(element)
    return title.text


def points(line: ET.Element) -> list[tuple[float, float]]:
    """A polyline's points in pixels."""
    return [tuple(map(float, p.split(","))) for p in line.get("points").split()]


def test_every_chart_has_axis_titles_units_and_a_legend(tmp_path):
    search, study = made(tmp_path)
    record(search, study, VALUES)
    page, charts = report(search, study)
    assert "<script" not in page and "src=" not in page and "http://" not in page.replace(NS[1:-1], "")
    assert sorted(charts) == ["curves", "edf", "parallel", "scatter"] and len(charts["scatter"]) == 2
    for kind in ("scatter", "edf", "curves"):
        for svg in charts[kind]:
            (x,), (y,) = texts(svg, "xtitle"), texts(svg, "ytitle")
            assert x and y, (kind, x, y)
            assert "val/top1 (%)" in (y if kind != "edf" else x), (kind, x, y)  # the metric's unit
            assert texts(svg, "title") and svg.find(f"{NS}g[@class='legend']") is not None, kind
    lr, opt = charts["scatter"]
    assert texts(lr, "xtitle") == ["TRAIN.LR (log scale)"] and texts(opt, "xtitle") == ["TRAIN.OPTIMIZER (choice)"]
    legend = " ".join(t.text for t in lr.find(f"{NS}g[@class='legend']").iter(f"{NS}text"))
    assert "epoch 1" in legend and "epoch 3" in legend and "epoch 9" in legend  # the colours: the rungs
    assert "fraction of the rung's trials ≤ x" in texts(charts["edf"][0], "ytitle")


def test_every_point_and_line_is_named_by_its_trial(tmp_path):
    search, study = made(tmp_path)
    record(search, study, VALUES)
    _, charts = report(search, study)
    for svg in charts["scatter"]:
        dots = data_marks(svg, "circle")
        named = sorted(int(re.match(r"trial (\d+): ", hover(d)).group(1)) for d in dots)
        assert named == [0, 1, 2, 3, 4, 5], named  # trial 6 has no value: no point
        zero = next(hover(d) for d in dots if hover(d).startswith("trial 0:"))
        params = study.trials[0].params
        assert f"TRAIN.LR={params['TRAIN.LR']:.4g}" in zero and f"TRAIN.OPTIMIZER={params['TRAIN.OPTIMIZER']}" in zero
        assert "val/top1 99.6000% at epoch 9 (rung 3 of 3)" in zero, zero
    for kind in ("edf", "parallel"):
        for element in data_marks(charts[kind][0], "circle") + data_marks(charts[kind][0], "polyline"):
            assert re.match(r"(trial \d+|epoch \d+)", hover(element)), (kind, hover(element))


def test_the_metric_axis_keeps_to_the_metric(tmp_path):
    search, study = made(tmp_path)
    record(search, study, VALUES)  # 99.6 at the top: a padded axis ran to 103
    _, charts = report(search, study)
    for svg in charts["scatter"] + charts["curves"]:
        ticks = [float(t) for t in texts(svg, "ytick")]
        assert ticks and 0.0 <= min(ticks) and max(ticks) <= 100.0, ticks
    edf = [float(t) for t in texts(charts["edf"][0], "xtick")]
    assert 0.0 <= min(edf) and max(edf) <= 100.0 and max(edf) >= 99.6 - 1e-9, edf
    loss, lstudy = made(tmp_path / "loss", "metric: val/loss\n")
    record(loss, lstudy, [{1: 2.3}, {1: 1.7}, {1: 0.9, 3: 0.6}])
    _, charts = report(loss, lstudy)
    for svg in charts["scatter"]:
        ticks = [float(t) for t in texts(svg, "ytick")]
        assert min(ticks) == 0.0 and max(ticks) >= 2.3, ticks  # a loss from 0
        assert texts(svg, "ytitle") == ["val/loss at the rung reached"]  # no unit


def test_the_edf_rises_at_every_rung(tmp_path):
    for mode, sub in (("max", "a"), ("min", "b")):
        search, study = made(tmp_path / sub, f"mode: {mode}\n")
        record(search, study, VALUES)
        _, charts = report(search, study)
        lines = data_marks(charts["edf"][0], "polyline")
        assert [hover(line).split(":")[0] for line in lines] == ["epoch 1", "epoch 3", "epoch 9"]
        for line in lines:
            pts = points(line)
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            # along x, the fraction never falls (a pixel row above is a larger fraction)
            assert xs == sorted(xs) and ys == sorted(ys, reverse=True) and ys[0] > ys[-1], (mode, pts)


def test_parallel_coordinates_one_line_per_trial_one_axis_per_key(tmp_path):
    search, study = made(tmp_path)
    record(search, study, VALUES)
    _, charts = report(search, study)
    (svg,) = charts["parallel"]
    axes = [g.get("data-title") for g in svg.iter(f"{NS}g") if g.get("class") == "axis"]
    assert axes == ["TRAIN.LR (log scale)", "TRAIN.OPTIMIZER (choice)", "val/top1 (%)"]
    lines = data_marks(svg, "polyline")
    assert sorted(int(re.match(r"trial (\d+):", hover(line)).group(1)) for line in lines) == [0, 1, 2, 3, 4, 5]
    assert all(len(points(line)) == len(axes) for line in lines)
    lr_axis, opt_axis, _ = [g for g in svg.iter(f"{NS}g") if g.get("class") == "axis"]
    assert texts(opt_axis, "tick") == ["sgd", "adamw"]  # choices as categories
    assert texts(lr_axis, "tick") == ["0.0001", "0.001", "0.01", "0.1", "1"]  # a log range by decades
    full = [line for line in lines if "at epoch 9" in hover(line)]
    assert len(full) == 1 and float(full[0].get("stroke-width")) > max(
        float(line.get("stroke-width")) for line in lines if line is not full[0])  # thick: the full length


def test_log_and_choice_axes_place_each_trial(tmp_path):
    search, study = made(tmp_path)
    record(search, study, VALUES)
    _, charts = report(search, study)
    lr, opt = charts["scatter"]
    by_trial = {int(re.match(r"trial (\d+)", hover(d)).group(1)): float(d.get("cx")) for d in data_marks(lr, "circle")}
    ordered = sorted(by_trial, key=lambda n: study.trials[n].params["TRAIN.LR"])
    assert sorted(by_trial.values()) == [by_trial[n] for n in ordered]  # left to right by the sampled LR
    xs = {float(d.get("cx")) for d in data_marks(opt, "circle")}
    assert len(xs) <= 2 and texts(opt, "xtick") == ["sgd", "adamw"]  # one column per choice


def test_the_rung_table(tmp_path):
    search, study = made(tmp_path)
    record(search, study, VALUES)
    page, _ = report(search, study)
    table = re.search(r"<table class=rungs>(.*?)</table>", page, re.DOTALL).group(1)
    rows = [re.findall(r"<td>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", table)[1:]]
    assert rows == [["1", "1", "6", "2", "90.0000 (trial 0)", "72.5000"],
                    ["2", "3", "2", "1", "97.0000 (trial 0)", "92.5000"],
                    ["3", "9 (full length)", "1", "-", "99.6000 (trial 0)", "99.6000"]]


def test_empty_and_one_trial_studies_render(tmp_path):
    search, study = made(tmp_path)
    page, charts = report(search, study)  # no trial yet
    assert "no trial has a value yet" in page and len(charts["parallel"]) == 1
    assert not data_marks(charts["parallel"][0], "polyline")
    record(search, study, [{}])
    report(search, study)  # one trial asked, nothing reported
    one, ostudy = made(tmp_path / "one", space="    TRAIN.LR: {log: [1.0e-4, 1.0]}\n", trials=1, epochs=1)
    record(one, ostudy, [{1: 50.0}])
    ostudy.tell(0, 50.0)
    page, charts = report(one, ostudy)
    assert len(data_marks(charts["parallel"][0], "polyline")) == 1 and "best: trial 0" in page
    ticks = [float(t) for t in texts(charts["scatter"][0], "ytick")]
    assert min(ticks) <= 50.0 <= max(ticks) and 0.0 <= min(ticks) and max(ticks) <= 100.0


def test_a_search_run_by_a_worker_names_each_curve_point(tmp_path, fake):  # noqa: F811
    search = load_search(str(search_file(tmp_path, "trials: 4\nseed: 1\nasha: {eta: 3, min_epochs: 1}\n",
                                         LOG_AND_CHOICE, epochs=3)))
    assert worker.run_worker(search, poll_s=0.1, log=lambda s: None) == 0
    study = open_study(search, create=False)
    _, charts = report(search, study)
    (curves,) = charts["curves"]
    dots = data_marks(curves, "circle")
    logged = sum(len((Path(search.trial_dir(t.number)) / "metrics.jsonl").read_text().splitlines())
                 for t in study.trials)
    assert len(dots) == logged and all(re.match(r"trial \d+, epoch \d+: val/top1 ", hover(d)) for d in dots)
    row = json.loads((Path(search.trial_dir(0)) / "metrics.jsonl").read_text().splitlines()[0])
    assert any(hover(d) == f"trial 0, epoch 1: val/top1 {row['val/top1']:.4f}%" for d in dots)
