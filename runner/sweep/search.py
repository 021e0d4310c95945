"""A sweep file's `search:` (issue 37, section 2), checked against the config before anything trains.

    search:
      metric: val/top1            # default val/top1; val/top5, val/loss, val_ema/* (with TRAIN.EMA)
      mode: max                   # default: max for top1/top5, min for val/loss
      trials: 20                  # the study's trials in all (a re-run continues them; it never adds 20 more)
      sampler: tpe                # tpe (default), random, grid (choice and int ranges only)
      seed: 0                     # optional, 0 to 2**32 - 1: trial N's draw then depends on (seed, N) only
      space:
        TRAIN.LR: {log: [1.0e-5, 1.0]}
        TRAIN.WEIGHT_DECAY: {uniform: [0.0, 0.1]}
        DATA.BATCH_SIZE: {int: [32, 128]}
        MODEL.NAME: {choice: [test_resnet, resnet10t]}
      asha: {eta: 3, min_epochs: 1} # optional: without it every trial trains to TRAIN.EPOCHS

Every mistake is one line, 'sweep FILE: search: ...' (a UserError, exit 2). The space's keys are config keys, each
range fits its key's type (a float key takes log, uniform and int ranges; a whole-number key int and log with whole
bounds; any other key choice), and the config is built at each range's ends and at each choice, so the config's own
rules (a positive LR, an optimizer timm knows) are said here, not by a trial's exit.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from runner.config import RESUME_SAFE_KEYS, flatten
from runner.config.keypath import ABSENT, inline_yaml, lookup
from runner.config.loader import yaml_scalar
from runner.config.schema import coerce_value
from runner.errors import UserError, one_line
from runner.sweep.asha import rungs as rung_list
from runner.sweep.points import train_argv
from runner.sweep.schedulers import SCHEDULERS, Scheduler, build
from runner.sweep.spec import Sweep, Value, read_sweep, token_for

KEYS = ("metric", "mode", "trials", "sampler", "seed", "space", "asha", "scheduler")
# what the Evaluator logs at each evaluation (runner/engine/evaluation.py) and the direction that is better
METRICS = {"val/top1": "max", "val/top5": "max", "val/loss": "min"}
EMA_METRICS = {"val_ema/top1": "max", "val_ema/top5": "max"}  # only with TRAIN.EMA true
SAMPLERS = ("tpe", "random", "grid")
KINDS = ("log", "uniform", "int", "choice")
TRIAL_PREFIX = "trial_"
SEED_MAX = 2**32 - 1
# a number with an exponent and no dot (1e-5): YAML 1.1, which PyYAML reads, takes it as text; the config's keys
# take it as a number, and so does a range
EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


@dataclass(frozen=True)
class Dim:
    """One key of the space: its kind and (lo, hi) or its choices, coerced to the key's type."""

    key: str
    kind: str
    args: tuple
    default: Any  # the key's default (its type decides how a sampled value is coerced)

    def text(self) -> str:
        """The dimension as written, for messages and the stored study settings."""
        return f"{self.kind} {inline_yaml(list(self.args))}"


@dataclass(frozen=True)
class Search:
    """A checked search: the sweep, the command line's KEY VALUE, the space, the ASHA rungs."""

    sweep: Sweep
    extra: tuple[str, ...]
    root: str
    metric: str
    mode: str
    trials: int
    sampler: str
    seed: int | None
    space: dict[str, Dim]
    eta: int
    min_epochs: int
    rungs: tuple[int, ...]
    base: dict[str, str]  # the config every trial shares (key -> YAML text), minus the keys a resume may change
    scheduler: str = "asha"  # runner.sweep.schedulers' name

    @property
    def maximize(self) -> bool:
        """True when a larger metric is better."""
        return self.mode == "max"

    def schedule(self) -> Scheduler:
        """The search's scheduler (`scheduler:`, asha by default) over its rungs, eta, mode and trials."""
        return build(self.scheduler, self.rungs, self.eta, self.maximize, self.trials)

    def trial_dir(self, number: int) -> str:
        """The run folder of trial `number`."""
        return os.path.join(self.root, f"{TRIAL_PREFIX}{number}")

    def argv(self, params: dict[str, Any], output_dir: str) -> list[str]:
        """tools/train.py's arguments for a trial with `params` (the study's values), without the pause."""
        keys = {key: _value(self.space[key], params[key]) for key in self.space}
        return train_argv(self.sweep, keys, list(self.extra), output_dir)

    def settings(self) -> dict[str, str]:
        """What a study must keep to be continued (stored as its user attrs): flat name -> text."""
        out = {"metric": self.metric, "mode": self.mode, "rungs": inline_yaml(list(self.rungs))}
        if self.scheduler != "asha":  # absent in the studies made before there was a choice
            out["scheduler"] = self.scheduler
        out.update({f"space {k}": d.text() for k, d in self.space.items()})
        out.update({f"config {k}": v for k, v in self.base.items()})
        return out


