"""Lines that a signal handler asks for, written outside it.

A Python signal handler runs in the main thread between two bytecodes, possibly in the middle of a write to the
very stream it would log to; a second write there fails ("reentrant call inside <_io.BufferedWriter>") and the
logging module prints its own traceback. So a handler only queues the call (SimpleQueue.put is reentrant) and a
thread started beforehand, outside any handler, makes it; the main thread may also make the pending calls at a
point of its choosing (drain), which keeps them ahead of what it logs next."""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable

_pending: queue.SimpleQueue = queue.SimpleQueue()
_started = threading.Event()


def start() -> None:
    """Start the thread that makes queued calls (once per process; call it where handlers are installed)."""
    if _started.is_set():
        return
    _started.set()
    threading.Thread(target=_serve, name="runner-signal-lines", daemon=True).start()


def later(fn: Callable[..., object], *args: object) -> None:
    """Call fn(*args) soon, outside the handler: safe to call from a signal handler."""
    _pending.put((fn, args))


def drain() -> None:
    """Make the calls still pending now, in the calling thread (never call it from a handler)."""
    while True:
        try:
            fn, args = _pending.get_nowait()
        except queue.Empty:
            return
        fn(*args)


def _serve() -> None:
    """Make each queued call as it comes."""
    while True:
        fn, args = _pending.get()
        fn(*args)
