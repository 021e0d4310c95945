"""The points of a sweep file: the grid crossed with each of `points`, a stable folder name each, tools/train.py's
arguments, and every point's config built once before the first point starts.

Crossing: each map of `points` is crossed with the whole grid, as if `points` were one more grid key whose values
set several keys at once (Ray Tune's grid_search over dicts in a param_space does the same; Hydra's multirun and
W&B's grid sweeps cross every swept list). So `points` can pair keys that go together (an optimizer and its
weight decay) and the grid sweeps the rest over each pair. The points vary slowest, then the grid's keys in file
order; a grid alone is the grid, points alone are the points.

Folder names: the point's swept keys (grid and points; never `set` or the command line), each `key=value`, sorted
by key and joined by commas, as Hydra's override_dirname (`lr=0.008,model.name=resnet10t`). A key is its last
part in lower case when that part names one config key (TRAIN.LR -> lr), else the whole key (model.name); a list
value's items are joined by _ (AUG.SCALE [0.08, 1.0] -> scale=0.08_1.0), a float is Python's shortest form. A / or
a control character becomes _ (one folder per point, never a subfolder); a name over MAX_NAME bytes is cut and
ends in a hash of the whole. So a name depends on the point's keys and values only, not on their order in the
file. Two points that would share a folder are refused before anything runs.

Arguments, in this order (a later KEY wins): --cfg=FILE per cfg file, set's KEY VALUE, the command line's
KEY VALUE (they win over set, as Hydra's command line wins over its config; a swept key or OUTPUT_DIR there is
refused: every point would get the same value), the point's own KEY VALUE, then OUTPUT_DIR ROOT/NAME.
A `set` value with ${...} (runner/config/interp.py) is passed as written and resolved in each point's config
(`check` builds them all), so one that names a swept key follows it from point to point; names never see it.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.config import flatten, get_default_config, load_config
from runner.errors import UserError, one_line
from runner.keys import DECLARED
from runner.sweep.spec import Sweep, Value, read_sweep, token_for

MAX_NAME = 120  # bytes of a folder name: far below the file systems' 255, with room for a hash


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its folder name, its swept keys, its run folder and tools/train.py's arguments."""

    name: str
    keys: dict[str, Value]
    output_dir: str
    argv: tuple[str, ...]


def load_points(path: str, extra: Sequence[str] = (), root: str | None = None,
                check_paths: bool = True) -> tuple[Sweep, list[Point]]:
    """The sweep file at `path` and its points, every point's config built (a mistake: a UserError, one line).

    `extra`: KEY VALUE tokens for every point (the command line's); `root`: a folder in place of the file's root;
    check_paths False: data and checkpoint files are not looked at (SLURM: the compute nodes may see others).
    """
    sweep = read_sweep(path)
    points = plan(sweep, extra, root)
    check(sweep, points, check_paths)
    return sweep, points


def plan(sweep: Sweep, extra: Sequence[str] = (), root: str | None = None) -> list[Point]:
    """Every point of `sweep`, in order, each in its own folder under `root` (default: the sweep's root)."""
    if not sweep.grid and not sweep.points:
        what = ("a search: is run by tools/sweeps/run.sh or python -m runner.sweep search" if sweep.search is not None
                else "it has none")
        raise UserError(f"sweep {sweep.path}: no points ({what}); give grid: or points:")
    extra = list(extra)
    check_extra(sweep, extra)
    root = sweep.root if root is None else root
    points: list[Point] = []
    by_name: dict[str, Point] = {}
    for keys in cross(sweep):
        name = point_name({k: v.value for k, v in keys.items()})
        output_dir = os.path.join(root, name)
        if name in by_name:
            raise UserError(f"sweep {sweep.path}: points {describe(by_name[name])} and {describe(keys)} would "
                            f"train in one folder, {output_dir} (a / in a value becomes _); give values whose "
                            "names differ")
        point = Point(name, keys, output_dir, tuple(train_argv(sweep, keys, extra, output_dir)))
        by_name[name] = point
        points.append(point)
    return points


