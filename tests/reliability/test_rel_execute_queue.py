"""Executes are never lost, doubled or reordered, and a vanished client does not hold the
sandbox: concurrent executes on one sandbox queue in arrival order and each runs once; a
client that disconnects mid-cell gets its cell interrupted so the next one runs at once."""

from __future__ import annotations

import json
import threading
import time

import httpx

import reliability_support as rs
import support


def test_concurrent_executes_run_once_each_in_arrival_order(sandbox_server, new_sandbox, run):
    sid = new_sandbox()["id"]
    support.ok(run(sid, "order = []"))
    results: dict[str, tuple[float, list[dict]]] = {}
    failures: list[BaseException] = []

    def submit(name: str, code: str) -> None:
        try:
            with httpx.Client(base_url=sandbox_server.url, timeout=httpx.Timeout(10, read=60),
                              headers={"Authorization": f"Bearer {sandbox_server.token}"}) as c:
                events = support.execute(c, sid, code)
            results[name] = (time.monotonic(), events)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    first = threading.Thread(target=submit, args=("a", "import time; time.sleep(1); order.append('a')"))
    second = threading.Thread(target=submit, args=("b", "order.append('b')"))
    first.start()
    time.sleep(0.2)  # "a" arrives first
    second.start()
    first.join(60)
    second.join(60)
    assert not failures, failures
    assert set(results) == {"a", "b"}
    done_a = support.done_of(support.ok(results["a"][1]))
    done_b = support.done_of(support.ok(results["b"][1]))
    assert done_a["execution_count"] + 1 == done_b["execution_count"]
    assert results["a"][0] < results["b"][0]
    assert support.result_text(support.ok(run(sid, "order"))) == "['a', 'b']"


def test_client_disconnect_interrupts_its_cell(sandbox_server, new_sandbox, run):
    sid = new_sandbox()["id"]
    with httpx.Client(base_url=sandbox_server.url, timeout=httpx.Timeout(10, read=60),
                      headers={"Authorization": f"Bearer {sandbox_server.token}"}) as c:
        with c.stream("POST", f"/v1/sandboxes/{sid}/execute", json={"code": rs.long_cell(30)}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():  # until the cell has really started
                if line and "started" in json.loads(line).get("text", ""):
                    break
        # leaving both contexts closes the connection with the cell still sleeping
    began = time.monotonic()
    events = support.ok(run(sid, "1 + 1"))
    waited = time.monotonic() - began
    assert support.result_text(events) == "2"
    assert waited < 20, f"the next execute waited {waited:.1f} s: the abandoned cell was not interrupted"
    # Interrupted, not finished; the sandbox kept its state.
    assert support.result_text(support.ok(run(sid, "started, 'finished' in globals()"))) == "(True, False)"
