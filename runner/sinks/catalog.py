"""The sinks a run can write to: a name -> module table. A new destination (a tracker) is one module and one line.

A sink module defines `open_sink(ctx: SinkContext) -> Sink | None` (None: it could not start, and said so
once) and, when it has a store that can be checked before OUTPUT_DIR is claimed, `check(cfg)` raising
UserError. A module is imported only when its sink is on: neither W&B nor MLflow is imported otherwise. The line
is `register(...)` below, with the sink's own LOG.* keys (runner.keys.Key: default, comment, rule; a resume may
change LOG.* keys, so they are resume_safe).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

from runner.errors import UserError
from runner.keys import Key, declare
from runner.sinks.base import Sink, SinkContext


class Entry(NamedTuple):
    """One sink of the table."""

    on: Callable[[Any], bool]  # is it on for this config
    module: str  # defines open_sink(ctx) and, optionally, check(cfg)
    extra: str = ""  # the pip extra its library comes with ('' for none); such a sink is checked before the claim


SINKS: dict[str, Entry] = {}


def register(name: str, on: Callable[[Any], bool], module: str, extra: str = "", keys: tuple[Key, ...] = (),
             after: str = "") -> Entry:
    """Add a sink under `name`, with its own config keys placed after the key `after` ('' = their section's end)."""
    declare(keys, owner=f"sink {name}", after=after)
    SINKS[name] = Entry(on, module, extra)
    return SINKS[name]


TENSORBOARD_KEYS = (
    Key("LOG.TENSORBOARD", True,
        "Write TensorBoard event files", resume_safe=True),
)
WANDB_KEYS = (
    Key("LOG.WANDB", False,
        'Log to Weights & Biases too (pip install -e ".[wandb]"); scalars reach it as checkpoints cover '
        "them", resume_safe=True),
    Key("LOG.WANDB_PROJECT", 'runner',
        "W&B project; the run is named after OUTPUT_DIR and grouped by OUTPUT_DIR's parent folder (a "
        "sweep's folder)", resume_safe=True),
    Key("LOG.WANDB_ENTITY", "",
        'W&B entity (user or team); "" = the account\'s default', resume_safe=True),
    Key("LOG.WANDB_TAGS", (),
        "Extra W&B tags (a sweep's points are tagged with their swept KEY=VALUE as well)", resume_safe=True),
    Key("LOG.WANDB_MODE", 'online',
        "online (offline, with one line saying how to sync, when there is no API key or no network) | "
        "offline", choices=("online", "offline"), resume_safe=True),
)
MLFLOW_KEYS = (
    Key("LOG.MLFLOW_URI", "",
        'MLflow tracking URI (pip install -e ".[mlflow]"): "" = off; file:/path or sqlite:///path.db need '
        "no server", resume_safe=True),
    Key("LOG.MLFLOW_EXPERIMENT", "",
        'MLflow experiment; "" = the name of OUTPUT_DIR\'s parent folder (all points of a sweep in one '
        "experiment), or of OUTPUT_DIR itself when its parent is output/ (a single run)", resume_safe=True),
)

# Opened in this order (metrics.jsonl first: a tracker's resume replays it, cut at the resume step; the console
# last: the others' start lines print above its progress bar), written, flushed and closed in it too.
register("jsonl", lambda cfg: True, "runner.sinks.jsonl")
register("tensorboard", lambda cfg: bool(cfg.LOG.TENSORBOARD), "runner.sinks.tensorboard", keys=TENSORBOARD_KEYS,
         after="LOG.PERIOD")
register("wandb", lambda cfg: bool(cfg.LOG.WANDB), "runner.sinks.wandb_sink", "wandb", keys=WANDB_KEYS,
         after="LOG.PROGRESS")
register("mlflow", lambda cfg: bool(cfg.LOG.MLFLOW_URI), "runner.sinks.mlflow_sink", "mlflow", keys=MLFLOW_KEYS,
         after="LOG.WANDB_MODE")
register("console", lambda cfg: True, "runner.sinks.console")


def _modules(entries: list[Entry]) -> list[ModuleType]:
    """The modules of `entries` (importing each one's library); a missing library is a user mistake."""
    found = []
    for entry in entries:
        try:
            found.append(importlib.import_module(entry.module))
        except ImportError as e:
            if not entry.extra:
                raise
            raise UserError(f"the {entry.extra} tracker needs a package that is missing ({e.name}): "
                            f"pip install -e '.[{entry.extra}]'") from None
    return found


def check_sinks(cfg, dist=None, group=None) -> None:
    """Refuse (UserError) a tracker that is not installed or cannot open its store, before OUTPUT_DIR is claimed.

    Rank 0 checks (only it logs to trackers; ranks opening one new store at once would race); with `dist` a
    job's other ranks learn the refusal over `group` (the control group), not from a timeout.
    """
    entries = [e for e in SINKS.values() if e.extra and e.on(cfg)]
    if not entries:
        return
    error = None
    if dist is None or dist.is_main:
        try:
            for module in _modules(entries):
                if hasattr(module, "check"):
                    module.check(cfg)
        except UserError as e:
            error = str(e)
    if dist is not None and dist.distributed:
        from runner.distributed import broadcast_object

        error = broadcast_object(error, group)
    if error:
        raise UserError(error)


def open_sinks(ctx: SinkContext) -> list[Sink]:
    """The sinks the config turns on, in the table's order, each continuing at ctx.resume_step."""
    sinks = []
    for module in _modules([e for e in SINKS.values() if e.on(ctx.cfg)]):
        sink = module.open_sink(ctx)
        if sink is not None:
            sinks.append(sink)
    return sinks
