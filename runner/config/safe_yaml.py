"""Safe YAML reading: config text to flattened entries with file:line, refusing Python tags, huge or deep
documents, duplicate keys and a top level that is not a mapping."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml
from yacs.config import CfgNode as CN

from runner.config.keypath import lookup
from runner.errors import UserError

_MAX_YAML_DEPTH = 32  # a config is sections of keys with short lists; PyYAML's composer recurses per level
_MAX_YAML_NODES = 100_000  # values after expanding aliases and merge keys ("billion laughs" stops here)
_PY_TAG = "tag:yaml.org,2002:python/"
# libyaml's loader where PyYAML was built with it (its wheels are): about 13x faster on a stored config.yaml,
# which every start and every resume parses; the same nodes, marks and errors' lines
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TOO_DEEP = f"YAML nested deeper than {_MAX_YAML_DEPTH} levels; a config file holds sections of KEY: value"
_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class Entry:
    """One value assignment read from a YAML file or the command line."""

    key: str
    value: Any
    raw: str | None  # the text as written, for plain scalars: lets string keys keep "1e-3" or "18" verbatim
    source: str  # "file:line" or "command line"
    chain: tuple[str, ...] = ()  # the files that led here, outermost first
    merged: bool = False  # came through a YAML merge key (<<: *anchor), which later keys may override


def parse_yaml(text: str, name: str,
               chain: tuple[str, ...] = ()) -> tuple[list[tuple[str, int]], list[Entry]]:
    """Safely parse YAML text into (_BASE_ paths with lines, flattened entries with lines)."""
    try:
        loader = _LOADER(text)
    except yaml.reader.ReaderError as e:  # control characters: a binary file, or text that is not YAML
        raise _not_text(e, name) from None
    try:
        _refuse_huge_yaml(text, name)
        root = loader.get_single_node()
        if root is None:
            return [], []
        _refuse_tags(root, name)
        if not isinstance(root, yaml.MappingNode):
            raise UserError(f"{name}:{root.start_mark.line + 1}: the top level of a config file must be a "
                            f"mapping of KEY: value, got a {_node_kind(root)}")
        bases: list[tuple[str, int]] = []
        entries: list[Entry] = []
        for key, knode, vnode, merged in _mapping_items(loader, root, name, ""):
            if key == "_BASE_":
                bases = _base_list(loader, knode, vnode, name)
            else:
                _entries_under(loader, key, knode, vnode, name, chain, entries, merged)
        _refuse_flat_duplicates(entries, name)
        return bases, entries
    except yaml.reader.ReaderError as e:  # libyaml's loader reads the text only as it parses
        raise _not_text(e, name) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        if "maximum nesting depth" in (e.problem or ""):  # libyaml's own bound, met before ours
            raise UserError(f"{name}:{mark.line + 1}: {_TOO_DEEP}") from None
        line = f":{mark.line + 1}" if mark else ""
        context = e.context or ""
        if e.context and e.context_mark and e.context_mark.line != mark.line:
            context += f" (from line {e.context_mark.line + 1})"
        detail = " ".join(x for x in (context, e.problem or "") if x)
        raise UserError(f"{name}{line}: YAML syntax error: {detail}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{name}: YAML error: {' '.join(str(e).split())}") from None
    except RecursionError:  # a backstop: _refuse_huge_yaml bounds the depth before anything recurses
        raise UserError(f"{name}: YAML nested too deep; a config file holds sections of KEY: value") from None
    finally:
        loader.dispose()


def _not_text(e: yaml.reader.ReaderError, name: str) -> UserError:
    """The line for YAML text with a character YAML does not allow (a binary file)."""
    code = e.character if isinstance(e.character, int) else 0
    return UserError(f"{name}: not a YAML text file (character #x{code:04x} at offset {e.position} is not "
                     "allowed in YAML)")


def _refuse_huge_yaml(text: str, name: str) -> None:
    """Refuse deep nesting and alias expansion past the limits, from the event stream (iterative, cheap)."""
    total, sizes, open_ = 0, {}, []  # values so far (aliases expanded), anchor -> values under it, open nodes
    for event in yaml.parse(text, Loader=_LOADER):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in open_):
                raise UserError(f"{name}:{line}: alias *{event.anchor} points into the node that holds it (a loop)")
            total += sizes.get(event.anchor, 1)  # an undefined alias: the composer names it
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            total += 1
            open_.append((event.anchor, total - 1))
            if len(open_) > _MAX_YAML_DEPTH:
                raise UserError(f"{name}:{line}: {_TOO_DEEP}")
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, start = open_.pop()
            if anchor:
                sizes[anchor] = total - start
        if total > _MAX_YAML_NODES:
            raise UserError(f"{name}:{line}: YAML anchors and aliases (or merge keys <<:) expand to more than "
                            f"{_MAX_YAML_NODES} values; a config file needs far fewer: write the values out")


def _refuse_tags(node: yaml.Node, name: str, seen: set[int] | None = None) -> None:
    """Refuse Python-tagged (or other non-standard) YAML before anything is constructed."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    if node.tag.startswith(_PY_TAG):
        raise UserError(f"{name}:{node.start_mark.line + 1}: Python-tagged YAML ({node.tag.split(':')[-1]}) "
                        "is refused: config files hold plain values only")
    if not node.tag.startswith("tag:yaml.org,2002:"):
        raise UserError(f"{name}:{node.start_mark.line + 1}: unsupported YAML tag {node.tag}")
    children = node.value if isinstance(node, yaml.SequenceNode) else (
        [n for kv in node.value for n in kv] if isinstance(node, yaml.MappingNode) else [])
    for child in children:
        _refuse_tags(child, name, seen)


