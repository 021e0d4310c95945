"""A stand-in Hugging Face Hub on 127.0.0.1: the file routes that huggingface_hub's downloads use.

    with HubServer(tmp_path / "hub") as hub:       # hub.root/<org>/<name>/<file> are the repos' files
        env["HF_ENDPOINT"] = hub.url
        ...
        hub.downloads("timm/test_resnet.r160_in1k", "model.safetensors")   # GETs that sent the whole file

Serves `HEAD|GET /<org>/<name>/resolve/<revision>/<file>` with the headers the client reads (X-Repo-Commit,
ETag, Content-Length; 404 with X-Error-Code EntryNotFound or RepoNotFound) and byte ranges (a resumed
download). `cut(repo, file, after, count)` makes the next `count` GETs of a file send `after` bytes of it and
close the connection: a download broken mid-file. Every request is recorded (method, path, status, bytes sent).
"""
from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROUTE = re.compile(r"^/(?:api/models/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class HubServer:
    """The server, run in a daemon thread of the test process; a context manager that stops it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.requests: list[tuple[str, str, int, int]] = []  # (method, path, status, body bytes sent)
        self.cuts: dict[str, list[int]] = {}  # path -> [bytes to send, GETs left to cut]
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, repo: str, name: str, data: bytes) -> Path:
        """Put a file into a repo; returns its path."""
        path = self.root / repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def commit(self, repo: str) -> str:
        """The repo's commit: a hash of its files' names and contents (a new file is a new commit)."""
        h = hashlib.sha1()
        for f in sorted((self.root / repo).rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(self.root / repo)).encode() + b"\0" + f.read_bytes())
        return h.hexdigest()

    def cut(self, repo: str, name: str, after: int, count: int = 1) -> None:
        """The next `count` GETs of the file send `after` bytes, then drop the connection."""
        self.cuts[f"{repo}/{name}"] = [after, count]

    def downloads(self, repo: str, name: str) -> int:
        """GETs of the file that sent it whole (200 with every byte, or the rest of it after a cut: 206)."""
        size = (self.root / repo / name).stat().st_size
        with self.lock:
            sent = [(s, n) for m, p, s, n in self.requests if m == "GET" and p.endswith(f"/{repo}/resolve/main/{name}")]
        return sum(1 for s, n in sent if (s == 200 and n == size) or s == 206)

    def gets(self) -> list[str]:
        """The paths of every GET so far."""
        with self.lock:
            return [p for m, p, _, _ in self.requests if m == "GET"]


class _Handler(BaseHTTPRequestHandler):
    """One request: a file of a repo, or a 404 the client understands."""

    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        """Quiet: the test reads `hub.requests`."""

    def do_HEAD(self) -> None:
        """Headers only."""
        self.answer(body=False)

    def do_GET(self) -> None:
        """Headers and the file (or the asked range of it)."""
        self.answer(body=True)

    def answer(self, body: bool) -> None:
        """Find the file and send it, recording what was sent."""
        match = ROUTE.match(self.path.split("?")[0])
        repo_dir = self.hub.root / match["repo"] if match else None
        if match is None or not repo_dir.is_dir():
            return self.missing("RepoNotFound", body)
        path = repo_dir / match["file"]
        if not path.is_file():
            return self.missing("EntryNotFound", body)
        data = path.read_bytes()
        start = self.range_start()
        status = 206 if start else 200
        self.send_response(status)
        self.send_header("X-Repo-Commit", self.hub.commit(match["repo"]))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        sent = 0
        if body:
            sent = self.send_body(f"{match['repo']}/{match['file']}", data[start:])
        self.record(status, sent)

    def send_body(self, key: str, data: bytes) -> int:
        """Write the body, or its first bytes and then drop the connection when a cut is due."""
        with self.hub.lock:
            cut = self.hub.cuts.get(key)
            if cut and cut[1] > 0:
                cut[1] -= 1
                data, self.close_connection = data[:cut[0]], True
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            return 0
        return len(data)

    def range_start(self) -> int:
        """The first byte asked by a `Range: bytes=N-` header, else 0."""
        m = re.match(r"bytes=(\d+)-", self.headers.get("Range", ""))
        return int(m[1]) if m else 0

    def missing(self, code: str, body: bool) -> None:
        """A 404 with the Hub's error code header."""
        text = f"{code}: {self.path}".encode()
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        if body:
            self.wfile.write(text)
        self.record(404, len(text) if body else 0)

    def record(self, status: int, sent: int) -> None:
        """Note the request."""
        with self.hub.lock:
            self.hub.requests.append((self.command, self.path, status, sent))
