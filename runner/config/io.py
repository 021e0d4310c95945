"""Config text in and out: flatten, dump, diff, YAML text to a config (with file:line), the default output folder."""
from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yacs.config import CfgNode as CN

from runner.config.defaults import _C, get_default_config
from runner.config.imports import import_user_code
from runner.config.interp import escape, has_expression, unescape
from runner.config.schema import (
    ABSENT,
    RESUME_SAFE_KEYS,
    coerce_value,
    expand_paths,
    inline_yaml,
    lookup,
    set_value,
    type_words,
    validate,
)
from runner.errors import UserError
from runner.keys import DECLARED

# ---------------------------------------------------------------------------------------------------------
# Flatten, diff, dump
# ---------------------------------------------------------------------------------------------------------
# how long a run trains: resume-safe, yet part of the default OUTPUT_DIR's name (and of TensorBoard's HParams)
RUN_LENGTH_KEYS = ("TRAIN.EPOCHS", "TRAIN.MAX_STEPS")
MISSING = "<missing>"  # stands for a key one config has and the other lacks, in diff_configs


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every dotted leaf key (MODEL.NAME) of a config or nested mapping with its value, in definition order."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping):  # a CfgNode section, or a section of YAML read as plain dicts
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def same_value(a: Any, b: Any) -> bool:
    """Equal config values: lists and tuples alike, true is not 1."""
    a, b = (list(v) if isinstance(v, tuple) else v for v in (a, b))
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def diff_configs(a: CN, b: CN) -> list[tuple[str, Any, Any]]:
    """(key, value in a, value in b) for every flattened key that differs; MISSING where a key is absent."""
    fa, fb = flatten(a), flatten(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    return [(k, fa.get(k, MISSING), fb.get(k, MISSING)) for k in keys
            if k not in fa or k not in fb or not same_value(fa[k], fb[k])]


def changed_from_defaults(cfg: CN, keep_output_dir: bool = False) -> dict[str, Any]:
    """Flattened keys whose value differs from the default (OUTPUT_DIR left out unless asked for)."""
    return {k: new for k, _, new in diff_configs(_C, cfg)
            if new is not MISSING and (keep_output_dir or k != "OUTPUT_DIR")}


def _to_dict(cfg: CN) -> dict[str, Any]:
    """Nested plain dicts with tuples as lists, ready for yaml.safe_dump; a literal ${ as $${ (read back as ${)."""
    return {k: _to_dict(v) if isinstance(v, CN) else escape(list(v) if isinstance(v, tuple) else v)
            for k, v in cfg.items()}


class _Dumper(yaml.SafeDumper):
    """Sections as blocks, lists inline ([0.485, 0.456, 0.406]), as a person would write the file."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def dump_config(cfg: CN) -> str:
    """The config as YAML text that gives back an identical config when loaded with --cfg."""
    return yaml.dump(_to_dict(cfg), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=10**6)


# ---------------------------------------------------------------------------------------------------------
# YAML text to entries (with file:line), entries onto a config
# ---------------------------------------------------------------------------------------------------------
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


def import_early(entries: list[Entry]) -> None:
    """Import the IMPORTS that `entries` set (the last one wins) before they are merged: the keys those modules
    declare (runner.keys) must be defaults by then. A value with ${...} waits for the merge, as before."""
    last = next((e for e in reversed(entries) if e.key == "IMPORTS"), None)
    if last is None or has_expression(last.value):
        return
    import_user_code(coerce_value("IMPORTS", last.value, (), last.raw, last.source), last.source)


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
    import_user_code(cfg.IMPORTS, provenance.get("IMPORTS", "default"))
    validate(cfg, provenance, check_files=False)
    cfg.freeze()
    return cfg


# ---------------------------------------------------------------------------------------------------------
# Key documentation (--help-keys): the comments of defaults.py and those of the declared keys are the documentation
# ---------------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------------
# Output folder
# ---------------------------------------------------------------------------------------------------------
def default_output_dir(files: list[str], overrides: list[tuple[str, Any]], cwd: str | None = None) -> str:
    """output/<config label>[-<tag from the overrides>]; the same arguments in the same folder give the same one."""
    stem = config_label(files, cwd or os.getcwd())
    # a repeated key: the last value wins. The run's length is resume-safe (a preempted run may be given more
    # epochs) but names the folder, so that an epochs ablation gets one run per value
    latest = {k: v for k, v in overrides if k not in RESUME_SAFE_KEYS or k in RUN_LENGTH_KEYS}
    if not latest:
        return os.path.join("output", stem)
    parts = [f"{_short_key(k)}={_fmt_tag(v)}" for k, v in sorted(latest.items())]
    readable = "-".join(parts)
    tag = _sanitize(readable)
    # a hash keeps folders apart when sanitizing lost information, a value has '=' in it, or the tag is long
    if tag != readable or any("=" in _fmt_tag(v) for v in latest.values()) or len(tag) > 60:
        digest = hashlib.sha1(repr(sorted(latest.items())).encode()).hexdigest()[:8]
        kept = [p for i, p in enumerate(_sanitize(p) for p in parts) if len("-".join(parts[:i + 1])) <= 48]
        tag = "-".join(kept or [tag[:48]]) + f"-{digest}"
    return os.path.join("output", f"{stem}-{tag}")


def config_label(files: list[str], cwd: str) -> str:
    """digits/resnet18 for configs/digits/resnet18.yaml; name-<hash of the path> for a file outside configs/;
    several files: the first label, '__', the other names and a hash of every path."""
    if not files:
        return "default"
    configs = os.path.join(os.path.abspath(cwd), "configs")
    full = [os.path.normpath(os.path.join(cwd, os.path.expanduser(f))) for f in files]
    labels = []
    for path in full:
        rel = os.path.relpath(os.path.splitext(path)[0], configs)
        if rel.split(os.sep)[0] != os.pardir:
            labels.append("/".join(_sanitize(part) for part in rel.split(os.sep)))
        else:  # a name alone could be shared by files in different folders
            labels.append(f"{_sanitize(_stem(path))}-{_digest(path)}")
    if len(labels) == 1:
        return labels[0]
    return "__".join([labels[0]] + [_sanitize(_stem(p)) for p in full[1:]]) + f"-{_digest(' '.join(full))}"


def _stem(path: str) -> str:
    """The file name without its extension."""
    return os.path.splitext(os.path.basename(path))[0]


def _digest(text: str) -> str:
    """8 hex digits that tell different texts apart in folder names."""
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _short_key(key: str) -> str:
    """The key's last part, lower-case, with its section when that part is not unique (model.name)."""
    last = key.split(".")[-1]
    same = [k for k in flatten(_C) if k.split(".")[-1] == last]
    return (last if len(same) == 1 else key).lower()


def _fmt_tag(value: Any) -> str:
    """A value as it reads in a folder name."""
    if isinstance(value, (tuple, list)):
        return ",".join(_fmt_tag(v) for v in value)
    return value if isinstance(value, str) else inline_yaml(value)


def _sanitize(text: str) -> str:
    """Only characters that are safe in a folder name on every system."""
    return re.sub(r"[^A-Za-z0-9._=-]", "_", text)