def _mapping_items(loader: yaml.SafeLoader, node: yaml.MappingNode, name: str,
                   prefix: str) -> Iterator[tuple[Any, yaml.Node, yaml.Node, bool]]:
    """(key, key node, value node, merged) of a mapping, refusing duplicate and non-string keys."""
    first: dict[str, int] = {}
    for knode, _ in node.value:
        if knode.tag == _MERGE_TAG:
            continue
        key = loader.construct_object(knode)
        line = knode.start_mark.line + 1
        if not isinstance(key, str):
            raise UserError(f"{name}:{line}: config keys are names, got {key!r}")
        if key in first:
            raise UserError(f"{name}:{line}: duplicate key {prefix}{key} (first set at line {first[key]})")
        first[key] = line
    own = {id(k) for k, _ in node.value}
    loader.flatten_mapping(node)  # resolves YAML merge keys (<<: *anchor); the mapping's own keys come last
    for knode, vnode in node.value:
        yield loader.construct_object(knode), knode, vnode, id(knode) not in own


def _base_list(loader: yaml.SafeLoader, knode: yaml.Node, vnode: yaml.Node,
               name: str) -> list[tuple[str, int]]:
    """The _BASE_ value as a list of (path, line): a path or a list of paths."""
    value = loader.construct_object(vnode, deep=True)
    line = knode.start_mark.line + 1
    paths = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise UserError(f"{name}:{line}: _BASE_ must be a path or a list of paths, got {value!r}")
    return [(p, line) for p in paths]


def _entries_under(loader: yaml.SafeLoader, key: str, knode: yaml.Node, vnode: yaml.Node, name: str,
                   chain: tuple[str, ...], out: list[Entry], merged: bool) -> None:
    """Append the leaf entries under `key` (nested mappings become dotted keys)."""
    if isinstance(vnode, yaml.MappingNode) and isinstance(lookup(key), CN):
        for sub, sknode, svnode, sub_merged in _mapping_items(loader, vnode, name, key + "."):
            _entries_under(loader, f"{key}.{sub}", sknode, svnode, name, chain, out, merged or sub_merged)
        return
    raw = vnode.value if isinstance(vnode, yaml.ScalarNode) and not vnode.style else None  # plain: None or ""
    out.append(Entry(key, loader.construct_object(vnode, deep=True), raw,
                     f"{name}:{knode.start_mark.line + 1}", chain, merged))


def _refuse_flat_duplicates(entries: list[Entry], name: str) -> None:
    """The same key written twice in one file, also as TRAIN.LR next to TRAIN: {LR: ...}."""
    first: dict[str, str] = {}
    for e in (e for e in entries if not e.merged):
        if e.key in first:
            raise UserError(f"{e.source}: duplicate key {e.key} (first set at {first[e.key]})")
        first[e.key] = e.source


def _node_kind(node: yaml.Node) -> str:
    """'list', 'mapping' or 'value', for messages."""
    return {yaml.SequenceNode: "list", yaml.MappingNode: "mapping"}.get(type(node), "single value")
