"""Interpolation: `${KEY}` (another config key) and `${env:NAME}` / `${env:NAME,default}` in config values.

    DATA.IMG_SIZE: 224
    EVAL.IMG_SIZE: ${DATA.IMG_SIZE}                      # 224, an integer: typed as EVAL.IMG_SIZE demands
    OUTPUT_DIR: output/${MODEL.NAME}-${DATA.IMG_SIZE}px  # inside text
    DATA.ROOT: ${env:SCRATCH,/data}/imagenet             # the environment, with a default
    DATA.MEAN: ["${env:MEAN_R,0.5}", 0.5, 0.5]           # list items (quoted: { and , end a word inside [ ])
    EXPERIMENT.NAME: cost $${HOME}                       # $${ is a literal ${

Resolved once, in load_config, after every file and KEY VALUE override and before validation: a key names the
other key's final value. A value that is one expression takes the other value's type; text around an expression
makes text, which is then read as the target key demands (YAML, then the key's coercion). config.yaml stores the
resolved values (a literal ${ written back as $${), and a stored config is never resolved again: where OUTPUT_DIR
already holds a run's config.yaml, the keys that read the environment take its values (a resume keeps them).
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yacs.config import CfgNode as CN

from runner.config.keypath import ABSENT, get_value, inline_yaml, lookup, set_value
from runner.config.schema import coerce_value
from runner.errors import UserError

# runner/rundir/layout.py's CONFIG (that layer sits above config/; tests/config/test_interp.py checks they agree)
STORED_CONFIG = "config.yaml"
ESCAPE = "$${"
_TOKEN = re.compile(r"\$\$\{|\$\{([^{}]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class Ref:
    """One `${...}`: a config key, or an environment variable with an optional default."""

    text: str  # as written, ${...}
    key: str = ""
    env: str = ""
    default: str | None = None


def has_expression(value: Any) -> bool:
    """True for text (or a list holding text) with `${` in it: an expression or an escaped `$${`."""
    if isinstance(value, (list, tuple)):
        return any(has_expression(v) for v in value)
    return isinstance(value, str) and "${" in value


def escape(value: Any) -> Any:
    """A resolved value written so that reading it back gives it again: `${` as `$${` (config.yaml)."""
    if isinstance(value, str):
        return value.replace("${", ESCAPE)
    if isinstance(value, (list, tuple)):
        return type(value)(escape(v) for v in value)
    return value


def unescape(value: Any) -> Any:
    """The value `escape` wrote: `$${` back to `${` (a stored config is read, never resolved)."""
    if isinstance(value, str):
        return value.replace(ESCAPE, "${")
    if isinstance(value, list):
        return [unescape(v) for v in value]
    return value


def parse(text: str, where: str) -> list[str | Ref]:
    """Text cut into literal pieces and references; an unclosed or empty `${` is a UserError."""
    out: list[str | Ref] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        out.append(text[pos:m.start()])
        out.append("${" if m.group(0) == ESCAPE else _ref(m.group(0), m.group(1), where))
        pos = m.end()
    rest = text[pos:]
    if "${" in rest:
        raise UserError(f"{where}: {rest[rest.index('${'):][:40]!r} has a ${{ without its closing }} (write "
                        "$${ for a literal ${)")
    out.append(rest)
    return [p for p in out if p != ""]


def _ref(text: str, inner: str, where: str) -> Ref:
    """The reference `${inner}`, checked for form."""
    inner = inner.strip()
    if inner.startswith("env:"):
        name, comma, default = inner[4:].partition(",")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()):
            raise UserError(f"{where}: {text} names no environment variable; write ${{env:NAME}} or "
                            "${env:NAME,default}")
        return Ref(text, env=name.strip(), default=default if comma else None)
    if not _NAME.fullmatch(inner):
        raise UserError(f"{where}: {text} is not ${{KEY}} (a dotted config key, e.g. ${{DATA.IMG_SIZE}}) nor "
                        "${env:NAME}; write $${ for a literal ${")
    return Ref(text, key=inner)


def as_text(value: Any) -> str:
    """A value as it reads inside text: text as it is, anything else as YAML writes it inline."""
    return value if isinstance(value, str) else inline_yaml(value)


def yaml_scalar(token: str) -> Any:
    """A command-line token read like a YAML value; text that is not valid YAML stays text."""
    if not token.strip():
        return token  # DATA.ROOT "" means empty text, not YAML's null
    try:
        return yaml.safe_load(token)
    except yaml.YAMLError:
        return token


# ---------------------------------------------------------------------------------------------------------
# Resolution: every expression once, after all files and overrides
# ---------------------------------------------------------------------------------------------------------
@dataclass
class Resolved:
    """What resolution did, for --explain and a resume: each key's expression and the environment it read."""

    expressions: dict[str, tuple[Any, str]] = field(default_factory=dict)  # key -> (as written, file:line)
    env_keys: dict[str, list[str]] = field(default_factory=dict)  # key -> variables read, also through keys
    kept: dict[str, str] = field(default_factory=dict)  # key -> the stored config.yaml it was taken from


