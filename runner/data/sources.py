"""DATA.NAME -> Source: every data source a run can read, in one torch-free table.

A source is one module and one line. The module (anywhere importable; torch only inside `build`) defines
    build(cfg, dist) -> DataBundle                 the train and val loaders (runner/data/loaders.py: the contract)
    check(cfg, fail, check_files, world) -> None   optional: the source's own config rules, said before OUTPUT_DIR
                                                   is claimed; `fail(key, message)` raises the one-line mistake
    known_split(cfg) -> (samples, classes)         optional: the training split's size and classes known without
                                                   loading (runner/preflight.py checks the batch and classes)
    build_split(cfg, dist, name) -> loader         optional: an evaluation loader over another split of the data
                                                   (DATA.TEST_SPLIT, tools/eval.py --split); without it the source
                                                   refuses DATA.TEST_SPLIT in one line
and the line is `register("name", "package.module", ...)` below (a plugin may call `register` itself). The line
says what the rest of the runner asks of a source instead of branching on DATA.NAME (nothing outside
runner/data/ does): see `Source`'s fields. Importing this table imports no torch; a source's module is
imported when it is checked or built.
"""
from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn

from runner.errors import UserError

Fail = Callable[[str, str], NoReturn]  # fail(key, message): the mistake in one line, with where `key` was set


@dataclass(frozen=True)
class Source:
    """One DATA.NAME: the module that builds and checks it, and what the rest of the runner asks of it."""

    name: str
    module: str  # "package.module" holding build, and optionally check and known_split
    files: str = ""  # what DATA.ROOT holds: "folder" (class folders of images), "shards" (tar shards), "" nothing;
    # with files, images are decoded through timm's transforms (AUG.*, EVAL.CROP_PCT apply, AUG.SHIFT does not)
    # and tools/check_data.py reads them all
    run_class_map: bool = False  # the claim writes OUTPUT_DIR/class_map.json (class names from DATA.ROOT's folders)
    in_process: bool = False  # tensors made in the training process: no DataLoader, so no workers to tune
    worker_modules: tuple[str, ...] = ()  # what its loader workers unpickle: the fork server, started before the
    # run's own imports (runner/data/workerstart.py), imports them once for all workers
    resizes: bool = True  # its training batches are square image tensors that DATA.IMG_SIZE_SCHEDULE may resize
    # (runner/data/resize.py, on the device: every built-in source); False refuses the key in one line

    def _load(self) -> ModuleType:
        """The source's module, imported now."""
        return importlib.import_module(self.module)

    def build(self, cfg: Any, dist: Any) -> Any:
        """The run's DataBundle (imports the source's heavy parts)."""
        return self._load().build(cfg, dist)

    def check(self, cfg: Any, fail: Fail, check_files: bool = True, world: int = 1) -> None:
        """The source's own config rules (a no-op for a source without them)."""
        rules = getattr(self._load(), "check", None)
        if rules is not None:
            rules(cfg, fail, check_files, world)

    def has_splits(self) -> bool:
        """Whether the source has splits beyond train and val (a test split) that build_split can load."""
        return hasattr(self._load(), "build_split")

    def build_split(self, cfg: Any, dist: Any, split: str) -> Any:
        """An evaluation loader over the source's split `split`; a one-line UserError for a source without one."""
        if not self.has_splits():
            raise UserError(no_split(self.name, split))
        return self._load().build_split(cfg, dist, split)

    def known_split(self, cfg: Any) -> tuple[int, int] | None:
        """(training samples, classes) known without loading; None when only reading the data tells."""
        size = getattr(self._load(), "known_split", None)
        return None if size is None else size(cfg)


SOURCES: dict[str, Source] = {}


def register(name: str, module: str, **attributes: Any) -> Source:
    """Add a source under DATA.NAME `name` (`attributes`: Source's fields); the one line a new source needs."""
    SOURCES[name] = Source(name, module, **attributes)
    return SOURCES[name]


# The sources, one line each; the order is the order of the names in messages.
register("digits", "runner.data.digits", in_process=True)
register("folder", "runner.data.folder.source", files="folder", run_class_map=True,
         worker_modules=("runner.data.folder.dataset",))
register("synthetic", "runner.data.synthetic", in_process=True)
register("shards", "runner.data.shards.source", files="shards", worker_modules=("runner.data.shards.stream",))
register("hf", "runner.data.hf", files="hf", run_class_map=True,
         worker_modules=("runner.data.folder.dataset", "runner.data.hf", "datasets"))
register("torchvision", "runner.data.tvsets", files="torchvision", run_class_map=True,
         worker_modules=("runner.data.folder.dataset", "runner.data.tvsets", "torchvision.datasets"))


def names() -> list[str]:
    """The DATA.NAME values the table knows, in its order."""
    return list(SOURCES)


def unknown_name(name: Any) -> tuple[str, str]:
    """(the mistake, a did-you-mean hint or '') for a DATA.NAME the table does not know."""
    known = names()
    close = difflib.get_close_matches(str(name).lower(), known, n=1, cutoff=0.5)
    return f"DATA.NAME must be one of {'|'.join(known)}, got {name!r}", f"; did you mean {close[0]}?" if close else ""


def no_split(name: str, split: str) -> str:
    """The one line for a split asked of a source that only has train and val."""
    with_splits = [n for n, src in SOURCES.items() if src.files]
    return (f"DATA.NAME {name} has no {split!r} split (only train and val); a test split is read from files: "
            f"DATA.NAME {'|'.join(with_splits)} (a folder's or the shards' DATA.ROOT/{split or 'test'}/, a Hugging "
            "Face or torchvision set's own split)")


def source(name: str) -> Source:
    """The source called `name`; a one-line UserError listing the known names otherwise."""
    if name not in SOURCES:
        raise UserError("".join(unknown_name(name)))
    return SOURCES[name]


def check_config(cfg: Any, provenance: dict[str, str] | None = None, check_files: bool = True,
                 world: int = 1) -> None:
    """DATA.NAME known, then its source's rules; the first mistake one line, naming where its key was set."""

    def fail(key: str, message: str, hint: str = "") -> NoReturn:
        where = f" ({provenance.get(key, 'default')})" if provenance is not None else ""
        raise UserError(f"{message}{where}{hint}")

    if cfg.DATA.NAME not in SOURCES:
        fail("DATA.NAME", *unknown_name(cfg.DATA.NAME))
    src = SOURCES[cfg.DATA.NAME]
    if cfg.DATA.IMG_SIZE_SCHEDULE and not src.resizes:
        fail("DATA.IMG_SIZE_SCHEDULE", f"DATA.NAME {src.name} cannot resize its training batches, so it takes no "
                                       "DATA.IMG_SIZE_SCHEDULE (its source says resizes=False); remove the key")
    if cfg.DATA.TEST_SPLIT and not src.has_splits():
        fail("DATA.TEST_SPLIT", no_split(src.name, cfg.DATA.TEST_SPLIT))
    if cfg.DATA.TEST_SPLIT in ("train", "val"):
        fail("DATA.TEST_SPLIT", f"DATA.TEST_SPLIT {cfg.DATA.TEST_SPLIT!r} is a split the run trains or validates "
                                "on; name a held-out one, e.g. test")
    src.check(cfg, fail, check_files, world)