def load_search(path: str, extra: list[str] | tuple[str, ...] = (), root: str | None = None) -> Search:
    """The sweep file at `path` with its `search:` checked (`extra`: KEY VALUE for every trial)."""
    sweep = read_sweep(path)
    raw = _section(sweep)
    extra = tuple(extra)
    _check_extra(sweep, extra, raw.get("space"))
    root = sweep.root if root is None else root
    base = _base_config(sweep, extra, root)
    space = _space(sweep, raw.get("space"), base)
    metric, mode = _metric(sweep, raw, base)
    eta, min_epochs, rungs = _asha(sweep, raw.get("asha"), base)
    sampler = _choice(sweep, "sampler", raw.get("sampler", "tpe"), SAMPLERS)
    trials = _trials(sweep, raw.get("trials"), sampler, space)
    scheduler = _choice(sweep, "scheduler", raw.get("scheduler", "asha"), tuple(SCHEDULERS))
    _check_reach(sweep, trials, eta, rungs, build(scheduler, rungs, eta, mode == "max", trials).least_trials())
    seed = _seed(sweep, raw.get("seed"))
    search = Search(sweep, extra, root, metric, mode, trials, sampler, seed, space, eta, min_epochs, rungs,
                    _shared(base), scheduler)
    _check_ends(search)
    return search


def refusal(sweep: Sweep, message: str) -> UserError:
    """A one-line UserError 'sweep FILE: search: message'."""
    return UserError(f"sweep {sweep.path}: search: {message}")


def _section(sweep: Sweep) -> dict[str, Any]:
    """`search:` as a mapping with known keys; a sweep with grid: or points: besides it is refused."""
    raw = sweep.search
    if raw is None:
        raise UserError(f"sweep {sweep.path}: no search: section (grid: and points: are run by tools/sweeps/run.sh)")
    if sweep.grid or sweep.points:
        raise refusal(sweep, "a search samples its own points; drop grid:/points: (fixed keys go under set:)")
    if not isinstance(raw, dict):
        raise refusal(sweep, f"must be a mapping of {', '.join(KEYS)}, got {raw!r}")
    for key in raw:
        if key not in KEYS:
            raise refusal(sweep, f"unknown key {key!r}; search: has {', '.join(KEYS)}")
    return raw


def _check_extra(sweep: Sweep, extra: tuple[str, ...], space: Any) -> None:
    """Command-line KEY VALUE pairs: pairs, and none that sets a searched key or OUTPUT_DIR."""
    for i in range(0, len(extra), 2):
        key = extra[i]
        if key.startswith("-") or i + 1 == len(extra):
            raise refusal(sweep, f"{key}: after the sweep file come KEY VALUE pairs")
        if key == "OUTPUT_DIR":
            raise refusal(sweep, "OUTPUT_DIR is the search's (trial N trains in ROOT/trial_N); give root: instead")
        if isinstance(space, dict) and key in space:
            raise refusal(sweep, f"{key} is searched (space:); drop it from the arguments")


def _base_config(sweep: Sweep, extra: tuple[str, ...], root: str) -> Any:
    """The config every trial starts from (cfg, set, the command line), built as tools/train.py builds it."""
    from runner.preflight import load_config  # imports the data sources' table: only when a search is read

    argv = train_argv(sweep, {}, list(extra), os.path.join(root, f"{TRIAL_PREFIX}0"))
    try:
        return load_config(argv)[0]
    except UserError as e:
        raise refusal(sweep, f"the config without the space: {one_line(str(e))}") from None


