"""Loading a config: argv, YAML files and their _BASE_ chains, KEY VALUE overrides, provenance for --explain.

defaults <- _BASE_ chains <- each --cfg file <- KEY VALUE overrides -> validate -> freeze
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from yacs.config import CfgNode as CN

from runner.config.compare import changed_from_defaults, flatten
from runner.config.defaults import _C, get_default_config
from runner.config.dump import dump_config
from runner.config.interp import STORED_CONFIG, Resolved, resolve, unescape, yaml_scalar
from runner.config.key_help import help_keys_text, suggest_key
from runner.config.keypath import get_value, inline_yaml, lookup, set_value
from runner.config.merge import apply_entries, chain_text, import_components, import_early
from runner.config.output_dir import default_output_dir
from runner.config.safe_yaml import Entry, parse_yaml
from runner.config.schema import COMMAND_LINE, coerce_value, expand_paths
from runner.config.validation import validate
from runner.errors import UserError, argument_error

# ---------------------------------------------------------------------------------------------------------
# Arguments and the whole load
# ---------------------------------------------------------------------------------------------------------
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass
class ConfigInfo:
    """How a config was assembled: the arguments, the files, the overrides and where each value came from."""

    args: argparse.Namespace
    files: list[str]
    overrides: list[tuple[str, Any]]  # (key, coerced value), in command-line order
    provenance: dict[str, str] = field(default_factory=dict)  # key -> "file:line" or "command line"
    history: dict[str, list[tuple[Any, str]]] = field(default_factory=dict)  # key -> every (value, source)
    resolved: Resolved = field(default_factory=Resolved)  # ${...}: expressions, environment read, stored values

    @property
    def showing(self) -> bool:
        """--print-config, --explain or --help-keys: the config is only shown, so no file it names is checked."""
        args = self.args
        return (getattr(args, "print_config", False) or getattr(args, "explain", False)
                or getattr(args, "help_keys", None) is not None)

    def config_text(self, cfg: CN) -> str:
        """The text --print-config shows: the merged config as YAML."""
        return dump_config(cfg)

    def explain_text(self, cfg: CN) -> str:
        """The text --explain shows: every non-default value and what set it."""
        changed = changed_from_defaults(cfg, keep_output_dir=True)
        changed.update({k: get_value(cfg, k) for k in self.resolved.expressions if k not in changed})
        if not changed:
            return "# every key has its default value\n"
        rows = [(k, inline_yaml(v), self._explain_source(k)) for k, v in changed.items()]
        wk, wv = max(len(r[0]) for r in rows), min(max(len(r[1]) for r in rows), 40)
        lines = ["# keys that differ from the defaults in runner/config/defaults.py, and what set them"]
        lines += [f"{k:<{wk}}  {v:<{wv}}  <- {src}" for k, v, src in rows]
        return "\n".join(lines) + "\n"

    def _explain_source(self, key: str) -> str:
        """Where `key` got its final value, with any earlier values it replaced."""
        src = self.provenance.get(key, "default")
        if key in self.resolved.expressions:
            src += f": {inline_yaml(self.resolved.expressions[key][0])}"
        if key in self.resolved.kept:
            src += (f" (${{env:...}} kept from {self.resolved.kept[key]}: a stored run never resolves again; "
                    "now it would read " + ", ".join(self.resolved.env_keys[key]) + ")")
        earlier = self.history.get(key, [])[:-1]
        if earlier:
            src += "  (replaced " + ", ".join(f"{inline_yaml(v)} from {s}" for v, s in earlier) + ")"
        return src


def build_parser(**kwargs: Any) -> argparse.ArgumentParser:
    """An argument parser with the config arguments, whose errors are one-line UserErrors."""
    kwargs.setdefault("allow_abbrev", False)
    kwargs.setdefault("epilog", "Any further KEY VALUE pairs override config keys, e.g. TRAIN.LR 0.05.")
    parser = argparse.ArgumentParser(**kwargs)
    add_config_arguments(parser)
    return parser


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --cfg, --print-config and --explain to `parser`, and make its errors one-line UserErrors."""
    parser.add_argument("--cfg", action="append", default=[], metavar="FILE",
                        help="YAML config file; repeat to layer several (later files win)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the merged config as YAML and exit")
    parser.add_argument("--explain", action="store_true",
                        help="print where every non-default value came from and exit")
    parser.add_argument("--help-keys", nargs="?", const="", default=None, metavar="PREFIX",
                        help="list the config keys (those starting with PREFIX, e.g. TRAIN or AUG.MIXUP) with "
                             "their defaults and what each means, and exit")
    parser.error = argument_error  # argparse would print usage and a second line