def resolve(cfg: CN, pending: Mapping[str, Any], suggest: Callable[[str], str] = lambda key: "") -> Resolved:
    """Set every pending key (key -> its last entry: .value, .source) on the unfrozen `cfg`, resolved and coerced.

    `suggest(key)`: '; did you mean X?' for a key that does not exist. A mistake: one UserError line.
    """
    resolver = _Resolver(cfg, pending, suggest)
    for key in pending:
        resolver.key(key)
    return Resolved({k: (e.value, e.source) for k, e in pending.items()}, resolver.env)


class _Resolver:
    """A depth-first walk over the references; the keys being resolved are the chain a message names."""

    def __init__(self, cfg: CN, pending: Mapping[str, Any], suggest: Callable[[str], str]):
        self.cfg, self.pending, self.suggest = cfg, pending, suggest
        self.done: set[str] = set()
        self.stack: list[str] = []
        self.env: dict[str, list[str]] = {}

    def key(self, key: str) -> None:
        """Resolve pending `key` (its references first) and set its coerced value."""
        if key in self.done:
            return
        if key in self.stack:
            loop = self.stack[self.stack.index(key):] + [key]
            raise UserError("interpolation cycle: " + " -> ".join(
                f"{k} ({self.pending[k].source})" if i < len(loop) - 1 else k for i, k in enumerate(loop))
                + ": give one of these keys a value")
        self.stack.append(key)
        default = lookup(key)
        item = default[0] if isinstance(default, (tuple, list)) and default else None
        value = self.pending[key].value
        if isinstance(value, list):
            value = [self.text(v, item) if isinstance(v, str) else v for v in value]
        else:
            value = self.text(value, default)
        set_value(self.cfg, key, coerce_value(key, value, default, None, self.where()))
        self.stack.pop()
        self.done.add(key)

    def where(self) -> str:
        """'file:line: EXPRESSION' of the key being resolved, and the keys that led to it."""
        *outer, key = self.stack
        text = f"{self.pending[key].source}: {key}: {inline_yaml(self.pending[key].value)}"
        return text + "".join(f"; used by {k} ({self.pending[k].source})" for k in reversed(outer))

    def text(self, text: str, default: Any) -> Any:
        """One text value resolved: a lone reference keeps the referenced type, text around one makes text."""
        parts = parse(text, self.where())
        if len(parts) == 1 and isinstance(parts[0], Ref):
            value = self.ref(parts[0])
            if isinstance(default, str) and not isinstance(value, (list, tuple)):
                return as_text(value)
            return yaml_scalar(value) if parts[0].env and default is not None else value
        joined = "".join(p if isinstance(p, str) else as_text(self.ref(p)) for p in parts)
        return joined if isinstance(default, str) or default is None else yaml_scalar(joined)

    def ref(self, ref: Ref) -> Any:
        """The value a reference stands for; the environment it reads is noted on every key of the chain."""
        if ref.env:
            value = os.environ.get(ref.env, ref.default)
            if value is None:
                raise UserError(f"{ref.text}: the environment variable {ref.env} is not set ({self.where()}); "
                                f"set it, or give a default: ${{env:{ref.env},VALUE}}")
            self.note([ref.env])
            return value
        found = lookup(ref.key)
        if found is ABSENT or isinstance(found, CN):
            what = "a section, not a key" if isinstance(found, CN) else f"not a config key{self.suggest(ref.key)}"
            raise UserError(f"{ref.text} is {what} ({self.where()})")
        if ref.key in self.pending:
            self.key(ref.key)
            self.note(self.env.get(ref.key, []))
        elif ref.key == "OUTPUT_DIR" and not self.cfg.OUTPUT_DIR:
            raise UserError(f"{ref.text}: OUTPUT_DIR is not set, and the folder named after the --cfg file is "
                            f"chosen after interpolation ({self.where()}); set OUTPUT_DIR to use it")
        return get_value(self.cfg, ref.key)

    def note(self, names: list[str]) -> None:
        """Record that every key being resolved read these environment variables."""
        for key in self.stack if names else ():
            seen = self.env.setdefault(key, [])
            seen += [n for n in names if n not in seen]
