"""A sweep from the command line, written as the sweep file it stands for (then run as any other).

    python -m runner.sweep grid [--root DIR] --cfg FILE [--cfg ...] --grid KEY V1,V2 [--grid ...] [KEY VALUE ...]

writes ROOT/sweep.yaml (cfg: the files' absolute paths, set: the KEY VALUE pairs, grid: each --grid in order,
root: its own folder) and prints its path; tools/sweeps/run.sh and slurm.sh, given `--cfg ...` in place of a
sweep file, run the file it wrote. So the sweep can be re-run (`tools/sweeps/run.sh ROOT/sweep.yaml`), moved to
SLURM, or copied and edited; its folders and results are those of the same sweep written by hand.

VALUES are split at commas, except inside [], (), {} or quotes: a tuple is written in YAML flow form,
`--grid AUG.SCALE "[0.08,1.0],[0.5,1.0]"` (two values), and a text with a comma is quoted: `"'a,b',c"`.
ROOT: --root (run.sh's SWEEP_ROOT), else output/sweeps/<config label>-<swept keys>, with a hash of the KEY VALUE
pairs when there are any: the same command finds the same folder (its done points are skipped), a wider grid too.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile

import yaml

from runner.config.interp import yaml_scalar
from runner.config.key_help import suggest_key
from runner.config.keypath import ABSENT, lookup
from runner.config.loader import import_config_imports
from runner.config.output_dir import config_label
from runner.config.safe_yaml import Entry
from runner.config.schema import COMMAND_LINE
from runner.errors import UserError
from runner.fsutil import atomic_write
from runner.sweep.points import short_key
from runner.sweep.spec import read_sweep

FILE_NAME = "sweep.yaml"
USAGE = ("usage: python -m runner.sweep grid [--root DIR] --cfg FILE [--cfg FILE ...] --grid KEY V1,V2 "
         "[--grid KEY ...] [KEY VALUE ...]")
_CLOSE = {"[": "]", "(": ")", "{": "}"}


def grid_command(args: list[str]) -> str:
    """Write the sweep file of a command-line grid (checked first, as a sweep file is) and return its path."""
    root, cfgs, grid, pairs = parse_args(list(args))
    root = root or default_root(cfgs, list(grid), pairs)
    text = sweep_text(cfgs, grid, pairs)
    _check(text, os.path.join(root, FILE_NAME))
    path = os.path.join(root, FILE_NAME)
    try:
        os.makedirs(root, exist_ok=True)
        atomic_write(path, text.encode())
    except OSError as e:
        raise UserError(f"the sweep's root {root} cannot hold {FILE_NAME}: {e.strerror}; give a folder path "
                        "(SWEEP_ROOT)") from None
    return path


def parse_args(args: list[str]) -> tuple[str, list[str], dict[str, list[str]], list[tuple[str, str]]]:
    """(root or '', cfg files, KEY -> value texts, set's (KEY, VALUE)) from `grid`'s arguments."""
    root, cfgs, grid, pairs = "", [], {}, []
    while args:
        flag = args.pop(0)
        name, eq, inline = flag.partition("=")
        if name in ("--root", "--cfg", "--grid") and not eq and not args:
            raise UserError(f"{flag} has no value; {USAGE}")
        value = inline if eq else args.pop(0) if name in ("--root", "--cfg", "--grid") else ""
        if name == "--root":
            root = value
        elif name == "--cfg":
            cfgs.append(_existing(value))
        elif name == "--grid":
            if not args:
                raise UserError(f"--grid {value} has no values: --grid KEY V1,V2")
            key = value
            if key in grid:
                raise UserError(f"--grid {key} is given twice: give every value in one --grid {key} V1,V2,...")
            grid[key] = split_values(args.pop(0), key)
        elif flag.startswith("-"):
            raise UserError(f"unknown option {flag}; {USAGE}")
        elif not args:
            raise UserError(f"{flag} has no value: after the --grid options come KEY VALUE pairs")
        else:
            pairs.append((flag, args.pop(0)))
    if not cfgs or not grid:
        raise UserError(f"a sweep from the command line needs --cfg FILE and at least one --grid KEY V1,V2; {USAGE}")
    # the configs' IMPORTS (and an IMPORTS pair) first: a knob a user's component declares is then a key
    import_config_imports(cfgs, [Entry(k, yaml_scalar(v), v, COMMAND_LINE) for k, v in pairs if k == "IMPORTS"])
    for key in grid:
        _key(key, "--grid")
    for key, _ in pairs:
        _key(key, "KEY VALUE")
    return root, cfgs, grid, pairs


def _existing(path: str) -> str:
    """The absolute path of a config file that exists (the sweep file may be run from anywhere)."""
    if not os.path.isfile(os.path.expanduser(path)):
        raise UserError(f"--cfg {path}: config file not found")
    return os.path.abspath(os.path.expanduser(path))


def _key(key: str, where: str) -> str:
    """A config key a sweep may set, or a UserError naming it."""
    if key == "OUTPUT_DIR":
        raise UserError(f"{where} OUTPUT_DIR: each point trains in ROOT/NAME; give the folder as SWEEP_ROOT")
    if lookup(key) is ABSENT or not re.fullmatch(r"[A-Za-z0-9_.]+", key):
        raise UserError(f"{where} {key}: unknown config key{suggest_key(key)}")
    return key


def split_values(text: str, key: str) -> list[str]:
    """`V1,V2` cut at the commas outside brackets and quotes; an empty value is a UserError."""
    out, depth, quote, start = [], [], "", 0
    for i, c in enumerate(text):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in _CLOSE:
            depth.append(_CLOSE[c])
        elif depth and c == depth[-1]:
            depth.pop()
        elif c == "," and not depth:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    if quote or depth or any(not v.strip() for v in out):
        why = "an unclosed quote or bracket" if quote or depth else "an empty value"
        raise UserError(f"--grid {key} {text!r} has {why}: give V1,V2,... (a tuple in brackets: [0.08,1.0])")
    return [v.strip() for v in out]


def default_root(cfgs: list[str], keys: list[str], pairs: list[tuple[str, str]]) -> str:
    """output/sweeps/<config label>-<swept keys>[-<hash of the KEY VALUE pairs>]."""
    name = f"{config_label(cfgs, os.getcwd())}-{','.join(short_key(k) for k in keys)}"
    if pairs:
        name += "-" + hashlib.sha1(repr(pairs).encode()).hexdigest()[:8]
    return os.path.join("output", "sweeps", name)


def sweep_text(cfgs: list[str], grid: dict[str, list[str]], pairs: list[tuple[str, str]]) -> str:
    """The sweep file: each value written as it was typed where YAML reads it back the same, else quoted."""
    lines = ["# A sweep from the command line (python -m runner.sweep grid); run it again, here or on SLURM, with",
             f"#   tools/sweeps/run.sh {FILE_NAME}   or   tools/sweeps/slurm.sh {FILE_NAME}   (from this folder)",
             "cfg:"] + [f"  - {_item(path)}" for path in cfgs] + ["root: .  # this folder"]
    if pairs:
        lines += ["set:"] + [f"  {key}: {_item(token, '')}" for key, token in dict(pairs).items()]
    lines.append("grid:")
    for key, values in grid.items():
        lines += [f"  {key}:"] + [f"    - {_item(v)}" for v in values]
    return "\n".join(lines) + "\n"


def _item(token: str, prefix: str = "- ") -> str:
    """`token` as YAML text that reads back as the command line reads it (as a list item with prefix '- ')."""
    want = yaml_scalar(token)
    try:
        same = "\n" not in token and yaml.safe_load(f"{prefix}{token}" if prefix else f"k: {token}") == (
            [want] if prefix else {"k": want})
    except yaml.YAMLError:
        same = False
    if same:
        return token
    return yaml.safe_dump(want, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()


def _check(text: str, path: str) -> None:
    """Read `text` as the sweep file at `path` would be read; a mistake names the command line's part."""
    with tempfile.TemporaryDirectory() as folder:
        temp = os.path.join(folder, FILE_NAME)
        with open(temp, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            read_sweep(temp)
        except UserError as e:
            message = re.sub(r"\((set|grid), line \d+\)", lambda m: "(KEY VALUE)" if m[1] == "set" else "(--grid)",
                             str(e))
            raise UserError(re.sub(rf"^sweep {re.escape(temp)}(:\d+)?: ", "", message)
                            + f" (the sweep for {path})") from None
