"""A real webhook receiver for tests: an HTTP server that records every request and
answers as each path's script says (status codes, delays, headers)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Reply:
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


class Receiver:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Reply]] = {}
        self._received: list[Received] = []

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def script(self, path: str, *replies: Reply) -> None:
        """Answer requests to `path` with these replies in turn; the last one repeats."""
        with self._lock:
            self._scripts[path] = list(replies)

    def received(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self._received if path is None or r.path == path]

    def wait_for(self, path: str, count: int, timeout_s: float = 60) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while len(got := self.received(path)) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{path} got {len(got)} requests, not {count}")
            time.sleep(0.05)
        return got

    def wait_until(
        self, path: str, done: Callable[[list[Received]], bool], timeout_s: float = 60
    ) -> list[Received]:
        """Wait until the requests to `path` satisfy `done`; return them."""
        deadline = time.monotonic() + timeout_s
        while not done(got := self.received(path)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{path}: {len(got)} requests, still not done")
            time.sleep(0.05)
        return got

    def _reply(self, path: str, headers: dict[str, str], body: bytes) -> Reply:
        with self._lock:
            self._received.append(Received(path, headers, body, time.monotonic()))
            script = self._scripts.get(path, [Reply()])
            return script.pop(0) if len(script) > 1 else script[0]


@contextmanager
def receiver(host: str = "127.0.0.1") -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = holder[0]._reply(self.path, headers, body)
            time.sleep(reply.delay_s)
            try:
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
            except OSError:
                pass  # the sender gave up waiting

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    holder.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