def load_config(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None,
                check_paths: bool = True) -> tuple[CN, ConfigInfo]:
    """Parse arguments, merge defaults <- files <- overrides, validate, freeze; UserError on any mistake.

    check_paths False skips the checks that data, weights and OUTPUT_DIR exist, for tools that read and write
    none of them (tools/flops.py); --print-config and --explain skip them too (they only show the config).
    DATA.NAME and its data source's rules are checked by runner.preflight.load_config, which tools call.
    """
    if parser is None:
        parser = build_parser()
    elif not any("--cfg" in a.option_strings for a in parser._actions):
        add_config_arguments(parser)
    parser.error = argument_error
    args, rest = parser.parse_known_args(argv)
    info = ConfigInfo(args=args, files=[os.path.expanduser(p) for p in args.cfg], overrides=[])
    files = [_file_entries(path, ()) for path in info.files]
    # the user's modules first: the keys they declare (runner.keys) are then known to the overrides and files
    import_early([e for entries in files for e in entries] + _command_line_imports(rest))
    options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    pairs = _pair_overrides(rest, options)
    cfg = get_default_config()
    _merge(cfg, info, pairs, files)
    if not cfg.OUTPUT_DIR:
        cfg.OUTPUT_DIR = default_output_dir(info.files, info.overrides)
        info.provenance["OUTPUT_DIR"] = "derived from the --cfg file path and the overrides"
    expand_paths(cfg)
    _keep_stored(cfg, info)
    # the user's modules register models, sources, sinks and schedules that validation must know
    import_components(cfg.IMPORTS, info.provenance.get("IMPORTS", "default"))
    validate(cfg, info.provenance, check_files=check_paths and not info.showing)
    cfg.freeze()
    return cfg, info


def import_config_imports(paths: list[str], extra: list[Entry] | None = None) -> None:
    """Import the IMPORTS that config files (their _BASE_ chains included) and `extra` set, as load_config does
    before the merge: for readers that check keys without building a config (a sweep file, a command-line grid)."""
    files = [e for path in paths for e in _file_entries(os.path.expanduser(path), ())]
    import_early(files + list(extra or ()))


def _command_line_imports(tokens: list[str]) -> list[Entry]:
    """An `IMPORTS VALUE` pair among the command line's tokens, as entries (before the tokens are paired)."""
    return [Entry("IMPORTS", yaml_scalar(tokens[i + 1]), tokens[i + 1], COMMAND_LINE)
            for i in range(len(tokens) - 1) if tokens[i] == "IMPORTS"]


def _merge(cfg: CN, info: ConfigInfo, pairs: list[tuple[str, str]], files: list[list[Entry]]) -> None:
    """Files (their entries, in order) then overrides onto `cfg`, then every ${...} resolved
    (runner.config.interp); info records it all."""
    pending: dict[str, Entry] = {}
    for entries in files:
        apply_entries(cfg, entries, info.provenance, info.history, pending)
    for key, token in pairs:
        apply_entries(cfg, [Entry(key, yaml_scalar(token), token, COMMAND_LINE)], info.provenance, info.history,
                      pending)
        info.overrides.append((key, get_value(cfg, key)))
    expand_paths(cfg)  # a reference to DATA.ROOT reads it as it is used: "~" expanded
    info.resolved = resolve(cfg, pending, suggest_key)
    for key in info.resolved.expressions:
        info.history[key][-1] = (get_value(cfg, key), info.history[key][-1][1])
    # an override's own value, as written or resolved (default_output_dir names the folder after the last one)
    info.overrides = [(k, get_value(cfg, k) if k in pending and i == _last(pairs, k) else v)
                      for i, (k, v) in enumerate(info.overrides)]


def _last(pairs: list[tuple[str, str]], key: str) -> int:
    """The index of `key`'s last override."""
    return max(i for i, (k, _) in enumerate(pairs) if k == key)


def _keep_stored(cfg: CN, info: ConfigInfo) -> None:
    """The keys that read the environment take the values of the run already in OUTPUT_DIR (its config.yaml)."""
    path = os.path.join(cfg.OUTPUT_DIR, STORED_CONFIG)
    if not info.resolved.env_keys or not os.path.isfile(path):
        return
    try:
        stored = {e.key: e for e in parse_yaml(_read(path), path)[1]}
    except UserError:
        return  # not a config of ours: the claim says so, with its own words
    for key in info.resolved.env_keys:
        if key in stored and key != "OUTPUT_DIR":  # the folder was found with this run's value
            value = coerce_value(key, unescape(stored[key].value), lookup(key), stored[key].raw, stored[key].source)
            set_value(cfg, key, value)
            info.resolved.kept[key] = path


def config_command(argv: list[str] | None, parser: argparse.ArgumentParser | str,
                   check_paths: bool = True) -> tuple[CN, ConfigInfo] | None:
    """Every tool's opening: argv to a frozen config; None when --print-config/--explain already answered.

    `parser` is the tool's own (with its extra flags) or, for a tool with none, its description text.
    """
    if isinstance(parser, str):
        parser = build_parser(description=parser, formatter_class=argparse.RawDescriptionHelpFormatter)
    cfg, info = load_config(argv, parser, check_paths=check_paths)
    return None if handle_info_flags(cfg, info) else (cfg, info)


