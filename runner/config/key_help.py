"""Key help (--help-keys): each key's default and comment (defaults.py's lines above it, or its declaration's in
runner.keys), and the closest real key for a misspelt one."""
from __future__ import annotations

import difflib
import re
import sys
import textwrap
from pathlib import Path

from yacs.config import CfgNode as CN

from runner.config.compare import flatten
from runner.config.defaults import _C, get_default_config
from runner.config.keypath import inline_yaml, lookup
from runner.errors import UserError
from runner.keys import DECLARED

_KEY_LINE = re.compile(r"^_C\.([A-Z0-9_.]+)\s*=")
_WIDTH = 112  # a declared key's comment is wrapped as defaults.py's lines are


def key_comments() -> dict[str, str]:
    """Each leaf key and its comment: the lines right above it in defaults.py, or its declaration's (runner.keys)."""
    defaults_file = sys.modules[get_default_config.__module__].__file__  # defaults.py, already imported above
    leaves, comments, block = flatten(_C), {}, []
    for line in Path(defaults_file).read_text(encoding="utf-8").splitlines():
        m = _KEY_LINE.match(line)
        if m and m.group(1) in leaves:
            comments[m.group(1)] = "\n".join(block)
        if line.startswith("#") and not set(line) <= {"#", "-", " "}:
            block.append(line.lstrip("# ").rstrip())
        else:  # code, a blank line or a section banner: the comment above the next key starts afresh
            block = []
    comments.update({name: _wrapped(key.text()) for name, key in DECLARED.items() if name in leaves})
    return {key: comments[key] for key in leaves if key in comments}


def _wrapped(text: str) -> str:
    """Comment text in lines of at most _WIDTH characters (an indented line keeps its indent)."""
    out = []
    for line in text.splitlines():
        indent = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, _WIDTH, subsequent_indent=indent + "  " if indent else "") or [""]
    return "\n".join(out)


def help_keys_text(prefix: str = "") -> str:
    """Every key under `prefix` (TRAIN, TRAIN.LR, '' for all) with its default and its comment."""
    want = prefix.strip().upper()
    comments = key_comments()
    keys = [k for k in flatten(_C) if k.startswith(want)]
    if not keys:
        sections = ", ".join(k for k, v in _C.items() if isinstance(v, CN))
        raise UserError(f"--help-keys {prefix}: no config key starts with {want}; sections: {sections}")
    out = []
    for key in keys:
        out.append(f"{key} = {inline_yaml(lookup(key))}")
        out.extend(f"    {line}" for line in comments.get(key, "").splitlines())
    return "\n".join(out) + "\n"


def suggest_key(key: str) -> str:
    """'; did you mean X?' with the closest real key, or ''."""
    keys = list(flatten(_C))
    upper = key.upper()
    last = upper.split(".")[-1]
    exact = [k for k in keys if k == upper] or [k for k in keys if k.split(".")[-1] == last]
    near_last = difflib.get_close_matches(last, [k.split(".")[-1] for k in keys], n=1, cutoff=0.75)
    close = exact or difflib.get_close_matches(upper, keys, n=1, cutoff=0.6) or [
        k for k in keys if k.split(".")[-1] in near_last]
    return f"; did you mean {' or '.join(close[:3])}?" if close else ""
