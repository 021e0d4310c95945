"""Config keys that a registered component declares beside its registration (a schedule, a data source, a sink).

A component's module lists its keys, `Key(name, default, comment, check=..., choices=..., resume_safe=...)`, and
hands them to `declare` (or to its table's register line, which calls it): runner.config.defaults adds them to the
default config at the place `after` names, runner.config.validation checks them by their `check` and `choices`, a
resume may change those marked resume_safe, and `--help-keys` and the dumped defaults show their comments. So a
new knob is one module and one line, not defaults.py, schema.py and a comment list kept by hand.

This module sits below config/ and every table (it imports nothing of the runner), so that the tables can declare
and config/ can read. The runner's own tables are named in BUILT_IN and imported by name when the defaults are
built, as the user's IMPORTS are: their keys are defaults whichever module a process imported first.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# The runner's own tables that declare keys (torch-free to import): schedules, sinks, data sources
BUILT_IN = ("runner.optim", "runner.sinks.catalog", "runner.data.sources")

Rule = tuple[Callable[[Any], bool], str]  # (predicate, what the value must be: "in [1, 10]")


@dataclass(frozen=True)
class Key:
    """One declared config key: its dotted name, default, comment (text, or a function of the registries for a
    list that grows with them), its rule, and whether a resume may change it."""

    name: str
    default: Any
    comment: str | Callable[[], str]
    check: Rule | None = None
    choices: tuple[str, ...] | None = None
    resume_safe: bool = False

    def text(self) -> str:
        """The comment as --help-keys shows it."""
        return self.comment() if callable(self.comment) else self.comment


DECLARED: dict[str, Key] = {}  # dotted name -> Key, in declaration order
OWNERS: dict[str, str] = {}  # dotted name -> the component that declared it ("schedule cosine", "source shards")
PLACES: dict[str, str] = {}  # dotted name -> the key it follows in its section ("" = at the section's end)
_LISTENERS: list[Callable[[Key, str], None]] = []


def declare(keys: Iterable[Key], owner: str, after: str = "") -> list[Key]:
    """Declare `keys` for `owner`, placed one after another following the key `after` ('' = the section's end).

    A key already declared by the same owner is left as it is (a module imported twice); by another owner, or
    with another default, it is a ValueError: two components cannot both own one key.
    """
    keys = list(keys)
    for key in keys:
        known = DECLARED.get(key.name)
        if known is not None and (OWNERS[key.name] != owner or known.default != key.default):
            raise ValueError(f"config key {key.name} is declared by {OWNERS[key.name]} already ({owner} declares "
                             "it again): name the knob differently")
    place = after
    for key in keys:
        if key.name not in DECLARED:
            for listener in _LISTENERS:  # first: a key the defaults refuse is not declared
                listener(key, place)
            DECLARED[key.name], OWNERS[key.name], PLACES[key.name] = key, owner, place
        place = key.name
    return keys


def on_declare(listener: Callable[[Key, str], None]) -> None:
    """Call `listener(key, after)` for every key declared so far and every key declared from now on."""
    _LISTENERS.append(listener)
    for name, key in list(DECLARED.items()):
        listener(key, PLACES[name])


def load_built_in() -> None:
    """Import the runner's own tables (each declares its keys once)."""
    for name in BUILT_IN:
        importlib.import_module(name)


def owned_by(prefix: str) -> dict[str, Key]:
    """The declared keys whose owner starts with `prefix` ("schedule"), by dotted name."""
    return {name: key for name, key in DECLARED.items() if OWNERS[name].startswith(prefix)}


def at_least(low: float) -> Rule:
    """The rule: the value is `low` or more."""
    return (lambda x: x >= low, f">= {low}")


def above(low: float) -> Rule:
    """The rule: the value is more than `low`."""
    return (lambda x: x > low, f"> {low}")


def fraction() -> Rule:
    """The rule: above 0, at most 1 (a decay factor, a crop's share)."""
    return (lambda x: 0 < x <= 1, "in (0, 1]")
