"""/metrics: Prometheus' text format, read back with prometheus_client's own parser; behind
the API's authentication, with the loopback scrape port (metrics_port) opening it alone."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import support


def _families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(families: dict, name: str, sample: str | None = None, **labels) -> float:
    family = families[name]
    found = [s.value for s in family.samples if s.name == (sample or name)
             and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found)


def _scrape(api) -> dict:
    response = api.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return _families(response.text)


def test_metrics_count_creates_executes_and_their_latency(api, new_sandbox, run):
    before = _scrape(api)
    sandbox = new_sandbox()
    events = run(sandbox["id"], "x = sum(range(1000))")
    assert events[-1]["status"] == "ok"
    after = _scrape(api)
    tier = sandbox["isolation"]["backend"]
    pooled = str(sandbox["from_pool"]).lower()
    creates = "sandbox_kernel_creates"
    assert _value(after, creates, creates + "_total", tier=tier, from_pool=pooled) == \
        _value(before, creates, creates + "_total", tier=tier, from_pool=pooled) + 1
    executes = "sandbox_kernel_executes"
    assert _value(after, executes, executes + "_total", status="ok") == \
        _value(before, executes, executes + "_total", status="ok") + 1
    latency = "sandbox_kernel_execute_seconds"
    assert _value(after, latency, latency + "_count") == _value(before, latency, latency + "_count") + 1
    assert _value(after, "sandbox_kernel_sandboxes", state="running", tier=tier) >= 1
    assert after["sandbox_kernel_sandboxes"].type == "gauge" and after[latency].type == "histogram"
    # The server's own memory and descriptors, and the usage records' totals.
    assert _value(after, "sandbox_kernel_process_resident_memory_bytes") > 10 * 1024 * 1024
    assert _value(after, "sandbox_kernel_process_open_fds") > 0
    for name in ("usage_cpu_seconds", "usage_executes", "egress_requests", "egress_refusals"):
        assert after[f"sandbox_kernel_{name}"].type == "counter", name
    assert "sandbox_kernel_pool_ready" in after


def test_metrics_need_the_token(sandbox_server):
    with httpx.Client(base_url=sandbox_server.url, timeout=30) as anonymous:
        refused = anonymous.get("/metrics")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    with sandbox_server.client() as api:  # the control: the same request with the token
        assert api.get("/metrics").status_code == 200


@pytest.mark.slow
def test_the_scrape_port_opens_metrics_alone(spawn_server):
    port = support.free_port()
    server = spawn_server("--set", f"metrics_port={port}")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as scraper:
        response = scraper.get("/metrics")
        assert response.status_code == 200, response.text
        assert "sandbox_kernel_sandboxes" in _families(response.text)
        assert scraper.get("/v1/sandboxes").status_code == 401  # nothing else is open there
        assert scraper.post("/v1/sandboxes", json={}).status_code == 401
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:  # nor /metrics on the API's port
        assert anonymous.get("/metrics").status_code == 401