def cross(sweep: Sweep) -> list[dict[str, Value]]:
    """The swept keys of each point: every map of `points` (slowest) crossed with the grid in file order."""
    axes = [[(key, value) for value in values] for key, values in sweep.grid.items()]
    combos = [dict(combo) for combo in itertools.product(*axes)]  # no grid: one empty combination
    return [{**combo, **point} for point in (sweep.points or ({},)) for combo in combos]


def check_extra(sweep: Sweep, extra: list[str]) -> None:
    """Refuse command-line arguments that are not KEY VALUE pairs, or that set a swept key or OUTPUT_DIR."""
    swept = sweep.swept_keys()
    for i in range(0, len(extra), 2):
        key = extra[i]
        if key.startswith("-"):
            raise UserError(f"sweep {sweep.path}: {key}: after the sweep file come KEY VALUE pairs (config files "
                            "go in its cfg:)")
        if i + 1 == len(extra):
            raise UserError(f"sweep {sweep.path}: {key} has no value: the arguments after the sweep file come in "
                            "KEY VALUE pairs")
        if key == "OUTPUT_DIR":
            raise UserError(f"sweep {sweep.path}: OUTPUT_DIR is the sweep's (each point trains in ROOT/NAME); "
                            "drop it from the arguments and give root: in the file")
        if key in swept:
            where = "grid:" if key in sweep.grid else "points:"
            raise UserError(f"sweep {sweep.path}: {key} is set per point by the sweep's {where}; drop it from "
                            "the arguments and change the sweep file instead")


def train_argv(sweep: Sweep, keys: dict[str, Value], extra: list[str], output_dir: str) -> list[str]:
    """tools/train.py's arguments for one point (see the module's docstring for the order)."""
    argv = [f"--cfg={path}" for path in sweep.cfg]  # --cfg=FILE: a file name starting with - stays a name
    for key, value in sweep.fixed.items():
        argv += [key, value.token]
    argv += extra
    for key, value in keys.items():
        argv += [key, value.token]
    return argv + ["OUTPUT_DIR", token_for(output_dir)]


def check(sweep: Sweep, points: list[Point], check_paths: bool = True) -> None:
    """Build every point's config as tools/train.py would; the first mistake as 'sweep FILE: point NAME: ...'."""
    for point in points:
        try:
            load_config(list(point.argv), check_paths=check_paths)
        except UserError as e:
            raise UserError(f"sweep {sweep.path}: point {point.name}: {one_line(str(e))}") from None


def point_name(keys: dict[str, Any]) -> str:
    """The folder name of a point whose swept keys hold `keys` (key -> coerced value); 'base' for none."""
    if not keys:
        return "base"  # a point of `points: [{}]`: the config as set; no other name lacks a '='
    whole = ",".join(f"{k}={v}" for k, v in sorted((short_key(k), _value_text(v)) for k, v in keys.items()))
    name = "".join("_" if c in "/\\" or ord(c) < 32 or ord(c) == 127 else c for c in whole)
    if len(name.encode("utf-8", "surrogateescape")) <= MAX_NAME:
        return name
    digest = hashlib.sha1(whole.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    while len(name.encode("utf-8", "surrogateescape")) > MAX_NAME - 9:
        name = name[:-1]
    return f"{name}-{digest}"


def short_key(key: str) -> str:
    """A key as a folder name shows it: its last part in lower case when no other key ends so, else all of it."""
    last = key.rsplit(".", 1)[-1]
    return (last if _last_parts(len(DECLARED))[last] == 1 else key).lower()


@functools.cache
def _last_parts(declared: int) -> dict[str, int]:
    """How many config keys end in each last part (counted again when a component declares keys)."""
    counts: dict[str, int] = {}
    for key in flatten(get_default_config()):
        last = key.rsplit(".", 1)[-1]
        counts[last] = counts.get(last, 0) + 1
    return counts


def _value_text(value: Any) -> str:
    """A value as a folder name shows it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "_".join(_value_text(v) for v in value)
    return "null" if value is None else str(value)  # str(float): Python's shortest form (0.001, 1e-05)


def describe(point: Point | dict[str, Value]) -> str:
    """A point as its swept KEY=VALUE pairs, for messages."""
    keys = point.keys if isinstance(point, Point) else point
    return " ".join(f"{k}={v.token}" for k, v in keys.items()) or "{}"