def _shared(cfg: Any) -> dict[str, str]:
    """The base config as key -> YAML text, without the keys a resume may change (a study keeps it)."""
    return {k: inline_yaml(v) for k, v in flatten(cfg).items() if k not in RESUME_SAFE_KEYS}


def _space(sweep: Sweep, raw: Any, cfg: Any) -> dict[str, Dim]:
    """`space:` checked: config keys, one kind each, ranges and choices of the key's type."""
    if not isinstance(raw, dict) or not raw:
        raise refusal(sweep, "space: give KEY: {log|uniform|int: [lo, hi]} or {choice: [...]}, e.g. "
                          "space: {TRAIN.LR: {log: [1.0e-5, 1.0]}}")
    return {key: _dim(sweep, key, spec, cfg) for key, spec in raw.items()}


def _dim(sweep: Sweep, key: Any, spec: Any, cfg: Any) -> Dim:
    """One key of the space."""
    default = _config_key(sweep, key)
    if key in ("TRAIN.EPOCHS", "TRAIN.MAX_STEPS"):
        raise refusal(sweep, f"space: {key} sets the trials' length, which the rungs are made of; it cannot be "
                             "searched")
    if key in sweep.fixed:
        raise refusal(sweep, f"space: {key} is also in set:; give each key in one place")
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in KINDS:
        raise refusal(sweep, f"space: {key}: give one of {{log: [lo, hi]}}, {{uniform: [lo, hi]}}, {{int: [lo, hi]}}, "
                          f"{{choice: [...]}}, got {spec!r}")
    kind, args = next(iter(spec.items()))
    if kind == "choice":
        return Dim(key, kind, _choices(sweep, key, args, default), default)
    return Dim(key, kind, _range(sweep, key, kind, args, default), default)


def _config_key(sweep: Sweep, key: Any) -> Any:
    """The default of config key `key` (a UserError when it is no key a search may set)."""
    from runner.config.key_help import suggest_key

    default = lookup(key) if isinstance(key, str) else ABSENT
    if key == "OUTPUT_DIR":
        raise refusal(sweep, "space: OUTPUT_DIR is the search's (trial N trains in ROOT/trial_N)")
    if default is ABSENT or isinstance(default, dict):
        hint = suggest_key(key) if isinstance(key, str) and default is ABSENT else " (a section, not a key)"
        raise refusal(sweep, f"space: unknown config key {key}{hint}")
    return default


def _range(sweep: Sweep, key: str, kind: str, args: Any, default: Any) -> tuple:
    """(lo, hi) of a log, uniform or int range, checked against the key's type."""
    whole_key = isinstance(default, int) and not isinstance(default, bool)
    allowed = ("int", "log") if whole_key else ("log", "uniform", "int") if isinstance(default, float) else ()
    if kind not in allowed:
        what = f"takes {' or '.join(allowed)} ranges" if allowed else "is not a number: give {choice: [...]}"
        raise refusal(sweep, f"space: {key} ({type(default).__name__}, default {inline_yaml(default)}) {what}, "
                             f"not {kind}")
    if isinstance(args, list):
        args = [float(x) if isinstance(x, str) and EXPONENT.fullmatch(x) else x for x in args]
    if not isinstance(args, list) or len(args) != 2 or not all(_is_number(x) for x in args):
        raise refusal(sweep, f"space: {key}: {kind}: give [lo, hi], two numbers, got {args!r}")
    lo, hi = args
    if (kind == "int" or whole_key) and not all(isinstance(x, int) for x in args):
        raise refusal(sweep, f"space: {key}: {kind}: [lo, hi] must be whole numbers here, got {args!r}")
    if not lo < hi:
        raise refusal(sweep, f"space: {key}: {kind}: lo must be below hi, got [{lo}, {hi}]")
    if kind == "log" and lo <= 0:
        raise refusal(sweep, f"space: {key}: log: lo must be above 0 (a log range), got {lo}")
    return (lo, hi) if kind == "int" or whole_key else (float(lo), float(hi))


