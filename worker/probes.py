"""The GPU worker's HTTP port: Prometheus's `/metrics`, and the probes.

- `/livez`: 200 unless the worker is stuck (it has room, its queues hold work, and it has
  taken none for `INFERQ_STALL_S`); a worker still loading its model is alive.
- `/readyz`: 200 once the engine is loaded and the worker consumes, and while it is not
  stuck.

The body says why in one line, for `curl` and the probes' events.
"""

from __future__ import annotations

import socketserver
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from inferq.exceptions import InferqError
from inferq.host import supervision
from inferq.host.stall import StallWatch

StartResponse = Callable[..., Any]


class State:
    """What the probes answer from: written by the worker, read by the server's threads."""

    def __init__(self) -> None:
        self.ready = False  # the engine is loaded and the worker consumes
        self.watch: StallWatch | None = None

    @property
    def stuck(self) -> str | None:
        """Why the worker is stuck, while it is."""
        return None if self.watch is None else self.watch.stuck


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """A probe every few seconds is not worth a log line."""


def serve(port: int, state: State) -> None:
    """Serve `/metrics`, `/livez` and `/readyz` on `port`, in a thread."""
    metrics = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/livez":
            return _answer(start_response, state.stuck is None, state.stuck or "alive")
        if path == "/readyz":
            if state.stuck is not None:
                return _answer(start_response, False, state.stuck)
            return _answer(start_response, state.ready, "ready" if state.ready else "loading")
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    try:
        server = make_server("", port, app, _Server, handler_class=_QuietHandler)
    except OSError as exc:
        raise InferqError(
            f"cannot serve metrics on port {port} ({exc.strerror}): give each worker on a host "
            "its own INFERQ_WORKER_METRICS_PORT, or 0 to turn metrics off"
        ) from exc
    supervision.thread(server.serve_forever, name="metrics-server").start()


def _answer(start_response: StartResponse, ok: bool, why: str) -> list[bytes]:
    start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
    return [f"{why}\n".encode()]
