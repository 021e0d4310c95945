"""Exceptions that map to documented exit codes, and the CLI wrapper that applies them."""
from __future__ import annotations

import atexit
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

EXIT_OK = 0
EXIT_USER = 2  # a mistake in the config, the arguments or the data: one line on stderr
EXIT_NONFINITE = 3  # the loss became NaN or inf; nothing non-finite was saved
EXIT_PREEMPTED = 75  # SIGTERM/SIGUSR1/Ctrl-C or TRAIN.TIME_LIMIT: state saved, rerun the same command to continue
EXIT_HUNG = 76  # no optimizer step for DIST.HANG_TIMEOUT_S: stacks in OUTPUT_DIR/hang/; rerun resumes like 75
EXIT_INTERRUPTED = 130  # Ctrl-C twice: stopped at once; rerun to continue from the last checkpoint (128 + SIGINT)


class UserError(Exception):
    """A mistake the user can fix; reported as one line, exit code 2."""

    exit_code = EXIT_USER


class NonFiniteLoss(Exception):
    """The training loss became non-finite; exit code 3."""

    exit_code = EXIT_NONFINITE


class Preempted(Exception):
    """A preemption signal arrived and the state was saved; exit code 75."""

    exit_code = EXIT_PREEMPTED


class DataUnavailable(Exception):
    """The data server kept failing (5xx, refused, reset, no answer) for DATA.RETRY_S: a fault of the cluster, not
    of the config; the run stops as if preempted (exit 75) and the same command continues it."""

    exit_code = EXIT_PREEMPTED


class Hung(Exception):
    """Another rank stopped answering (frozen, or never started); exit code 76, one line."""

    exit_code = EXIT_HUNG


def argument_error(message: str) -> None:
    """argparse's error hook: a one-line UserError (exit 2) instead of the usage text and a second line."""
    raise UserError(f"{message} (see --help)")


def one_line(message: str) -> str:
    """The message itself, also when a DataLoader worker re-raised it wrapped in its traceback text."""
    if "Original Traceback" not in message:
        return message
    last = message.strip().splitlines()[-1]
    for prefix in ("runner.errors.UserError: ", "UserError: ", "runner.errors.DataUnavailable: ",
                   "DataUnavailable: "):
        if last.startswith(prefix):
            return last[len(prefix):]
    return last


def describe(error: BaseException) -> tuple[int, str]:
    """(exit code, one line) that `error` ends a process with: a user mistake's own line, else 'Type: message'."""
    text = one_line(str(error))
    if isinstance(error, (UserError, DataUnavailable)):
        return error.exit_code, text
    return getattr(error, "exit_code", 1), f"{type(error).__name__}: {text}"


def cli(main: Callable[..., int | None]) -> Callable[..., None]:
    """Run `main`, turning user mistakes into one stderr line and a non-zero exit."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> None:
        try:
            code = main(*args, **kwargs)
        except (UserError, NonFiniteLoss, Preempted, Hung, DataUnavailable) as e:
            if getattr(e, "relayed", False) and os.environ.get("RANK", "0") != "0":
                _leave_the_line_to_rank_0(e.exit_code)
            text = one_line(str(e))
            print(f"error: {text}" if isinstance(e, UserError) else text, file=sys.stderr, flush=True)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr, flush=True)
            sys.exit(EXIT_INTERRUPTED)
        except RuntimeError as e:  # a tool other than train.py meets a torchvision of another torch at its import
            from runner.compat import torchvision_mismatch

            mismatch = torchvision_mismatch(e)
            if mismatch is None:
                raise
            print(f"error: {mismatch}", file=sys.stderr, flush=True)
            sys.exit(EXIT_USER)
        sys.exit(code or 0)

    return wrapper


RELAY_WAIT_S = 20.0  # how long a quiet rank waits for rank 0 to say the line (rank 0 meets the same mistake)


def _leave_the_line_to_rank_0(code: int) -> None:
    """A non-zero rank whose mistake rank 0 reports: wait, quiet, until torchrun ends it, then exit `code`.

    Exiting at once would let torchrun SIGTERM rank 0 before rank 0 has printed the line (seen on a loaded
    machine: no line at all). Rank 0 fails the same way, torchrun then SIGTERMs this rank, which exits with the
    mistake's own code; if rank 0 never does (another node, other arguments), this rank speaks after the wait.
    """
    signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
    # short sleeps: a SIGTERM the kernel hands to another thread (gloo's) does not cut the main thread's sleep
    # short, and its handler runs only once the main thread runs Python again (seen: a second line after 20 s)
    deadline = time.monotonic() + RELAY_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_script(main: Callable[[], None]) -> None:
    """Run a tool's `main` as the program; after a run that imported torch, end without the interpreter's teardown.

    The teardown's last garbage collection walks every torch and timm object (about 1 s of a 15 s digits run on
    2 cores). Skipping it with gc.freeze() left extension objects alive at nanobind's leak check, which then
    printed ~30 lines on stderr (triton 3.9). Here every atexit handler still runs (logging, multiprocessing's
    worker shutdown), threads are joined and both streams flushed; only the teardown itself is skipped.
    """
    try:
        main()
    except SystemExit as e:
        if "torch" not in sys.modules or not isinstance(e.code, (int, type(None))):
            raise
        _exit_now(e.code or 0)
    # an uncaught exception propagates: its traceback and the normal teardown, as Python does


def _exit_now(code: int) -> None:
    """Join threads, run atexit handlers, flush, and end the process with `code`."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it
            pass
    os._exit(code)