def _choices(sweep: Sweep, key: str, args: Any, default: Any) -> tuple:
    """The values of a choice, each coerced to the key's type, each once."""
    if not isinstance(args, list) or not args:
        raise refusal(sweep, f"space: {key}: choice: give a non-empty list of values, got {args!r}")
    values = []
    for value in args:
        try:
            values.append(coerce_value(key, value, default, where="search: space"))
        except UserError as e:
            raise refusal(sweep, f"space: {key}: choice: {one_line(str(e))}") from None
    if len({repr(v) for v in values}) != len(values):
        raise refusal(sweep, f"space: {key}: choice lists the same value twice: {args!r}")
    return tuple(values)


def _metric(sweep: Sweep, raw: dict[str, Any], cfg: Any) -> tuple[str, str]:
    """(metric, mode): a metric the Evaluator logs, and max or min (by default the metric's better direction)."""
    known = {**METRICS, **(EMA_METRICS if cfg.TRAIN.EMA else {})}
    metric = raw.get("metric", "val/top1")
    if metric not in known:
        ema = "" if cfg.TRAIN.EMA else f" ({', '.join(EMA_METRICS)} with TRAIN.EMA true)"
        raise refusal(sweep, f"metric {metric!r} is not logged at an evaluation; give one of {', '.join(known)}{ema}")
    return metric, _choice(sweep, "mode", raw.get("mode", known[metric]), ("max", "min"))


def _asha(sweep: Sweep, raw: Any, cfg: Any) -> tuple[int, int, tuple[int, ...]]:
    """(eta, min_epochs, rungs); without asha: every trial trains to TRAIN.EPOCHS (one rung)."""
    epochs = cfg.TRAIN.EPOCHS
    if cfg.TRAIN.EARLY_STOP_PATIENCE:  # a trial stopped before its rung would have no value there
        raise refusal(sweep, "a trial's metric is read at its rungs (the last: TRAIN.EPOCHS), and "
                          "TRAIN.EARLY_STOP_PATIENCE would end trials before them; drop it (asha: stops the bad ones)")
    if raw is None:
        return 3, epochs, (epochs,)
    if not isinstance(raw, dict) or set(raw) - {"eta", "min_epochs"}:
        raise refusal(sweep, f"asha: give {{eta: 3, min_epochs: E}}, got {raw!r}")
    eta = _whole(sweep, "asha: eta", raw.get("eta", 3), 2)
    min_epochs = _whole(sweep, "asha: min_epochs", raw.get("min_epochs", 1), 1)
    if min_epochs > epochs:
        raise refusal(sweep, f"asha: min_epochs {min_epochs} is above TRAIN.EPOCHS {epochs} (the full length)")
    if cfg.TRAIN.MAX_STEPS:
        raise refusal(sweep, "asha: rungs are epochs, and TRAIN.MAX_STEPS would end the trials elsewhere; drop it")
    rungs = rung_list(min_epochs, eta, epochs)
    early = [r for r in rungs[:-1] if r % cfg.EVAL.PERIOD]
    if early:
        raise refusal(sweep, f"asha: the rung at epoch {early[0]} has no evaluation with EVAL.PERIOD "
                          f"{cfg.EVAL.PERIOD} (rungs {list(rungs)}); set EVAL.PERIOD 1")
    return eta, min_epochs, rungs


def _trials(sweep: Sweep, raw: Any, sampler: str, space: dict[str, Dim]) -> int:
    """`trials`; with the grid sampler at most the grid's size (its size when not given)."""
    size = grid_size(space) if sampler == "grid" else None
    if sampler == "grid" and size is None:
        key = next(k for k, d in space.items() if d.kind in ("log", "uniform"))
        raise refusal(sweep, f"sampler grid takes choice and int ranges only; {key} is a {space[key].kind} range")
    if raw is None and size is None:
        raise refusal(sweep, "trials: give the number of trials, e.g. trials: 20")
    trials = size if raw is None else _whole(sweep, "trials", raw, 1)
    if size is not None and trials > size:
        raise refusal(sweep, f"trials {trials} is more than the grid's {size} points")
    return trials