def handle_info_flags(cfg: CN, info: ConfigInfo) -> bool:
    """Print --print-config / --explain output if asked; True means the caller should exit 0 now."""
    shown = False
    if getattr(info.args, "help_keys", None) is not None:
        sys.stdout.write(help_keys_text(info.args.help_keys))
        shown = True
    if getattr(info.args, "print_config", False):
        sys.stdout.write(info.config_text(cfg))
        shown = True
    if getattr(info.args, "explain", False):
        sys.stdout.write(info.explain_text(cfg))
        shown = True
    sys.stdout.flush()
    return shown


def _pair_overrides(tokens: list[str], options: list[str]) -> list[tuple[str, str]]:
    """Split the leftover command-line tokens into (KEY, VALUE) pairs, refusing stray flags and odd lists."""
    leaf_keys = flatten(_C)
    pairs, i = [], 0
    for tok in tokens:
        if tok.startswith("--") or re.match(r"^-[A-Za-z]", tok):
            name = tok.split("=")[0]
            if name.lstrip("-") in leaf_keys:
                raise UserError(f"unknown option {tok}: config keys take no dashes: {name.lstrip('-')} VALUE")
            close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UserError(f"unknown option {tok}{hint} (options: {', '.join(options)}; config keys are "
                            "given as KEY VALUE without dashes)")
    while i < len(tokens):
        key = tokens[i]
        if key not in leaf_keys:
            raise UserError(_bad_key_token(key, tokens[:i]))
        if i + 1 >= len(tokens):
            raise UserError(f"{key} has no value: overrides come in KEY VALUE pairs, e.g. {key} "
                            f"{inline_yaml(get_value(_C, key))}")
        if tokens[i + 1] in leaf_keys:
            raise UserError(f"{key} has no value (it is followed by the key {tokens[i + 1]}): "
                            "overrides come in KEY VALUE pairs")
        pairs.append((key, tokens[i + 1]))
        i += 2
    return pairs


def _bad_key_token(tok: str, before: list[str]) -> str:
    """The message for a token standing where a KEY should be."""
    section = lookup(tok.upper())
    if isinstance(section, CN):
        return f"{tok} is a section, not a key: name a key in it, e.g. {tok.upper()}.{next(iter(section))}"
    if _KEY_RE.match(tok) and ("." in tok or tok.isupper()):
        return f"unknown config key {tok} on the command line{suggest_key(tok)}"
    after = f" (after {' '.join(before[-2:])})" if before else ""
    return (f"value {tok!r} has no key{after}: overrides come in KEY VALUE pairs, e.g. TRAIN.LR 0.05")


# ---------------------------------------------------------------------------------------------------------
# YAML files and their _BASE_ chains
# ---------------------------------------------------------------------------------------------------------
def _file_entries(path: str, chain: tuple[str, ...], named_at: str = "") -> list[Entry]:
    """The entries of `path` after those of its _BASE_ files (recursively), in merge order."""
    where = named_at or "--cfg"
    if not path:
        raise UserError(f"empty config file path (from {where}): give the path of a YAML file")
    if path.endswith(".py"):
        raise UserError(f"{path} (from {where}): Python config files are not supported (they would be "
                        "executed); write the config as YAML")
    if not os.path.isfile(path):
        what = ("is a directory, not a config file" if os.path.isdir(path) else
                "is not a regular file (a device, pipe or socket)" if os.path.exists(path) else "not found")
        raise UserError(f"config file {path} {what} (from {where}{chain_text(chain)}){_suggest_file(path)}")
    real = os.path.realpath(path)
    if real in {os.path.realpath(c) for c in chain}:
        raise UserError("_BASE_ cycle: " + " -> ".join(chain + (path,)))
    chain = chain + (path,)
    bases, entries = parse_yaml(_read(path), path, chain)
    out: list[Entry] = []
    for base, line in bases:
        base_path = os.path.normpath(os.path.join(os.path.dirname(path), os.path.expanduser(base)))
        out += _file_entries(base_path, chain, f"_BASE_ at {path}:{line}")
    return out + entries


def _read(path: str) -> str:
    """The text of a config file, or a UserError saying why it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config file {path}: {e}") from None


def _suggest_file(path: str) -> str:
    """'; did you mean X?' with a similarly named file next to `path`, or ''."""
    if os.path.isdir(path):  # name a file in it rather than its neighbour
        try:
            inside = sorted(n for n in os.listdir(path) if n.endswith((".yaml", ".yml")))
        except OSError:
            inside = []
        return f"; did you mean {os.path.join(path, inside[0])}?" if inside else ""
    folder = os.path.dirname(path) or "."
    try:
        names = [n for n in os.listdir(folder) if n.endswith((".yaml", ".yml"))]
    except OSError:
        return ""
    close = difflib.get_close_matches(os.path.basename(path), names, n=1, cutoff=0.6)
    return f"; did you mean {os.path.join(os.path.dirname(path), close[0])}?" if close else ""
