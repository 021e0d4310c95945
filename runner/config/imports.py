"""IMPORTS: the user's own modules, imported when a tool's opening loads its config, before the config is checked.

An entry is a module name (imported as Python imports it: an installed package or one on PYTHONPATH; nothing here
edits sys.path) or the path of a .py file ("~" expanded; a relative path is relative to the current folder, as
DATA.ROOT is), loaded under its file name without .py. Importing one is what registers its names: a timm model
(`@register_model`), a data source (`runner.data.sources.register`), a sink (`runner.sinks.catalog.SINKS`), an
LR schedule (`runner.optim.register_schedule`), so the validation that follows sees them. Each module is imported
once per process (as `import` does); `imported_files` says which file each entry ran and its sha256, for env.txt.
Importing this module does nothing.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from types import ModuleType
from typing import Any

from runner.errors import UserError

_RAN: dict[str, tuple[str, str]] = {}  # entry -> (the file it ran, that file's sha256 when it was imported)


def is_file_entry(entry: str) -> bool:
    """A path of a .py file rather than a module name."""
    return entry.endswith(".py") or "/" in entry or os.sep in entry


def import_user_code(entries: Any, where: str) -> None:
    """Import each IMPORTS entry in order; a missing or failing one is a one-line UserError naming `where`."""
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            raise UserError(f"IMPORTS entries are module names or .py file paths, got {entry!r} ({where})")
        if entry in _RAN:
            continue
        module = _import_file(entry, where) if is_file_entry(entry) else _import_module(entry, where)
        path = getattr(module, "__file__", None) or ""
        _RAN[entry] = (os.path.abspath(path) if path else "", file_sha256(path) if path else "")


def imported_files(entries: Any) -> list[tuple[str, str, str]]:
    """(entry, file, sha256) for each IMPORTS entry this process imported ('' for a module without a file)."""
    return [(entry, *_RAN[entry]) for entry in entries if entry in _RAN]


def file_sha256(path: str) -> str:
    """The sha256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _failure(entry: str, where: str, error: BaseException) -> UserError:
    """The one line for a module that raised while importing: its exception's last line."""
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    return UserError(f"IMPORTS: importing {entry} failed ({where}): {last}")


def _import_module(name: str, where: str) -> ModuleType:
    """`import name`; a module that is not found (itself, not one it imports) is said as such."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
            raise UserError(f"IMPORTS: no module named {name} ({where}): install it, put its folder on "
                            "PYTHONPATH, or give the path of its .py file") from None
        raise _failure(name, where, e) from None
    except (Exception, SystemExit) as e:  # the user's code may raise anything while it runs
        raise _failure(name, where, e) from None


def _import_file(entry: str, where: str) -> ModuleType:
    """Load a .py file as the module named by its file name (registered in sys.modules first: timm's
    @register_model looks its module up there)."""
    path = os.path.expanduser(entry)
    if not path.endswith(".py"):
        raise UserError(f"IMPORTS: {entry} is not a .py file or a module name ({where})")
    if not os.path.isfile(path):
        raise UserError(f"IMPORTS: file {entry} not found ({where}; a relative path is relative to the current "
                        f"folder, {os.getcwd()})")
    name = os.path.splitext(os.path.basename(path))[0]
    known = sys.modules.get(name)
    if known is not None and os.path.realpath(getattr(known, "__file__", "") or "") == os.path.realpath(path):
        return known  # the same file under another spelling of its path
    if known is not None:
        raise UserError(f"IMPORTS: {entry} would be imported as module {name}, but a module of that name is "
                        f"already loaded from elsewhere ({where}): rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:
        del sys.modules[name]  # as a failed import leaves nothing behind
        raise _failure(entry, where, e) from None
    return module
