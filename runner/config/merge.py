"""Entries onto a config: each value coerced to its default's type with where it came from, unknown keys named
in one line, a stored config's text back to a frozen config."""
from __future__ import annotations

from typing import Any

from yacs.config import CfgNode as CN

from runner.config.defaults import get_default_config, refuse_unplaced
from runner.config.imports import import_user_code
from runner.config.interp import has_expression, unescape
from runner.config.key_help import suggest_key
from runner.config.keypath import ABSENT, lookup, set_value
from runner.config.safe_yaml import Entry, parse_yaml
from runner.config.schema import coerce_value, expand_paths, type_words
from runner.config.validation import validate
from runner.errors import UserError


def apply_entries(cfg: CN, entries: list[Entry], provenance: dict[str, str],
                  history: dict[str, list[tuple[Any, str]]] | None = None,
                  pending: dict[str, Entry] | None = None) -> None:
    """Set each entry on `cfg` (coerced to the default's type), recording where it came from (and, given a
    history, every value it had).

    Given `pending`, an entry with ${...} in it waits there (its last one per key) for runner.config.interp;
    without, the values are a stored config's: resolved already, $${ read back as ${.
    """
    for e in entries:
        default = lookup(e.key)
        if default is ABSENT:
            raise UserError(_unknown_key_message(e))
        if isinstance(default, CN):
            if e.value is None:  # "TRAIN:" with every key commented out
                continue
            raise UserError(f"{e.key} is a section, not a value ({_where(e)}): give a mapping of its keys, "
                            f"e.g. {e.key}.{next(iter(default))}")
        if pending is not None and has_expression(e.value):
            pending[e.key], value = e, e.value  # resolved once every file and override is in
        else:
            if pending is not None:
                pending.pop(e.key, None)
            else:
                e.value = unescape(e.value)
            value = coerce_value(e.key, e.value, default, e.raw, _where(e))
            set_value(cfg, e.key, value)
        provenance[e.key] = e.source
        if history is not None:
            history.setdefault(e.key, []).append((value, e.source))


def _where(e: Entry) -> str:
    """Where an entry was written, with the file chain when it came through _BASE_."""
    return e.source + chain_text(e.chain)


def chain_text(chain: tuple[str, ...]) -> str:
    """'; chain a -> b' when more than one file is involved."""
    return f"; chain {' -> '.join(chain)}" if len(chain) > 1 else ""


def _unknown_key_message(e: Entry) -> str:
    """Unknown key: where it was written, and the closest real key."""
    parts = e.key.split(".")
    for i in range(1, len(parts)):
        if not isinstance(lookup(".".join(parts[:i])), CN) and lookup(".".join(parts[:i])) is not ABSENT:
            leaf = ".".join(parts[:i])
            return (f"{leaf} expects {type_words(lookup(leaf))}, got a mapping ({_where(e)})")
    return f"unknown config key {e.key} ({_where(e)}){suggest_key(e.key)}"



def import_components(entries: Any, where: str) -> None:
    """Import the user's IMPORTS, then refuse a key they declared after one that nothing declares."""
    import_user_code(entries, where)
    refuse_unplaced()


def import_early(entries: list[Entry]) -> None:
    """Import the IMPORTS that `entries` set (the last one wins) before they are merged: the keys those modules
    declare (runner.keys) must be defaults by then. A value with ${...} waits for the merge, as before."""
    last = next((e for e in reversed(entries) if e.key == "IMPORTS"), None)
    if last is None or has_expression(last.value):
        return
    import_components(coerce_value("IMPORTS", last.value, (), last.raw, last.source), last.source)


def config_from_yaml_text(text: str, name: str = "<stored config>") -> CN:
    """A frozen config from YAML text (e.g. a checkpoint's config), merged onto the defaults and validated."""
    bases, entries = parse_yaml(text, name)
    if bases:
        raise UserError(f"{name}: _BASE_ is not allowed in a stored config")
    # its own IMPORTS first, as when it was loaded: a model, source or schedule they register, and the keys they
    # declare, are then known
    import_early(entries)
    cfg = get_default_config()
    provenance: dict[str, str] = {}
    apply_entries(cfg, entries, provenance)
    expand_paths(cfg)  # a config stored before "~" was expanded compares equal to today's
    import_components(cfg.IMPORTS, provenance.get("IMPORTS", "default"))
    validate(cfg, provenance, check_files=False)
    cfg.freeze()
    return cfg
