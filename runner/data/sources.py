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
runner/data/ does): see `Source`'s fields; its `keys=` are the source's own config keys (runner.keys.Key: default,
comment, rule, resume_safe), added to the defaults after the key `after=`, and its `doc=` its line in DATA.NAME's
--help-keys text. Importing this table imports no torch; a source's module is
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
from runner.keys import Key, at_least, declare

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
    doc: str = ""  # what it reads, in a few words: DATA.NAME's --help-keys text lists it

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


def register(name: str, module: str, keys: tuple[Key, ...] = (), after: str = "", **attributes: Any) -> Source:
    """Add a source under DATA.NAME `name` (`attributes`: Source's fields); the one line a new source needs.

    `keys`: its own config keys (runner.keys.Key), placed after the key `after` ('' = at their section's end).
    """
    declare(keys, owner=f"source {name}", after=after)
    SOURCES[name] = Source(name, module, **attributes)
    return SOURCES[name]


def name_comment() -> str:
    """DATA.NAME's --help-keys text, from the table."""
    return "\n".join(["Dataset, a name in runner/data/sources.py's table (whose source checks its own keys):"]
                     + [f"  {name}: {src.doc}" if src.doc else f"  {name}" for name, src in SOURCES.items()])


declare([Key("DATA.NAME", "digits", name_comment)], owner="sources", after="DATA")

# The sources' own keys, declared with their sources below
SYNTHETIC_KEYS = (
    Key("DATA.SYNTHETIC_SIZE", 1024,
        "Number of images in the synthetic dataset",
        check=at_least(1)),
)
# DATA.HF_STREAMING reads SHARD_STREAMS and SHARD_WINDOW too. SHARD_URL, SHARD_RETRIES and RETRY_S are resume_safe:
# they say where the same shards are read from, and how patiently
SHARD_KEYS = (
    Key("DATA.SHARD_URL", "",
        "DATA.NAME shards (webdataset tar shards, KEY.jpg + KEY.cls, as tools/make_shards.py writes "
        "them): DATA.ROOT (a folder or an http(s) base URL) holds class_map.json and "
        "{train,val}/index.json (shard names, sample counts). Where each shard is read from: a template "
        "with {root}, {split}, {name}: a path, an http(s) URL or webdataset's pipe:COMMAND (e.g. "
        '"pipe:aws s3 cp s3://bucket/{split}/{name} -"; a shell command from the config: a config file is '
        'code to trust; each placeholder is quoted as one shell word, so do not quote it yourself); "" = '
        "{root}/{split}/{name}", resume_safe=True),
    Key("DATA.TRAIN_SHARDS", "",
        'Train shards to use: a brace pattern of shard names ("train-{000000..000099}.tar", several '
        'joined by ::); "" = every shard in the train index'),
    Key("DATA.SHARD_STREAMS", 8,
        "Streams the training order is cut into (like MosaicML's canonical nodes): the order depends on "
        "SEED, the epoch, this and SHARD_WINDOW only, so a run resumes exactly on any number of processes "
        "dividing it; each process reads the streams k = rank (mod processes), its loader workers a "
        "disjoint share of those",
        check=at_least(1)),
    Key("DATA.SHARD_WINDOW", 1000,
        "Shuffle window, in samples: each stream is shuffled within consecutive blocks of this many "
        "samples. Memory per rank: about 2 x SHARD_WINDOW x SHARD_STREAMS / processes encoded images "
        "(plus one step's samples)",
        check=at_least(1)),
    Key("DATA.SHARD_RETRIES", 3,
        "Tries to fetch a shard (or the index) before the run stops with one line naming it", resume_safe=True,
        check=at_least(1)),
    Key("DATA.RETRY_S", 120.0,
        "Seconds a data server may keep failing with a fault that passes (HTTP 5xx, a refused or reset "
        "connection, a read that gets no byte for min(this, 60) s) before the run saves at its last "
        "optimizer step and exits 75 (preempted: the same command continues it); retried with backoff "
        "meanwhile; 0 = stop at the first such fault", resume_safe=True,
        check=at_least(0)),
)
HF_KEYS = (
    Key("DATA.TRAIN_SPLIT", "",
        'DATA.NAME hf: the split to train on; "" = train'),
    Key("DATA.VAL_SPLIT", "",
        'DATA.NAME hf: the split to validate on; "" = the first of validation, val, valid, test the '
        "dataset has (none: DATA.VAL_FRACTION of the train split is held out, the same rows for the same "
        "SEED)"),
    Key("DATA.IMAGE_COLUMN", "",
        'DATA.NAME hf: the column holding the images; "" = the one column with an Image feature'),
    Key("DATA.LABEL_COLUMN", "",
        'DATA.NAME hf: the column holding the labels; "" = the one ClassLabel column (its names are the '
        "class names), else a column called label or labels (integers: the class indices; strings: "
        "classes sorted by name)"),
    Key("DATA.HF_STREAMING", False,
        "DATA.NAME hf: read the dataset's parquet files as streams, never downloaded or loaded whole "
        "(sets beyond the disk): the order is DATA.NAME shards' (SHARD_STREAMS fixed streams over the "
        "train split's files, shuffled within SHARD_WINDOW rows; a function of SEED and the epoch only), "
        "each process reading streams k = rank (mod processes), each loader worker its share, the epoch's "
        "length from the files' parquet footers. Needs parquet files (the Hub's layout), a val split "
        "(none is held out of a stream) and labels that are class indices (ClassLabel or integers). Mid- "
        "epoch and elastic resume are exact on any number of processes dividing SHARD_STREAMS and any "
        "number of workers (a resume refuses a change of SHARD_STREAMS or SHARD_WINDOW), as long as the "
        "split's files are unchanged: a file with fewer rows than at the start is one line, but files "
        "added or removed, or rows rewritten, give another order or other images unnoticed; so a Hub "
        "dataset given a new commit since the run began is no longer the same run: stream a copy you "
        "control. Each epoch leaves out (rows mod SHARD_STREAMS) rows, as shards do"),
)
# DATA.SET names an hf dataset's configuration too; DOWNLOAD is resume_safe: it says how the same files arrive
TORCHVISION_KEYS = (
    Key("DATA.SET", "",
        "DATA.NAME torchvision: the classic set to read from DATA.ROOT (torchvision.datasets, in its own "
        "on-disk layout): cifar10 | cifar100 | mnist | fashion-mnist | kmnist | svhn | stl10 | flowers102 "
        "(test: DATA.TEST_SPLIT test) | oxford-pets | food101 (val is each set's test split, flowers102's "
        "val). Grayscale sets (mnist, fashion-mnist, kmnist) train with MODEL.IN_CHANS 1 (one DATA.MEAN "
        "and DATA.STD value) or are converted to RGB for 3. DATA.NAME hf: the dataset's configuration "
        '(subset) name; "" = its default'),
    Key("DATA.DOWNLOAD", False,
        "DATA.NAME torchvision: download the set into DATA.ROOT when its files are missing (rank 0 "
        "downloads, then each other node's local rank 0 where DATA.ROOT is not shared; the other ranks "
        "wait at a barrier, up to DIST.TIMEOUT_S); false = refuse missing files", resume_safe=True),
)

