"""A static file server on 127.0.0.1 for the shard tests: python's http.server, counting the bytes it sends.

    python -m tests.data.shard_server ROOT LOG [CONTROL]

Prints its port on the first stdout line; appends "PATH STATUS BYTES" to LOG after each response (the bytes
actually written, so a client that stops reading early is counted as far as it read).

CONTROL (optional) is a JSON file read at each request, for the fault tests: {"fault": "500" | "hang",
"prefix": "/train/", "after": K, "count": N} makes the requests whose path starts with `prefix`, after the
first K of them (and only N of them, when given), answer 500 or be accepted and never answered; a missing
file or {} serves normally.
"""
from __future__ import annotations

import functools
import json
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class CountingHandler(SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler that logs the body bytes of each response to the LOG file."""

    log_path = ""
    control_path = ""
    seen = 0  # requests matching the control's prefix so far
    lock = threading.Lock()

    def do_GET(self) -> None:
        """Serve, unless the control file asks for a fault on this path."""
        fault = self.fault()
        if fault == "500":
            self.send_error(500, "injected fault")
            self.note(500, 0)
        elif fault == "hang":
            self.note(0, 0)  # logged before the wait: the test learns the request came
            threading.Event().wait()  # accepted, never answered (a daemon thread: ends with the server)
        else:
            super().do_GET()

    def fault(self) -> str:
        """The fault the control file asks for on this request, or ''."""
        try:
            with open(self.control_path) as f:
                control = json.load(f)
        except (OSError, ValueError):
            return ""
        if not control.get("fault") or not self.path.startswith(control.get("prefix", "/")):
            return ""
        with CountingHandler.lock:
            CountingHandler.seen += 1
            after = control.get("after", 0)
            within = after < CountingHandler.seen <= after + control.get("count", float("inf"))
            return control["fault"] if within else ""

    def copyfile(self, source, outputfile) -> None:
        """Copy in chunks, counting what reached the socket."""
        sent = 0
        try:
            while chunk := source.read(64 * 1024):
                outputfile.write(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading: what it got is counted
        finally:
            self.note(200, sent)

    def note(self, status: int, sent: int) -> None:
        """One LOG row for this response."""
        with open(self.log_path, "a") as f:
            f.write(f"{self.path} {status} {sent}\n")

    def log_message(self, format: str, *args) -> None:
        """Quiet: the LOG file is the record."""


def main() -> None:
    """Serve ROOT until killed."""
    root, log = sys.argv[1], sys.argv[2]
    CountingHandler.log_path = log
    CountingHandler.control_path = sys.argv[3] if len(sys.argv) > 3 else ""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(CountingHandler, directory=root))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
