"""The GPU worker's probes, served as the worker serves them."""

from __future__ import annotations

import httpx
from prometheus_client import Gauge

from tests.helpers.processes import free_port
from worker import probes


class Watch:
    stuck: str | None = None


def test_the_probes_say_loading_ready_and_stuck_with_the_reason() -> None:
    state = probes.State()
    port = free_port()
    probes.serve(port, state)
    base = f"http://127.0.0.1:{port}"

    def answer(path: str) -> tuple[int, str]:
        got = httpx.get(f"{base}{path}", timeout=5)
        return got.status_code, got.text.strip()

    assert answer("/livez") == (200, "alive")
    assert answer("/readyz") == (503, "loading")
    watch = Watch()
    state.watch = watch  # type: ignore[assignment]
    state.ready = True
    assert answer("/readyz") == (200, "ready")
    watch.stuck = "3 waiting, room to take them, and nothing taken for 121 s"
    assert answer("/livez") == (503, watch.stuck)
    assert answer("/readyz") == (503, watch.stuck)
    assert answer("/metrics")[0] == 200


def test_metrics_are_served_beside_the_probes() -> None:
    state = probes.State()
    port = free_port()
    Gauge("probes_test_gauge", "A gauge only this test sets.").set(7)
    probes.serve(port, state)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "probes_test_gauge 7.0" in text
