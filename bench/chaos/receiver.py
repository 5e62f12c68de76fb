"""The chaos run's webhook receiver: it records every delivery (its `webhook-id`, event
and object), answers a share of them with a 500 so the sender retries, and can be taken
down for a while (its port closed) and brought back on the same port."""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers.processes import free_port

FAIL_SHARE = 0.2


@dataclass(frozen=True)
class Delivery:
    webhook_id: str
    event: str
    object_id: str
    accepted: bool


class Receiver:
    def __init__(self, *, seed: int = 0) -> None:
        self.port = free_port()
        self.deliveries: list[Delivery] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        if self._server is not None:
            return
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                payload = json.loads(body)
                with receiver._lock:
                    accepted = receiver._rng.random() >= FAIL_SHARE
                    receiver.deliveries.append(
                        Delivery(
                            webhook_id=self.headers.get("webhook-id", ""),
                            event=payload["type"],
                            object_id=payload["data"]["id"],
                            accepted=accepted,
                        )
                    )
                self.send_response(200 if accepted else 500)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def snapshot(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)
