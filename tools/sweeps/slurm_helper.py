"""The parts of tools/sweeps/slurm.sh that are hard in shell: what an ended array task does next, the job's time
left as TRAIN.TIME_LIMIT, and the sweep's table with each point's SLURM history.

  slurm_helper.py start EVENTS [--injected KEY ...]  note a task's start (EVENTS: ROOT/slurm/events/POINT.jsonl)
                                                and the keys the launcher added to its command line
  slurm_helper.py end EVENTS OUT LOG RC SIGNAL -- TRAIN_ARGS...  note its end; print the action
                                                (done|requeue|busy|failed) and why
  slurm_helper.py time-limit LEFT              squeue's %L (time left) as TRAIN.TIME_LIMIT seconds, or nothing
  slurm_helper.py table ROOT [--sort KEY] [--asc|--desc] [--out FILE]  tools/summarize.py's table (the same
                                                default order) plus 'slurm' (requeues, why a point failed)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from runner.errors import UserError, argument_error, cli
from runner.rundir import reader
from runner.rundir.layout import HANG, RESULTS, RUN_JSON
from runner.rundir.lock import IN_USE as BUSY  # the run lock's refusal: another task trains this point

HUNG_REQUEUES = 1  # a hung task (exit 76) is requeued this many times, then left failed
PREEMPTED, HUNG = 75, 76


def read_events(path: Path) -> list[dict]:
    """The events of one point, oldest first (lines that do not parse are skipped: a task killed mid-write)."""
    events = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return events
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def append_event(path: Path, **event) -> None:
    """One JSON line, appended in one write (the file is shared by every task of the point, one at a time)."""
    event = {"t": time.time(), "job": os.environ.get("SLURM_JOB_ID", ""),
             "array": f"{os.environ.get('SLURM_ARRAY_JOB_ID', '')}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}",
             "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0), **event}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def last_error(log: Path) -> str:
    """The run's one-line reason from its log: the last 'error:' line, else the last line."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error:")]
    # srun's and slurmstepd's own lines only say that the task failed; the run's last line says why
    own = [ln for ln in lines if not ln.startswith(("srun:", "slurmstepd"))]
    return (errors or own or lines or [""])[-1]


def run_status(out: Path, since: float) -> dict:
    """OUTPUT_DIR/run.json when this task wrote it (a file older than the task's start says nothing)."""
    try:
        if (out / RUN_JSON).stat().st_mtime < since - 1:
            return {}
    except OSError:
        return {}
    return reader.status(out) or {}


def other_config(out: Path, train_args: list[str]) -> str:
    """The run-changing keys in which OUT's run (config.yaml, else the claim's run.json) differs from ours; ''."""
    from runner.config import load_config
    from runner.rundir.rules import changed_run_keys

    text = reader.stored_config(out)
    if text is None or not train_args:
        return ""
    try:
        cfg, _ = load_config(train_args, check_paths=False)
        return "; ".join(changed_run_keys(cfg, text))
    except (UserError, ValueError) as e:
        return f"unreadable: {e}"


def decide(events: list[dict], out: Path, log: Path, rc: int, signalled: str,
           train_args: list[str] | None = None) -> tuple[str, str]:
    """What an ended task does next, and why: torchrun reports 1 for a worker's 75, so run.json decides too."""
    start = next((e["t"] for e in reversed(events) if e.get("event") == "start"), 0.0)
    status = run_status(out, start).get("status", "")
    if rc == 0 or status == "done":
        if rc == 0 or (out / RESULTS).exists():
            return "done", "finished"
    error = last_error(log)
    if rc == 2 and BUSY in error:
        other = other_config(out, train_args or [])
        if other:  # not this point's run: this point never trains (two submissions named one folder)
            return "failed", f"{out} holds another config's run ({other}), in use: {error}"
        return "busy", f"another task trains this point ({error})"
    if signalled == "TERM":  # SLURM ended the job (scontrol requeue, scancel, the time limit): it decides
        return "stopped", f"stopped by SLURM (SIGTERM), exit {rc}, run.json {status or '-'}"
    if rc == PREEMPTED or status == "preempted":
        if (events_stop := log.parent.parent / "slurm" / "STOP").exists():
            return "stopped", f"saved; not requeued: {events_stop} exists"
        why = f"saved and stopped on SIG{signalled}" if signalled else "saved and stopped"
        return "requeue", why
    if rc == HUNG or status == "hung":
        hung = sum(1 for e in events if e.get("event") == "end" and e.get("action") == "requeue"
                   and e.get("why", "").startswith("hung"))
        if hung < HUNG_REQUEUES:
            return "requeue", "hung (exit 76): requeued once"
        return "failed", f"hung again after {hung} requeue(s) (exit 76); see {out}/{HANG}"
    return "failed", f"exit {rc}: {error or 'no output'}"