def _check_reach(sweep: Sweep, trials: int, eta: int, rungs: tuple[int, ...], need: int) -> None:
    """Refuse trials, eta and rungs with which a search may end with no trial at the last rung (the full length):
    `need`, the fewest trials that are sure to (the scheduler's least_trials)."""
    if trials >= need:
        return
    fits = 0  # the most promotions the given trials allow
    while eta ** (fits + 1) <= trials:
        fits += 1
    fewer = next(m for m in range(rungs[0], rungs[-1] + 1) if len(rung_list(m, eta, rungs[-1])) <= fits + 1)
    other = (f"asha: {{eta: {eta}, min_epochs: {fewer}}} (rungs {list(rung_list(fewer, eta, rungs[-1]))})"
             if fits else f"drop asha: (every trial trains to epoch {rungs[-1]})")
    raise refusal(sweep, f"trials {trials} may end with no trial at the full length: a rung promotes its top 1/{eta}, "
                      f"so one reaches epoch {rungs[-1]} (rungs {list(rungs)}) for sure only from {need} "
                      f"trials on; give trials: {need}, or {other}")


def grid_size(space: dict[str, Dim]) -> int | None:
    """The number of points of a grid over `space` (None when a range is continuous)."""
    size = 1
    for dim in space.values():
        if dim.kind in ("log", "uniform"):
            return None
        size *= len(dim.args) if dim.kind == "choice" else dim.args[1] - dim.args[0] + 1
    return size


def _check_ends(search: Search) -> None:
    """Build the config at each range's ends and at each choice: the config's rules speak before a trial."""
    from runner.preflight import load_config

    for key, dim in search.space.items():
        for end in dim.args:
            params = {k: d.args[0] if k != key else end for k, d in search.space.items()}
            params = {k: stored(search.space[k], v) for k, v in params.items()}
            try:
                load_config(search.argv(params, search.trial_dir(0)))
            except UserError as e:
                raise refusal(search.sweep, f"space: {key} = {inline_yaml(end)}: {one_line(str(e))}") from None


def stored(dim: Dim, value: Any) -> Any:
    """A value of `dim` as the study stores it (Optuna's choices are scalars: a list is kept as its YAML text)."""
    return inline_yaml(value) if isinstance(value, (list, tuple)) else value


def _value(dim: Dim, param: Any) -> Value:
    """The study's value of `dim` as a sweep Value (coerced to the key's type, and its command-line token)."""
    value = yaml_scalar(param) if dim.kind == "choice" and isinstance(param, str) and _is_list_key(dim) else param
    coerced = coerce_value(dim.key, value, dim.default, where="search")
    return Value(coerced, token_for(list(coerced) if isinstance(coerced, tuple) else coerced), 0)


def _is_list_key(dim: Dim) -> bool:
    """True when the key holds lists (its choices are kept as YAML text in the study)."""
    return isinstance(dim.default, (list, tuple)) or any(isinstance(a, (list, tuple)) for a in dim.args)


def _choice(sweep: Sweep, name: str, value: Any, allowed: tuple[str, ...]) -> str:
    """A setting that is one of `allowed`."""
    if value not in allowed:
        raise refusal(sweep, f"{name} {value!r}: give one of {', '.join(allowed)}")
    return value


def _seed(sweep: Sweep, value: Any) -> int | None:
    """`seed`: None, or a whole number numpy takes as a seed (each trial's own is derived from it and its number)."""
    if value is None:
        return None
    seed = _whole(sweep, "seed", value, 0)
    if seed > SEED_MAX:  # numpy's RandomState, which Optuna's samplers use, takes 0 to 2**32 - 1
        raise refusal(sweep, f"seed {seed} is above {SEED_MAX} (2**32 - 1, the largest seed the samplers take)")
    return seed


def _whole(sweep: Sweep, name: str, value: Any, least: int) -> int:
    """A whole-number setting of at least `least`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise refusal(sweep, f"{name} must be a whole number of at least {least}, got {value!r}")
    return value


def _is_number(x: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)
