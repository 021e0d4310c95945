"""`python -m runner.sweep search`: one worker of a sweep file's search, then the study's table."""
from __future__ import annotations

import functools

from optuna.trial import TrialState

from runner.errors import EXIT_OK, UserError
from runner.sweep.report import write_report
from runner.sweep.search import load_search
from runner.sweep.study import open_study
from runner.sweep.table import render
from runner.sweep.worker import run_worker

OPTIONS = ("--table", "--no-table", "--cold")


def search_command(args: list[str], usage: str) -> int:
    """Run one worker (unless --table), then print the table (unless --no-table); the exit code."""
    flags, nproc = [], 1
    while args and (args[0] in OPTIONS or args[0] == "--nproc"):
        flag = args.pop(0)
        if flag == "--nproc":
            nproc = _count(args.pop(0) if args else "", usage)
        else:
            flags.append(flag)
    if not args or args[0].startswith("-") or len(set(flags) - {"--cold"}) > 1:
        raise UserError(usage)
    search = load_search(args[0], args[1:])
    log = functools.partial(print, flush=True)
    code = EXIT_OK if "--table" in flags else run_worker(search, log=log, nproc=nproc,
                                                                 cold="--cold" in flags)
    study = open_study(search, create=False)  # a read: the journal's own lock suffices
    if "--no-table" not in flags and study is None:
        print(f"no study in {search.root} yet", flush=True)
    elif "--no-table" not in flags:
        print(render(search, study), f"report: {write_report(search, study)}", sep="\n", flush=True)
    return code or _verdict(study)


def _count(text: str, usage: str) -> int:
    """--nproc's value: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise UserError(f"--nproc {text!r}: give the processes per trial, a whole number of at least 1; {usage}")
    return int(text)


def _verdict(study) -> int:
    """1 when trials ended and every one of them failed, else 0."""
    ended = [t for t in (study.get_trials(deepcopy=False) if study is not None else [])
             if t.state in (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)]
    return 1 if ended and all(t.state == TrialState.FAIL for t in ended) else 0
