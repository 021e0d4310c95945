"""`python -m runner.sweep run`: a sweep file's points on this machine, then one table (tools/sweeps/run.sh execs it).

    python -m runner.sweep run [--jobs N] [--num-gpus N] [--nproc N] [--max-restarts N] [--root DIR] \
        FILE [KEY VALUE ...]
    python -m runner.sweep run [...] --cfg CONFIG --grid KEY V1,V2 [--grid ...] [KEY VALUE ...]

Each option's default is its environment variable, as run.sh has always read them: JOBS, NUM_GPUS, NPROC,
MAX_RESTARTS, SWEEP_ROOT; PYTHON is the interpreter of the points and workers (default: this one), SWEEP_RECHECK=1
lets train.py judge done points. Every point's config (or the search) is checked first, in this process: a
mistake is one line and exit 2 before anything starts. A done point is skipped without starting Python (its
folder's results.json, read by runner.rundir's reader). JOBS points run at once (launch_pool.py: logs, signals,
exit codes), each on its own GPUs (launch_devices.py: CUDA_VISIBLE_DEVICES, else nvidia-smi; NUM_GPUS caps or sets
the count), under torchrun with its own rendezvous port when NPROC is given. A file with search: runs JOBS workers of
`python -m runner.sweep search --no-table FILE` (with NPROC: `--nproc N`, NPROC GPUs per worker), then the
study's table; points end with tools/summarize.py's table of ROOT.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from runner.errors import UserError
from runner.rundir import reader
from runner.rundir.layout import RESULTS
from runner.sweep.launch_devices import default_jobs, free_port, gpu_list, slot_env
from runner.sweep.launch_pool import Pool, say, shell_word
from runner.sweep.points import Point, load_points
from runner.sweep.spec import read_sweep

REPO = Path(__file__).resolve().parents[2]
OPTIONS = {"--jobs": "JOBS", "--num-gpus": "NUM_GPUS", "--nproc": "NPROC", "--max-restarts": "MAX_RESTARTS",
           "--root": "SWEEP_ROOT"}
UNSET_WHEN_EMPTY = ("NUM_GPUS", "NPROC", "MAX_RESTARTS", "SWEEP_ROOT")  # JOBS= (empty) is a mistake, as it was


class LaunchError(UserError):
    """A mistake in the launcher's settings: one line starting `sweep:`, exit 2, nothing started."""


@dataclass
class Setting:
    """One setting's text as given (None: not given) and how the user gave it (JOBS=... or --jobs ...)."""

    name: str
    value: str | None
    flag: str | None = None

    def shown(self, value: str) -> str:
        """The setting as the user would write it with `value`."""
        return f"{self.flag} {value}" if self.flag else f"{self.name}={value}"

    def count(self, least: int = 1) -> int | None:
        """The value as a whole number of at least `least` (leading zeros are decimal); None when not given."""
        if self.value is None:
            return None
        if not re.fullmatch(r"[0-9]+", self.value) or int(self.value) < least:
            raise LaunchError(f"{self.shown(self.value)} is not a whole number of at least {least}; e.g. "
                              f"{self.shown('2')}")
        return int(self.value)


@dataclass
class Launch:
    """The command line read: what names the launcher in messages, the settings, FILE (or --cfg ...) and the rest."""

    prog: str
    settings: dict[str, Setting]
    args: list[str]


def parse(argv: list[str]) -> Launch:
    """Options (each defaulting to its environment variable) and the sweep's own arguments."""
    prog, args = "python -m runner.sweep run", list(argv)
    settings = {name: Setting(name, _env(name)) for name in OPTIONS.values()}
    while args and args[0].startswith("--") and args[0] != "--cfg" and not args[0].startswith("--cfg="):
        flag, eq, value = args.pop(0).partition("=")
        if flag not in (*OPTIONS, "--prog") or (not eq and not args):
            raise LaunchError(f"{flag}: unknown option or one without a value; usage: {usage(prog)}")
        value = value if eq else args.pop(0)
        if flag == "--prog":  # tools/sweeps/run.sh: its own name in the messages
            prog = value
        else:
            settings[OPTIONS[flag]] = Setting(OPTIONS[flag], value, flag)
    if not args:
        raise LaunchError(f"no sweep file given; usage: {usage(prog)}")
    return Launch(prog, settings, args)


def usage(prog: str) -> str:
    """The usage line, naming the launcher as the user called it."""
    return f"{prog} FILE [KEY VALUE ...] (e.g. configs/sweeps/lr_x_model.yaml; docs/SWEEPS.md)"


def _env(name: str) -> str | None:
    """An environment variable's text; None when unset (or empty, for those that always read empty as unset)."""
    value = os.environ.get(name)
    return None if value is None or (value == "" and name in UNSET_WHEN_EMPTY) else value


def interpreter() -> str:
    """PYTHON (a program on PATH or a path), else this interpreter: what runs every point and worker."""
    py = os.environ.get("PYTHON") or sys.executable
    if shutil.which(py) is None:
        raise LaunchError(f"PYTHON={py} is not a program found on PATH; give the interpreter")
    return py


def read_plan(path: str, extra: list[str], root: str | None, check_paths: bool = True) -> tuple[str, str, list]:
    """(kind, root, points): `points` (grid:/points:, every point's config built) or `search` (its search
    checked, no points); a mistake is one line. `root` (SWEEP_ROOT) is refused for a search."""
    sweep = read_sweep(path)
    if sweep.search is None:
        sweep, points = load_points(path, extra, root=root, check_paths=check_paths)
        return "points", root if root is not None else sweep.root, points
    if root is not None:
        raise UserError(f"sweep {path}: a search keeps its study in its file's root: ({sweep.root}); unset "
                        "SWEEP_ROOT and give root: in the file instead")
    from runner.sweep.search import load_search  # the data sources' table: only for a search

    return "search", load_search(path, extra).root, []


