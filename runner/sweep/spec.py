"""A sweep file, read and checked like a config file (YAML's safe loader, Python tags refused, no torch).

    cfg: ../digits/test_resnet.yaml    # the base config file, or a list of them (later files win)
    set:                                # KEY: value, the same for every point
      TRAIN.EPOCHS: 4
    grid:                               # KEY: [values], crossed in file order (the first key varies slowest)
      TRAIN.LR: [0.008, 0.004]
      AUG.SCALE: [[0.08, 1.0], [0.5, 1.0]]     # two values, each a list
    points:                             # KEY: value maps; the grid is crossed with each (see runner.sweep.points)
      - {TRAIN.OPTIMIZER: sgd, TRAIN.WEIGHT_DECAY: 0.0001}
      - {TRAIN.OPTIMIZER: adamw, TRAIN.WEIGHT_DECAY: 0.05}
    root: ../../output/sweeps/mine     # default: output/sweeps/<file stem>, from the current folder
    search: ...                         # issue 37, section 2: kept as written, checked by the search

Relative paths in `cfg` and `root` are relative to the sweep file's folder (as _BASE_ is in a config file);
values are config values, read as a config file reads them: a plain scalar keeps its text for a text key
(`MODEL.NAME: 18`), and each is coerced to its key's type here, so a wrong type is said once, with its line.
A key is fixed (`set`) or swept (`grid`, `points`), never both; OUTPUT_DIR is the sweep's (root/point name).
`set` may interpolate as a config file does (`EVAL.IMG_SIZE: ${DATA.IMG_SIZE}`, `${env:NAME,default}`,
runner/config/interp.py): the expression goes to every point as written and is resolved in each point's config,
so a swept key it names moves it with the point; grid and points values are written out (they name the folders).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import yaml
from yacs.config import CfgNode as CN

from runner.config.interp import has_expression, yaml_scalar
from runner.config.key_help import suggest_key
from runner.config.keypath import ABSENT, inline_yaml, lookup
from runner.config.loader import import_config_imports
from runner.config.safe_yaml import Entry
from runner.config.schema import coerce_value
from runner.errors import UserError

SECTIONS = ("cfg", "set", "grid", "points", "root", "search")
_MERGE_TAG = "tag:yaml.org,2002:merge"
_OPTION = re.compile(r"^(--|-[A-Za-z])")  # what runner.config.loader takes for an option, not a value


@dataclass(frozen=True)
class Value:
    """One config value of a sweep file: coerced to its key's type, and the train.py token that gives it back."""

    value: Any  # coerced: what the point's config holds (names and duplicates are judged on it)
    token: str  # the KEY VALUE text for tools/train.py: the text as written for a plain scalar
    line: int


@dataclass(frozen=True)
class Sweep:
    """A sweep file, checked: the keys are config keys and every value fits its key's type."""

    path: str
    cfg: tuple[str, ...]
    root: str
    fixed: dict[str, Value]  # `set`
    grid: dict[str, tuple[Value, ...]]
    points: tuple[dict[str, Value], ...]
    search: Any = None  # as written; None without `search:`

    def swept_keys(self) -> list[str]:
        """The keys that differ between points: the grid's, then the points' (first seen first)."""
        keys = list(self.grid)
        for point in self.points:
            keys += [k for k in point if k not in keys]
        return keys


