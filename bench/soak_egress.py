"""Soak: one sandbox attacks the egress proxy while ten others run cells.

`python -m bench.soak_egress [--cells N] [--rounds R] [--state-dir DIR]`

The attacker (a sandbox with an egress policy) forks processes that open thousands of
connections to its proxy socket and keep them, and one more that connects and closes in a
loop (the cap answers each with 429 and closes it: CPU, not descriptors). Meanwhile ten
other sandboxes run small cells one after another. Quiet rounds (no attacker) and attacked
rounds are interleaved on the same server, so both see the same machine; the report is the
others' p50/p99 latency and errors in each, and the attacked/quiet ratio (target: no error,
p99 within 2x). Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import threading
import time
import typing as t

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    __package__ = "bench"

from bench.harness import (DEFAULT_STATE_DIR, BenchServer, create, delete, done_of, execute, loadavg,  # noqa: E402
                           ratio, summary)
from bench.soak import WORKERS, run_cell, run_workers  # noqa: E402

ATTACK = '''
import os, socket, time
SOCK = "/run/sandbox-egress/proxy.sock"
def holder(n):
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        try:
            s.connect(SOCK)
            held.append(s)
        except OSError:
            pass
    time.sleep(DURATION)
def churner():
    end = time.monotonic() + DURATION
    n = 0
    while time.monotonic() < end:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(SOCK)
            n += 1
        except OSError:
            pass
        s.close()
    print("churned", n)
children = []
for job in [lambda: holder(900)] * 5 + [churner]:
    pid = os.fork()
    if pid == 0:
        try:
            job()
        finally:
            os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print("attack over")
'''


def run_cells(server: BenchServer, sandbox_ids: list[str], cells: int) -> tuple[list[float], list[str]]:
    """Every worker runs ``cells`` cells in sequence; all workers at once."""
    out = run_workers(server, sandbox_ids, cells, {"cell": run_cell})
    return out["cell"], out["errors"]


def attacked_round(server: BenchServer, cells: int, workers: list[str], duration: float) -> dict[str, t.Any]:
    with server.client(timeout=300) as c:
        attacker = create(c, egress={"allow": ["example.org"]})["id"]
        out: dict[str, t.Any] = {}

        def attack() -> None:
            with server.client(timeout=duration + 120) as ac:
                try:
                    out["attack"] = done_of(execute(ac, attacker, f"DURATION = {duration}\n" + ATTACK,
                                                    timeout_seconds=int(duration) + 60)).get("status")
                except Exception as exc:
                    out["attack"] = f"{type(exc).__name__}: {exc}"

        thread = threading.Thread(target=attack)
        thread.start()
        time.sleep(3)  # the holders have their connections
        usage = c.get(f"/v1/sandboxes/{attacker}").json().get("egress", {}).get("usage", {})
        times, errors = run_cells(server, workers, cells)
        thread.join()
        t0 = time.perf_counter()
        delete(c, attacker)
        return {"times": times, "errors": errors, "attacker_connections": usage.get("connections"),
                "attacker_refused": usage.get("refused"), "attack": out.get("attack"),
                "delete_attacker_s": round(time.perf_counter() - t0, 2)}


def main(argv: list[str] | None = None) -> dict[str, t.Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_egress")
    parser.add_argument("--cells", type=int, default=30, help="cells per worker per round")
    parser.add_argument("--rounds", type=int, default=2, help="quiet/attacked pairs")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    server = BenchServer(args.state_dir, pool_size=WORKERS)
    server.start()
    quiet: dict[str, list] = {"times": [], "errors": []}
    attacked: dict[str, list] = {"times": [], "errors": [], "rounds": []}
    try:
        with server.client(timeout=300) as c:
            workers = [create(c)["id"] for _ in range(WORKERS)]
            run_cells(server, workers, 3)  # warm
            for _ in range(args.rounds):
                times, errors = run_cells(server, workers, args.cells)
                quiet["times"] += times
                quiet["errors"] += errors
                r = attacked_round(server, args.cells, workers, duration=60)
                attacked["times"] += r.pop("times")
                attacked["errors"] += r.pop("errors")
                attacked["rounds"].append(r)
            for w in workers:
                delete(c, w)
    finally:
        server.stop()
    q, a = summary(quiet["times"], 1000), summary(attacked["times"], 1000)
    report = {"quiet_ms": q, "attacked_ms": a, "quiet_errors": quiet["errors"][:10], "attacked_errors": attacked["errors"][:10],
              "p50_ratio": ratio(a.get("p50"), q.get("p50")), "p99_ratio": ratio(a.get("p99"), q.get("p99")),
              "rounds": attacked["rounds"], "loadavg_after": loadavg()}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
