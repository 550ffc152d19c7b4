"""Small concurrent load: many clients on many sandboxes at once, nothing lost or crossed.

Eight sandboxes, each driven by its own client thread running 25 small cells at the same
time as the others. Every cell must succeed and each client must get exactly the output
its own cells printed, in order. The latency percentiles are printed, not asserted (the
full benchmark lives in bench/).
"""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest

import support

pytestmark = pytest.mark.slow

SANDBOXES = 8
CELLS = 25


def test_eight_clients_25_cells_each_get_exactly_their_own_output(sandbox_server, api, isolation):
    headers = {"Authorization": f"Bearer {sandbox_server.token}"}
    ids: list[str] = []
    lock = threading.Lock()
    failures: list[BaseException] = []

    def make() -> None:
        try:
            with httpx.Client(base_url=sandbox_server.url, headers=headers, timeout=120) as c:
                sid = support.create(c, isolation=isolation)["id"]
            with lock:
                ids.append(sid)
        except BaseException as exc:
            failures.append(exc)

    makers = [threading.Thread(target=make) for _ in range(SANDBOXES)]
    for t in makers:
        t.start()
    for t in makers:
        t.join(180)
    try:
        assert not failures, failures
        assert len(set(ids)) == SANDBOXES

        outputs: dict[str, list[str]] = {sid: [] for sid in ids}
        counts: dict[str, list[int]] = {sid: [] for sid in ids}
        latencies: list[float] = []
        start = threading.Barrier(SANDBOXES)

        def client(sid: str) -> None:
            try:
                with httpx.Client(base_url=sandbox_server.url, headers=headers,
                                  timeout=httpx.Timeout(10, read=120)) as c:
                    start.wait(60)
                    for i in range(CELLS):
                        began = time.monotonic()
                        events = support.ok(support.execute(c, sid, f"x = {i}; print('{sid}:{i}')"))
                        took = time.monotonic() - began
                        outputs[sid].append(support.stream_text(events))
                        counts[sid].append(support.done_of(events)["execution_count"])
                        with lock:
                            latencies.append(took)
            except BaseException as exc:
                failures.append(exc)

        began = time.monotonic()
        clients = [threading.Thread(target=client, args=(sid,)) for sid in ids]
        for t in clients:
            t.start()
        for t in clients:
            t.join(300)
        wall = time.monotonic() - began
        assert not failures, failures
        for sid in ids:
            assert outputs[sid] == [f"{sid}:{i}\n" for i in range(CELLS)]
            assert counts[sid] == list(range(counts[sid][0], counts[sid][0] + CELLS))
            assert support.result_text(support.ok(support.execute(api, sid, "x"))) == str(CELLS - 1)
        q = statistics.quantiles(latencies, n=100)
        print(f"\nload: {SANDBOXES} sandboxes x {CELLS} cells in {wall:.2f} s "
              f"({len(latencies) / wall:.0f} cells/s); latency p50 {q[49] * 1000:.1f} ms, "
              f"p99 {q[98] * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms")
    finally:
        for sid in ids:
            api.delete(f"/v1/sandboxes/{sid}")