def time_limit(left: str) -> str:
    """squeue's time left ([D-]HH:MM:SS, MM:SS) as TRAIN.TIME_LIMIT seconds: 30 s or a tenth below, or ''."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", left.strip())
    if not m:
        return ""  # UNLIMITED, NOT_SET, INVALID: no backstop
    d, h, mi, s = (int(x or 0) for x in m.groups())
    seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    return str(max(10, int(min(seconds - 30, seconds * 0.9))))


def manifest_folders(root: Path) -> dict[str, Path]:
    """Point name -> run folder from ROOT's submissions, for runs outside ROOT (`slurm.sh run`: DIR.slurm's DIR)."""
    folders = {}
    for manifest in sorted((root / "slurm").glob("submit-*.tsv")):
        for line in manifest.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            if len(fields) >= 4 and Path(fields[2]).parent != Path(fields[1]):  # name, root, folder, arguments
                folders[fields[0]] = Path(fields[2])
    return folders


def point_rows(root: Path) -> list:
    """summarize's rows of ROOT's runs, and of each run of ROOT's submissions that lives elsewhere."""
    from runner.sweep.summary import summarize

    rows = summarize(root)
    for name, folder in manifest_folders(root).items():
        for row in summarize(folder) if folder.is_dir() else []:
            row["run"] = name if row["run"] == "." else f"{name}/{row['run']}"
            rows.append(row)
    keys = {k for row in rows for k in row}  # runs summarized apart may differ in their key columns
    for row in rows:
        for key in keys - set(row):
            row[key] = None
    return rows


def hide_injected(rows: list, injected: dict[str, set[str]]) -> None:
    """Drop key columns that only the launcher set (TRAIN.TIME_LIMIT from the job's time left): not swept keys."""
    from runner.sweep.summary import default_values

    defaults = default_values()
    for key in set().union(*injected.values()):
        if all(row.get(key) in (None, defaults.get(key)) or key in injected.get(Path(row["run"]).name, ())
               for row in rows):
            for row in rows:
                row.pop(key, None)


def table(root: Path, sort: str = "", descending: bool = True) -> str:
    """summarize's markdown table for ROOT, with a 'slurm' column; points that never made a folder get a row."""
    from runner.sweep.summary import DEFAULT_SORT, RESULT_COLUMNS, Row, best_index, sort_rows, to_markdown

    rows = point_rows(root)
    by_name = {Path(r["run"]).name: r for r in rows}
    injected: dict[str, set[str]] = {}
    for path in sorted((root / "slurm" / "events").glob("*.jsonl")):
        events = read_events(path)
        injected[path.stem] = {k for e in events if e.get("event") == "start" for k in e.get("injected", [])}
        ends = [e for e in events if e.get("event") == "end"]
        requeues = sum(1 for e in ends if e.get("action") == "requeue")
        last = ends[-1] if ends else {}
        row = by_name.get(path.stem)
        if row is None:  # stopped before its folder existed (a bad path): the reason is only in our events
            row = Row(run=path.stem, **{k: None for k in (rows[0] if rows else RESULT_COLUMNS) if k != "run"})
            row.config_known = False
            row.update(status="failed" if last.get("action") == "failed" else "pending", note="")
            rows.append(row)
            by_name[path.stem] = row
        parts = [f"requeued {requeues}x"] if requeues else []
        if last.get("action") == "failed":
            parts.append(last.get("why", ""))
        elif not ends:
            parts.append("started, not ended" if events else "")
        row["slurm"] = "; ".join(p for p in parts if p)
    for row in rows:
        row.setdefault("slurm", "")
    if not rows:
        return f"no runs under {root}\n"
    hide_injected(rows, injected)
    if sort and sort not in rows[0]:
        raise UserError(f"--sort {sort!r} is not a column; columns: {', '.join(rows[0])}")
    rows = sort_rows(rows, sort or DEFAULT_SORT, descending)
    return to_markdown(rows, best_index(rows))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module's docstring); an end's train.py arguments come after --."""
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    start = sub.add_parser("start")
    start.add_argument("events", type=Path)
    start.add_argument("--injected", nargs="*", default=[], metavar="KEY")
    end = sub.add_parser("end")
    for name in ("events", "out", "log"):
        end.add_argument(name, type=Path)
    end.add_argument("rc", type=int)
    end.add_argument("signalled", nargs="?", default="")
    sub.add_parser("time-limit").add_argument("left")
    tab = sub.add_parser("table")
    tab.add_argument("root", type=Path)
    tab.add_argument("--sort", default="", metavar="KEY", help="column to sort by (default: tools/summarize.py's)")
    order = tab.add_mutually_exclusive_group()
    order.add_argument("--desc", dest="descending", action="store_true", default=True, help="largest first")
    order.add_argument("--asc", dest="descending", action="store_false", help="smallest first")
    tab.add_argument("--out", type=Path, help="also write the table to this file")
    parser.error = argument_error
    for p in sub.choices.values():
        p.error = argument_error
    args = parser.parse_args(argv)
    args.train_args = train_args
    return args


@cli
def main(argv: list[str] | None = None) -> int:
    """Run one subcommand."""
    args = parse_args(argv)
    if args.cmd == "start":
        append_event(args.events, event="start", host=os.uname().nodename,
                     **({"injected": args.injected} if args.injected else {}))
    elif args.cmd == "end":
        action, why = decide(read_events(args.events), args.out, args.log, args.rc, args.signalled, args.train_args)
        append_event(args.events, event="end", rc=args.rc, action=action, why=why)
        print(f"{action}\t{why}")
    elif args.cmd == "time-limit":
        print(time_limit(args.left))
    else:
        if not args.root.is_dir():
            raise UserError(f"ROOT {args.root} is not a folder; give the sweep's root (SWEEP_ROOT)")
        text = table(args.root, args.sort, args.descending)
        sys.stdout.write(text)
        if args.out:
            args.out.write_text(text)
    return 0


if __name__ == "__main__":
    main()