def read_sweep(path: str) -> Sweep:
    """The sweep file at `path`, checked; any mistake is a UserError 'sweep PATH[:LINE]: what is wrong'."""
    text = _read(path)
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as e:  # control characters: a binary file, or text that is not YAML
        raise UserError(f"sweep {path}: not a YAML text file ({e.reason} at offset {e.position})") from None
    try:
        return _Reader(path, loader).sweep()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        detail = " ".join(x for x in (e.context, e.problem) if x)
        raise UserError(f"sweep {path}{f':{mark.line + 1}' if mark else ''}: YAML syntax error: {detail}") from None
    except yaml.YAMLError as e:
        raise UserError(f"sweep {path}: YAML error: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise UserError(f"sweep {path}: YAML nested too deep; a sweep file holds KEY: value maps") from None
    finally:
        loader.dispose()


def token_for(value: Any, raw: str | None = None) -> str:
    """The command-line text that runner.config reads back as `value` (`raw`, the text as written, when it does)."""
    plain = value if isinstance(value, str) else None
    quoted = "'" + value.replace("'", "''") + "'" if isinstance(value, str) else None
    for text in (raw, plain, inline_yaml(value), quoted):
        # not a text that reads as an option (-x, --x): train.py would refuse it; repr: true is not 1, nor 1.0
        if text is not None and not _OPTION.match(text) and repr(yaml_scalar(text)) == repr(value):
            return text
    raise UserError(f"the value {value!r} cannot be written as a command-line value")


def _read(path: str) -> str:
    """The file's text, or a UserError saying why it cannot be read."""
    if not os.path.isfile(path):
        what = "is a directory, not a sweep file" if os.path.isdir(path) else "not found"
        raise UserError(f"sweep file {path} {what}")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read sweep file {path}: {e}") from None


class _Reader:
    """One pass over a sweep file's YAML nodes (kept for line numbers and the text of plain scalars)."""

    def __init__(self, path: str, loader: yaml.SafeLoader):
        self.path, self.loader = path, loader
        self.sections: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        self.mappings: dict[int, dict[str, tuple[yaml.Node, yaml.Node]]] = {}

    def refusal(self, node: yaml.Node | None, message: str) -> UserError:
        """A UserError 'sweep PATH:LINE: message' (no line without a node)."""
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return UserError(f"sweep {self.path}{line}: {message}")

    def sweep(self) -> Sweep:
        """The whole file: its sections, checked."""
        top = self.loader.get_single_node()
        if top is None:
            raise self.refusal(None, "the file is empty; give cfg: and grid: or points: (see docs/SWEEPS.md)")
        self.refuse_tags(top)
        self.sections = self.mapping(top, "the top level")
        for name, (knode, _) in self.sections.items():
            if name not in SECTIONS:
                raise self.refusal(knode, f"unknown section {name!r}; a sweep file has {', '.join(SECTIONS)}")
        self.import_components()
        fixed, grid, points = self.values("set", self.section("set")), self.grid(), self.points()
        self.refuse_shared_keys(fixed, grid, points)
        search = self.section("search")
        return Sweep(self.path, self.cfg_files(), self.root(), fixed, grid, points,
                     None if search is None else self.loader.construct_object(search, deep=True))

    def import_components(self) -> None:
        """Import the base config's IMPORTS (and set:'s) before any key is checked: a knob that a user's component
        declares (runner.keys) is a config key only once its module is imported."""
        node, extra = self.section("set"), []
        for key, (knode, vnode) in ({} if node is None else self.mapping(node, "set")).items():
            if key == "IMPORTS":
                raw = vnode.value if isinstance(vnode, yaml.ScalarNode) and vnode.style is None else None
                extra.append(Entry(key, self.loader.construct_object(vnode, deep=True), raw,
                                   f"sweep {self.path}:{knode.start_mark.line + 1}"))
        import_config_imports(list(self.cfg_files()), extra)

    def section(self, name: str) -> yaml.Node | None:
        """The value node of a top-level section; None when it is missing or empty (`set:` alone)."""
        node = self.sections.get(name, (None, None))[1]
        empty = isinstance(node, yaml.ScalarNode) and self.loader.construct_object(node) is None
        return None if empty else node

    def refuse_tags(self, node: yaml.Node, seen: set[int] | None = None) -> None:
        """Refuse Python-tagged (or other non-standard) YAML before anything is constructed."""
        seen = set() if seen is None else seen
        if id(node) in seen:
            return
        seen.add(id(node))
        if not node.tag.startswith("tag:yaml.org,2002:") or node.tag.startswith("tag:yaml.org,2002:python/"):
            raise self.refusal(node, f"YAML tag {node.tag} is refused: a sweep file holds plain values only")
        children = node.value if isinstance(node, yaml.SequenceNode) else (
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
        for child in children:
            self.refuse_tags(child, seen)

    def mapping(self, node: yaml.Node, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """key -> (key node, value node) of a mapping (merge keys applied), refusing repeated and non-text keys."""
        if not isinstance(node, yaml.MappingNode):
            raise self.refusal(node, f"{what} must be a mapping of KEY: value, got {_kind(node)}")
        if id(node) in self.mappings:  # an alias of a mapping read before: its merge keys are already applied
            return self.mappings[id(node)]
        own = [k for k, _ in node.value if k.tag != _MERGE_TAG]
        self.loader.flatten_mapping(node)  # <<: *anchor, whose keys the mapping's own keys may override
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            key = self.loader.construct_object(knode)
            if not isinstance(key, str):
                raise self.refusal(knode, f"{what}: a key must be text, got {key!r}")
            if knode in own and key in out and out[key][0] in own:
                raise self.refusal(knode, f"{what}: {key} is given twice (first at line "
                                       f"{out[key][0].start_mark.line + 1})")
            out[key] = (knode, vnode)
        self.mappings[id(node)] = out
        return out

    def values(self, section: str, node: yaml.Node | None) -> dict[str, Value]:
        """A mapping of config KEY: value (`set`, or one of `points`), each value checked."""
        if node is None:
            return {}
        return {key: self.value(section, key, k, v) for key, (k, v) in self.mapping(node, section).items()}

    def value(self, section: str, key: str, knode: yaml.Node, node: yaml.Node) -> Value:
        """One value of `key`, coerced to the key's type (a mistake names the key and the line)."""
        default = self.config_key(section, key, knode)
        value = self.loader.construct_object(node, deep=True)
        raw = node.value if isinstance(node, yaml.ScalarNode) and node.style is None else None
        line = node.start_mark.line + 1
        if has_expression(value):
            if section != "set":  # a point's folder is named after its values: they are written out
                raise self.refusal(node, f"{section}: {key}: ${{...}} belongs in set: (a swept value names its "
                                      "point's folder, so it is written out; write $${ for a literal ${)")
            return Value(value, token_for(value, raw), line)  # resolved per point, by load_config
        try:
            coerced = coerce_value(key, value, default, raw, where=f"{section}, line {line}")
            return Value(coerced, token_for(value, raw), line)
        except UserError as e:
            raise UserError(f"sweep {self.path}: {e}") from None

    def config_key(self, section: str, key: str, knode: yaml.Node) -> Any:
        """The default of config key `key`; a UserError when it is not one a sweep may set."""
        if key == "OUTPUT_DIR":
            raise self.refusal(knode, f"{section}: OUTPUT_DIR is the sweep's (each point trains in ROOT/NAME); "
                                   "give root: instead")
        default = lookup(key)
        if isinstance(default, CN):
            raise self.refusal(knode, f"{section}: {key} is a section, not a key: write dotted keys, e.g. "
                                   f"{key}.{next(iter(default))}: ...")
        if default is ABSENT:
            raise self.refusal(knode, f"{section}: unknown config key {key}{suggest_key(key)}")
        return default

    def grid(self) -> dict[str, tuple[Value, ...]]:
        """`grid`: KEY: [values], each list non-empty, each value once."""
        node, out = self.section("grid"), {}
        for key, (k, v) in ({} if node is None else self.mapping(node, "grid")).items():
            if not isinstance(v, yaml.SequenceNode):
                raise self.refusal(v, f"grid: {key} must be a list of values, e.g. {key}: [a, b] (one value: "
                                   "put it under set:)")
            if not v.value:
                raise self.refusal(v, f"grid: {key} has an empty list: give it at least one value")
            values = tuple(self.value("grid", key, k, item) for item in v.value)
            self.refuse_repeats([repr(x.value) for x in values], v.value, f"grid: {key} lists the same value")
            out[key] = values
        return out

    def points(self) -> tuple[dict[str, Value], ...]:
        """`points`: a list of KEY: value maps, each map once."""
        node = self.section("points")
        if node is None:
            return ()
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            raise self.refusal(node, "points: must be a non-empty list of KEY: value maps, e.g. "
                                  "points: [{TRAIN.LR: 0.1}, {TRAIN.LR: 0.01, MODEL.NAME: resnet10t}]")
        for item in node.value:
            if not isinstance(item, yaml.MappingNode):
                raise self.refusal(item, f"points: each point must be a mapping of KEY: value, got {_kind(item)}")
        points = tuple(self.values("points", item) for item in node.value)
        identities = [repr(sorted((k, repr(v.value)) for k, v in p.items())) for p in points]
        self.refuse_repeats(identities, node.value, "points: the list holds the same point")
        return points

    def refuse_repeats(self, identities: list[str], nodes: list[yaml.Node], what: str) -> None:
        """Refuse the same value (or point) twice: two points in one folder."""
        first: dict[str, yaml.Node] = {}
        for ident, node in zip(identities, nodes, strict=True):
            if ident in first:
                raise self.refusal(node, f"{what} twice (lines {first[ident].start_mark.line + 1} and "
                                      f"{node.start_mark.line + 1}): two points would train in one folder")
            first[ident] = node

    def refuse_shared_keys(self, fixed: dict, grid: dict, points: tuple) -> None:
        """A key is fixed (set) or swept (grid, points), and swept by the grid or the points, never both."""
        pointed = {k for p in points for k in p}
        for a, b, keys in (("set", "grid", set(fixed) & set(grid)), ("set", "points", set(fixed) & pointed),
                           ("grid", "points", set(grid) & pointed)):
            if keys:
                key = sorted(keys)[0]
                raise self.refusal(self.sections[b][0], f"{key} is in {a}: and in {b}: give each key in one place "
                                                "(set: fixes it for every point; grid: and points: sweep it)")

    def cfg_files(self) -> tuple[str, ...]:
        """`cfg`: one file or a list, relative to the sweep file's folder, each an existing file."""
        node = self.section("cfg")
        if node is None:
            return ()
        items = node.value if isinstance(node, yaml.SequenceNode) else [node]
        files = []
        for item in items:
            path = self.loader.construct_object(item)
            if not isinstance(path, str) or not path:
                raise self.refusal(item, f"cfg: give a config file path (or a list of them), got {_kind(item)}")
            files.append(self.relative(path))
            if not os.path.isfile(files[-1]):
                raise self.refusal(item, f"cfg: config file {files[-1]} not found (relative paths are relative to "
                                      "the sweep file's folder)")
        return tuple(files)

    def root(self) -> str:
        """`root`, relative to the sweep file's folder; by default output/sweeps/<file stem>."""
        node = self.section("root")
        if node is None:
            return os.path.join("output", "sweeps", os.path.splitext(os.path.basename(self.path))[0])
        path = self.loader.construct_object(node)
        if not isinstance(path, str) or not path.strip():
            raise self.refusal(node, f"root: give a folder path, got {_kind(node)}")
        return self.relative(path)

    def relative(self, path: str) -> str:
        """`path` with ~ expanded, taken from the sweep file's folder when relative."""
        path = os.path.expanduser(path)
        return os.path.normpath(os.path.join(os.path.dirname(self.path), path))


def _kind(node: yaml.Node) -> str:
    """What a YAML node is, in words (with its text for a scalar)."""
    if isinstance(node, yaml.ScalarNode):
        return f"the value {node.value!r}" if node.value else "nothing"
    return "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