def grid_file(launch: Launch, root: str | None) -> str:
    """The sweep file written for `--cfg FILE --grid KEY V1,V2 ...` (runner/sweep/grid.py), said once."""
    from runner.sweep.grid import grid_command

    path = grid_command([*(["--root", root] if root else []), *launch.args])
    say(f"sweep: wrote {path} (re-run it: {launch.prog} {shell_word(path)})")
    return path


def point_done(point: Point) -> bool:
    """True when the point's folder is a done run, as runner.rundir's reader says (no torch, no new process)."""
    if os.environ.get("SWEEP_RECHECK"):  # let train.py decide (e.g. after raising TRAIN.EPOCHS)
        return False
    # the file contract (runner/rundir/layout.py): a done run has results.json; without it nothing more is read
    return os.path.exists(os.path.join(point.output_dir, RESULTS)) and reader.state(point.output_dir) == "done"


def open_pool(slots: int, root: str, unit: str, torchrun: bool) -> Pool:
    """The pool, its root made and its signals taken; the processes share this machine's cores."""
    if slots > 1:  # as torchrun's local ranks do (runner/process/threads.py)
        os.environ.setdefault("RUNNER_CPU_SHARE", str(slots))
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        raise LaunchError(f"the sweep's root {root} cannot be made a folder; give a folder path") from None
    pool = Pool(slots, root, unit, torchrun)
    pool.install()
    say(f"sweep: {root}, {slots} {unit}(s) at a time")
    return pool


def check_nproc(setting: Setting, gpus: list[str]) -> int | None:
    """NPROC as a count no larger than the GPUs found (any count on the CPU)."""
    nproc = setting.count()
    if nproc is not None and gpus and nproc > len(gpus):
        raise LaunchError(f"{setting.shown(str(nproc))} is more than the {len(gpus)} GPU(s) found; give "
                          f"{setting.shown(str(len(gpus)))} or less")
    return nproc


def run_points(launch: Launch, py: str, root: str, points: list[Point], gpus: list[str]) -> int:
    """Every point not done, JOBS at once (under torchrun with NPROC), then the table; the exit code."""
    settings = launch.settings
    nproc = check_nproc(settings["NPROC"], gpus)
    restarts = (settings["MAX_RESTARTS"].count(0) or 0) if nproc is not None else 0
    jobs = settings["JOBS"].count() or default_jobs(gpus, nproc or 1)
    pool = open_pool(jobs, root, "point", torchrun=nproc is not None)
    skipped = 0
    for point in points:
        if pool.stopping:
            break
        if point_done(point):
            say(f"sweep: skip {point.name} (done)")
            skipped += 1
            continue
        slot = pool.free_slot()
        env = slot_env(gpus, slot, nproc or 1)
        train = [py, str(REPO / "tools" / "train.py"), *point.argv]
        if nproc is None:
            pool.start(slot, point.name, train, env, point.output_dir)
            continue
        port = free_port(pool.ports)
        rdzv_id = re.sub(r"[^A-Za-z0-9_.-]", "_", point.name)
        torchrun = [py, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
                    f"--max-restarts={restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint=localhost:{port}",
                    f"--rdzv-id={rdzv_id}", *train[1:]]
        pool.start(slot, point.name, torchrun, env, point.output_dir, port)
    pool.wait_all()
    subprocess.run([py, str(REPO / "tools" / "summarize.py"), root, "--sort", "best/val/top1"], check=False)
    return pool.verdict(skipped)


def run_search(launch: Launch, py: str, root: str, gpus: list[str]) -> int:
    """JOBS workers of the search until the study is done, then its table; the exit code."""
    nproc = check_nproc(launch.settings["NPROC"], gpus)
    jobs = launch.settings["JOBS"].count() or default_jobs(gpus, nproc or 1)
    pool = open_pool(jobs, root, "worker", torchrun=False)
    opts = ["--nproc", str(nproc)] if nproc is not None else []
    for k in range(jobs):
        slot = pool.free_slot()
        argv = [py, "-m", "runner.sweep", "search", "--no-table", *opts, *launch.args]
        pool.start(slot, f"worker_{k}", argv, slot_env(gpus, slot, nproc or 1))
    pool.wait_all()
    subprocess.run([py, "-m", "runner.sweep", "search", "--table", *launch.args], check=False)
    return pool.verdict(0)


def run_command(argv: list[str]) -> int:
    """The launcher: settings, plan, pool, table; a setting's mistake is one `sweep:` line and exit 2."""
    try:
        return _run(parse(argv))
    except LaunchError as e:
        say(f"sweep: {e}", err=True)
        return e.exit_code


def _run(launch: Launch) -> int:
    """Everything checked before anything starts, then the points or the search's workers."""
    settings = launch.settings
    settings["JOBS"].count()
    gpus = gpu_list(settings["NUM_GPUS"].count(0))
    py = interpreter()
    root = settings["SWEEP_ROOT"].value
    if launch.args[0] == "--cfg" or launch.args[0].startswith("--cfg="):
        launch.args = [grid_file(launch, root)]
        root = None  # the written file's root: is the folder it lies in (SWEEP_ROOT's, when given)
    kind, root, points = read_plan(launch.args[0], launch.args[1:], root)
    if kind == "search":
        return run_search(launch, py, root, gpus)
    return run_points(launch, py, root, points, gpus)
