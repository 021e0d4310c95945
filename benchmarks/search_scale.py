#!/usr/bin/env python
"""Many search workers on one study (issue 47, item 3): N processes run the REAL worker loop of
runner/sweep/worker.py (`run_worker`: take under ROOT/search.lock, mark, report, promote, against one Optuna journal
ROOT/study.journal) with each segment's training replaced by a drawn sleep per epoch and a known metric function.
It measures the coordination layer (lock, journal, scheduler), not training, and says so in its output.

    python benchmarks/search_scale.py [--workers 16 64 256] [--epochs 9] [--eta 3] [--storms 3]
                                      [--kill-fraction 0.1] [--epoch-s 0.5 1.5] [--poll-s 5] [--mem-limit-gib 8]

- Workers are forked from one parent that imported optuna and the runner once (gc.freeze, so copy-on-write pages
  stay shared); each calls `worker.run_worker` on the same search. `worker.train` is monkeypatched in the workers
  (in-process: no interpreter per segment): it calls `search.argv` on the trial's params (as the real one does),
  then appends one val row per epoch to the trial's metrics.jsonl after a drawn sleep, as tools/train.py's pause
  contract does (a SIGKILL between rows loses only the epoch in progress, as a checkpoint per epoch would).
  What this leaves out: the trial's own process (its folder lock, `wait_free`, PR_SET_PDEATHSIG).
- Timing: `worker.take`, `worker.finish` and `worker.open_study` are wrapped in each worker (and `worker.locked`,
  to split a call into holding the lock and the rest: waiting for it, or for the job a holder decided for this
  worker); one line per call to ROOT/timings/PID.tsv, with when it began.
- SIGKILL storms: `storms` times, at moments drawn over the study's first part, a random `kill_fraction` of the
  live workers is killed and as many replacements forked.
- `check` replays the journal and the trial folders: no trial lost, no epoch trained twice, no rung value
  without the rung below, each promotion in the top 1/eta of its rung when it was marked, a job re-taken only from
  a killed worker, trials == budget and at least one COMPLETE.

On this 2-core machine the latency at high N is mostly CPU contention (N processes polling and replaying the
journal on 2 cores), not the lock's own cost.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "digits" / "test_resnet.yaml"
STATE = {"RUNNING": 0, "COMPLETE": 1, "PRUNED": 2, "FAIL": 3}
CREATE_TRIAL, SET_STATE, SET_VALUE, SET_USER_ATTR = 4, 6, 7, 8  # Optuna's JournalOperation codes


def sweep_file(out: Path, trials: int, epochs: int, eta: int, seed: int) -> Path:
    """A search file over TRAIN.LR and TRAIN.WEIGHT_DECAY on the digits config (never trained: the stand-in)."""
    body = {"cfg": str(DIGITS), "root": str(out / "study"), "set": {"TRAIN.EPOCHS": epochs},
            "search": {"trials": trials, "sampler": "random", "seed": seed, "asha": {"eta": eta, "min_epochs": 1},
                       "space": {"TRAIN.LR": {"log": [1.0e-5, 1.0]}, "TRAIN.WEIGHT_DECAY": {"log": [1.0e-6, 0.1]}}}}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "scale.yaml"
    path.write_text(json.dumps(body) + "\n")
    return path


def metric(lr: float, wd: float, epoch: int, epochs: int) -> float:
    """The known metric: best at LR 10^-2.5, WD 10^-3.5, rising with the epochs."""
    return 99.0 - 3.0 * (math.log10(lr) + 2.5) ** 2 - (math.log10(wd) + 3.5) ** 2 - 8.0 * (1 - epoch / epochs)


def stand_in(epoch_s: tuple[float, float], rng: random.Random):
    """A replacement for worker.train: the trial trained in-process to `epoch` by sleeps; exit code 0."""
    def train(search, trial, epoch, stop, log=print, nproc=1, server=None) -> int:
        """Rows from the last one in metrics.jsonl to `epoch`, one per drawn sleep."""
        folder = Path(search.trial_dir(trial.number))
        search.argv(trial.params, str(folder))  # what the real train reads of the trial (a trial without params fails)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "metrics.jsonl"
        done = max((json.loads(x)["epoch"] for x in path.read_text().splitlines()), default=0) if path.exists() else 0
        _append(folder / "segments.jsonl", {"pid": os.getpid(), "from": done + 1, "to": epoch})
        lr, wd = trial.params["TRAIN.LR"], trial.params["TRAIN.WEIGHT_DECAY"]
        for e in range(done + 1, epoch + 1):
            time.sleep(rng.uniform(*epoch_s))
            _append(path, {"step": e, "epoch": e, search.metric: metric(lr, wd, e, search.rungs[-1])})
        return 0
    return train


def _append(path: Path, row: dict) -> None:
    """One JSON line appended in one write (a SIGKILL cannot tear it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def instrument(worker, root: Path) -> None:
    """Wrap take, finish, open_study and locked in this worker process; one line per call to ROOT/timings/PID.tsv."""
    fd = os.open(root / "timings" / f"{os.getpid()}.tsv", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    holds: list[float] = []
    real_locked, real_take, real_finish, real_open = worker.locked, worker.take, worker.finish, worker.open_study

    @contextlib.contextmanager
    def locked(path, wait=True):
        """worker.locked, noting how long the lock was held (the rest of a call is waiting for it, or its reply)."""
        with real_locked(path, wait) as held:
            t = time.perf_counter()
            try:
                yield held
            finally:
                holds.append(time.perf_counter() - t if held else 0.0)

    def timed(name, fn):
        """`fn` writing one line per call: name, seconds, seconds waiting for the lock, whether it got a job, when it
        began (epoch seconds)."""
        def call(*a, **k):
            """The call, timed."""
            holds.clear()
            t = time.perf_counter()
            out = fn(*a, **k)
            got = int(out[0] is not None) if name == "take" else 1
            took = time.perf_counter() - t
            wait = took - sum(holds) if holds else 0.0  # a take that found nothing to do never asked for the lock
            os.write(fd, f"{name}\t{took:.6f}\t{wait:.6f}\t{got}\t{time.time() - took:.3f}\n".encode())
            return out
        return call

    worker.locked = locked
    worker.take, worker.finish = timed("take", real_take), timed("report", real_finish)
    worker.open_study = timed("open", real_open)


def spawn(search, args: argparse.Namespace, root: Path) -> int:
    """Fork one worker from this preloaded parent: it runs the real loop and exits with its code."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        from runner.sweep import worker

        err = os.open(root / "workers" / f"{os.getpid()}.err", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(err, 2)
        instrument(worker, root)
        worker.train = stand_in(tuple(args.epoch_s), random.Random(f"{args.seed} {os.getpid()} {time.time()}"))
        code = worker.run_worker(search, poll_s=args.poll_s, log=lambda _line: None, cold=True)  # no warm server
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def memory_gib(pids: list[int]) -> float:
    """The workers' and this process's proportional set size (shared pages counted once in all), GiB."""
    total = 0
    for pid in [os.getpid(), *pids]:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
    return total / 2**20


def run(n: int, args: argparse.Namespace, out: Path) -> dict:
    """Run one study with `n` workers, storms and all; the checker's verdict and the figures, as a dict."""
    from runner.sweep import worker  # noqa: F401  (imported before the forks: the workers share its pages)
    from runner.sweep.search import load_search

    trials = args.trials or n
    search = load_search(str(sweep_file(out, trials, args.epochs, args.eta, args.seed)))
    root = Path(search.root)
    for sub in ("timings", "workers"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    gc.collect()
    gc.freeze()  # the parent's objects stay out of the children's collections: their pages stay shared
    start = time.time()
    live = {spawn(search, args, root) for _ in range(n)}
    rng = random.Random(args.seed)
    storms = sorted(rng.uniform(0.3, args.storm_window) for _ in range(args.storms))
    got = {"killed": [], "failed": [], "peak_gib": memory_gib(list(live)), "aborted": None}
    next_mem = time.time() + 1.0
    while live:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            live.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            if code != 0 and pid not in got["killed"]:
                got["failed"].append((pid, code))
            continue
        now = time.time()
        if storms and now - start >= storms[0]:
            storms.pop(0)
            live |= _storm(live, args.kill_fraction, rng, got, search, args, root)
        if now >= next_mem:
            got["peak_gib"] = max(got["peak_gib"], memory_gib(list(live)))
            next_mem = now + 2.0
        if got["peak_gib"] > args.mem_limit_gib or now - start > args.deadline_s:
            got["aborted"] = "memory" if got["peak_gib"] > args.mem_limit_gib else "deadline"
            _kill_all(live)
            live.clear()
        time.sleep(0.02)
    gc.unfreeze()
    wall = time.time() - start
    host = __import__("socket").gethostname()
    violations = check(root, search.rungs, search.eta, search.maximize, trials, {f"{host}:{p}" for p in got["killed"]})
    violations += [f"worker {p} exited {c} (see {root}/workers/{p}.err)" for p, c in got["failed"]]
    violations += [f"aborted: {got['aborted']}"] if got["aborted"] else []
    return summary(n, trials, root, wall, got, violations)


def _storm(live: set[int], fraction: float, rng: random.Random, got: dict, search, args, root: Path) -> set[int]:
    """SIGKILL a random `fraction` of the live workers (at least one); the replacements' pids."""
    victims = rng.sample(sorted(live), max(1, round(fraction * len(live)))) if live else []
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        got["killed"].append(pid)
    return {spawn(search, args, root) for _ in victims}


def _kill_all(pids: set[int]) -> None:
    """SIGKILL and reap every worker still running (an aborted run)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def journal_records(path: Path) -> list[dict]:
    """The journal's records in order (a torn last line, which Optuna's reader skips, left out)."""
    records = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


def check(root: Path, rungs: tuple[int, ...], eta: int, maximize: bool, budget: int,
          killed: set[str] = frozenset()) -> list[str]:
    """Replay ROOT/study.journal and the trial folders; every violation found, one line each (none: correct)."""
    trials: list[dict] = []
    bad: list[str] = []
    for rec in journal_records(root / "study.journal"):
        op = rec.get("op_code")
        if op == CREATE_TRIAL:
            trials.append({"values": {}, "job": None, "state": STATE["RUNNING"], "marked": set(), "params": False})
        elif op in (SET_VALUE, SET_USER_ATTR, SET_STATE):
            bad += _apply(trials, rec, rungs, eta, maximize, killed)
        elif op == 5:  # SET_TRIAL_PARAM
            trials[rec["trial_id"]]["params"] = True
    bad += _final(trials, budget, rungs)
    for number, t in enumerate(trials):
        bad += _folder(root / f"trial_{number}", number, t["values"])
    return bad


def _apply(trials: list[dict], rec: dict, rungs: tuple[int, ...], eta: int, maximize: bool,
           killed: set[str]) -> list[str]:
    """One record's effect on the replayed trials, and the violations it shows."""
    number, t = rec["trial_id"], trials[rec["trial_id"]]
    if rec["op_code"] == SET_STATE:
        t["state"] = rec["state"]
        return []
    if rec["op_code"] == SET_VALUE:
        step, bad = rec["step"], []
        below = [r for r in rungs if r < step]
        if below and below[-1] not in t["values"]:
            bad.append(f"trial {number}: a value at epoch {step} without one at epoch {below[-1]}")
        if step in t["values"]:
            bad.append(f"trial {number}: epoch {step} reported twice")
        t["values"][step] = rec["intermediate_value"]
        return bad
    job = rec["user_attr"].get("job", "absent")
    if job == "absent":
        return []
    bad = _job_taken(trials, number, job, rungs, eta, maximize, killed) if job and job.get("worker") else []
    t["job"] = job
    return bad


def _job_taken(trials: list[dict], number: int, job: dict, rungs: tuple[int, ...], eta: int, maximize: bool,
               killed: set[str]) -> list[str]:
    """A job marked taken: re-taken only from a killed worker; a promotion from a reported rung, in its top 1/eta."""
    t, epoch, bad = trials[number], job["epoch"], []
    prev = t["job"] or {}
    if prev.get("worker") and prev["worker"] != job["worker"] and prev["worker"] not in killed:
        bad.append(f"trial {number}: job to epoch {epoch} taken by {job['worker']} from live {prev['worker']}")
    k = rungs.index(epoch) if epoch in rungs else -1
    if k < 0:
        return [*bad, f"trial {number}: a job to epoch {epoch}, not a rung"]
    if k == 0 or epoch in t["marked"]:
        t["marked"].add(epoch)
        return bad
    t["marked"].add(epoch)
    below = rungs[k - 1]
    if below not in t["values"]:
        return [*bad, f"trial {number}: promoted to epoch {epoch} before it reported epoch {below}"]
    sign = -1.0 if maximize else 1.0
    board = sorted((sign * x["values"][below], i) for i, x in enumerate(trials) if below in x["values"])
    if number not in [i for _, i in board[: len(board) // eta]]:
        bad.append(f"trial {number}: promoted to epoch {epoch} outside the top 1/{eta} of epoch {below}")
    return bad


def _final(trials: list[dict], budget: int, rungs: tuple[int, ...]) -> list[str]:
    """The study at its end: the budget's trials, one COMPLETE at least, none failed, none left with a job."""
    bad = [] if len(trials) == budget else [f"{len(trials)} trials in the journal, the budget is {budget}"]
    if not any(t["state"] == STATE["COMPLETE"] for t in trials):
        bad.append("no trial COMPLETE")
    for number, t in enumerate(trials):
        if t["state"] == STATE["FAIL"]:
            bad.append(f"trial {number}: FAIL")
        if not t["params"]:
            bad.append(f"trial {number}: no params")
        if t["state"] == STATE["RUNNING"] and (t["job"] or not t["values"]):
            bad.append(f"trial {number}: lost (RUNNING, job {t['job']}, values {sorted(t['values'])})")
        if t["state"] == STATE["COMPLETE"] and rungs[-1] not in t["values"]:
            bad.append(f"trial {number}: COMPLETE without a value at epoch {rungs[-1]}")
    return bad


def _folder(folder: Path, number: int, values: dict) -> list[str]:
    """A trial folder's rows: each epoch once, 1..its highest reported rung, the journal's values at the rungs."""
    path = folder / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    epochs = [r["epoch"] for r in rows]
    top = max(values, default=0)
    bad = []
    if sorted(epochs) != list(range(1, len(epochs) + 1)) or len(set(epochs)) != len(epochs):
        bad.append(f"trial {number}: epochs trained {epochs} (one each, in order, expected)")
    if epochs and max(epochs) != top or not epochs and top:
        bad.append(f"trial {number}: trained to epoch {max(epochs, default=0)}, reported to {top}")
    by_epoch = {r["epoch"]: r for r in rows}
    for step, value in values.items():
        if step in by_epoch and abs(next(v for k, v in by_epoch[step].items() if k.startswith("val/")) - value) > 1e-9:
            bad.append(f"trial {number}: the journal's value at epoch {step} is not the folder's")
    return bad


def latencies(root: Path) -> dict:
    """p50 and p99 (seconds) of each timed call over every worker's timings file."""
    calls: dict[str, list[float]] = {}
    for path in (root / "timings").glob("*.tsv"):
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) != 5:
                continue  # a worker killed mid-line
            name, dt, wait, got = parts[0], float(parts[1]), float(parts[2]), parts[3] == "1"  # parts[4]: when
            calls.setdefault(name, []).append(dt)
            calls.setdefault(f"{name}_wait", []).append(wait)  # waiting for ROOT/search.lock
            calls.setdefault(f"{name}_held", []).append(dt - wait)  # the rest: reading, deciding, appending
            if name == "take" and got:
                calls.setdefault("take_job", []).append(dt)
    return {k: {"n": len(v), "p50": _pct(v, 50), "p99": _pct(v, 99)} for k, v in sorted(calls.items())}


def _pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summary(n: int, trials: int, root: Path, wall: float, got: dict, violations: list[str]) -> dict:
    """One run's figures."""
    journal = root / "study.journal"
    segments = sum(len(p.read_text().splitlines()) for p in root.glob("trial_*/segments.jsonl"))
    return {"what": "coordination layer only: training is a drawn sleep per epoch", "workers": n, "trials": trials,
            "killed": len(got["killed"]), "segments": segments, "wall_s": round(wall, 1),
            "latency_s": latencies(root), "journal_bytes": journal.stat().st_size if journal.exists() else 0,
            "journal_lines": len(journal.read_bytes().splitlines()) if journal.exists() else 0,
            "peak_pss_gib": round(got["peak_gib"], 2), "violations": violations}


def table(rows: list[dict]) -> str:
    """The markdown table of docs/PERFORMANCE.md."""
    head = ("| workers | trials | killed | segments | wall s | take p50 / p99 s | take with a job p99 s | "
            "lock wait / held p99 s | report p50 / p99 s | journal KiB (lines) | peak PSS GiB | violations |")
    out = [head, "|" + "---|" * 12]
    for r in rows:
        lat = {f"{k} {q}": f"{v[q]:.3f}" for k, v in r["latency_s"].items() for q in ("p50", "p99")}
        cells = [r["workers"], r["trials"], r["killed"], r["segments"], r["wall_s"],
                 f"{lat.get('take p50')} / {lat.get('take p99')}", lat.get("take_job p99"),
                 f"{lat.get('take_wait p99')} / {lat.get('take_held p99')}",
                 f"{lat.get('report p50')} / {lat.get('report p99')}",
                 f"{r['journal_bytes'] / 1024:.0f} ({r['journal_lines']})", r["peak_pss_gib"], len(r["violations"])]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--trials", type=int, default=0, help="the study's trials (default: as many as workers)")
    p.add_argument("--epochs", type=int, default=9)
    p.add_argument("--eta", type=int, default=3)
    p.add_argument("--epoch-s", type=float, nargs=2, default=[0.5, 1.5], help="an epoch's sleep, drawn uniformly")
    p.add_argument("--poll-s", type=float, default=5.0, help="an idle worker's poll (worker.POLL_S by default)")
    p.add_argument("--storms", type=int, default=3)
    p.add_argument("--kill-fraction", type=float, default=0.1)
    p.add_argument("--storm-window", type=float, default=8.0, help="storms fall in [0.3, this] s after the start")
    p.add_argument("--mem-limit-gib", type=float, default=8.0)
    p.add_argument("--deadline-s", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main() -> None:
    """Each N in turn: one JSON line each, then the table."""
    args = parse()
    from runner.sweep import worker  # noqa: F401  (imported once here: the workers fork from this process)

    base = Path(args.out or tempfile.mkdtemp(prefix="search-scale-"))
    rows = []
    for n in args.workers:
        row = run(n, args, base / f"n{n}")
        row["violations"] = row["violations"][:20]
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"{datetime.date.today()}, {os.cpu_count()} cores, python {sys.version.split()[0]}; "
          f"median take p99 {statistics.median(r['latency_s'].get('take', {}).get('p99', 0) for r in rows):.3f} s")
    print(table(rows))


if __name__ == "__main__":
    main()