# The sources, one line each; the order is the order of the names in messages.
register("digits", "runner.data.digits", in_process=True, doc="sklearn 8x8 digits, in memory")
register("folder", "runner.data.folder.source", files="folder", run_class_map=True,
         worker_modules=("runner.data.folder.dataset",), doc="ImageFolder layout under DATA.ROOT")
register("synthetic", "runner.data.synthetic", in_process=True, keys=SYNTHETIC_KEYS, after="DATA.VAL_FRACTION",
         doc="random images of DATA.SYNTHETIC_SIZE, in memory")
register("shards", "runner.data.shards.source", files="shards", worker_modules=("runner.data.shards.stream",),
         keys=SHARD_KEYS, after="DATA.REPEATED_AUG", doc="webdataset tar shards under DATA.ROOT, streamed: see SHARD_*")
register("hf", "runner.data.hf", files="hf", run_class_map=True,
         worker_modules=("runner.data.folder.dataset", "runner.data.hf", "datasets"), keys=HF_KEYS,
         after="DATA.DOWNLOAD", doc="a Hugging Face dataset: DATA.ROOT is its Hub repo id or a local path")
register("torchvision", "runner.data.tvsets", files="torchvision", run_class_map=True,
         worker_modules=("runner.data.folder.dataset", "runner.data.tvsets", "torchvision.datasets"),
         keys=TORCHVISION_KEYS, after="DATA.RETRY_S", doc="the classic set DATA.SET under DATA.ROOT")


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
