"""What the soaks share: the others' work while one sandbox attacks.

Each soak (soak_shared.py, soak_egress.py) measures how ten ordinary sandboxes fare while
one hostile sandbox attacks a shared resource. The ordinary ones do the same thing in each:
a small cell (and, for some attacks, a file listing) over and over, one worker per sandbox,
all at once, each call timed and every failure kept as text, since a refused or broken call
is what a soak measures.
"""

from __future__ import annotations

import time
import typing as t
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench.harness import BenchServer, done_of, execute

WORKERS = 10
CELL = "total = sum(i * i for i in range(20000))\nprint(total % 97)"

# A call of a worker: given its client and sandbox, an error text, or None when it went well.
Call = t.Callable[[httpx.Client, str], "str | None"]


def run_cell(client: httpx.Client, sandbox_id: str) -> str | None:
    done = done_of(execute(client, sandbox_id, CELL))
    return None if done.get("status") == "ok" else f"cell: {done.get('status')}"


def list_files(client: httpx.Client, sandbox_id: str) -> str | None:
    r = client.get(f"/v1/sandboxes/{sandbox_id}/files")
    return None if r.status_code == 200 else f"listing: {r.status_code} {r.text[:120]}"


def run_workers(server: BenchServer, sandbox_ids: list[str], rounds: int, calls: dict[str, Call]) -> dict[str, list]:
    """Every worker (one per sandbox, all at once) makes ``rounds`` rounds of ``calls`` in
    sequence. Returns each call's times (seconds) under its name and every error under
    ``errors``."""
    def worker(sandbox_id: str) -> dict[str, list]:
        out: dict[str, list] = {name: [] for name in calls} | {"errors": []}
        with server.client(timeout=120) as c:
            for _ in range(rounds):
                for name, call in calls.items():
                    t0 = time.perf_counter()
                    try:
                        error = call(c, sandbox_id)
                    except Exception as exc:  # a refused or broken call is what this measures
                        error = f"{name} {type(exc).__name__}: {str(exc)[:120]}"
                    out[name].append(time.perf_counter() - t0)
                    if error:
                        out["errors"].append(error)
        return out

    with ThreadPoolExecutor(len(sandbox_ids)) as pool:
        results = list(pool.map(worker, sandbox_ids))
    return {k: [x for r in results for x in r[k]] for k in [*calls, "errors"]}
