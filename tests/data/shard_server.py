"""A static file server on 127.0.0.1 for the shard tests: python's http.server, counting the bytes it sends.

    python -m tests.data.shard_server ROOT LOG

Prints its port on the first stdout line; appends "PATH STATUS BYTES" to LOG after each response (the bytes
actually written, so a client that stops reading early is counted as far as it read).
"""
from __future__ import annotations

import functools
import sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer


class CountingHandler(SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler that logs the body bytes of each response to the LOG file."""

    log_path = ""

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
            with open(self.log_path, "a") as f:
                f.write(f"{self.path} 200 {sent}\n")

    def log_message(self, format: str, *args) -> None:
        """Quiet: the LOG file is the record."""


def main() -> None:
    """Serve ROOT until killed."""
    root, log = sys.argv[1], sys.argv[2]
    CountingHandler.log_path = log
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(CountingHandler, directory=root))
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
