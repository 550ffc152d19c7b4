"""How many idle sandboxes with pandas imported one server holds, admitted by use.

    .venv/bin/python bench/density_bench.py [--max 100] [--budget 1200] [--state-dir DIR]

Starts its own server with the default settings (1024 MB limit, memory_request_mb 200)
and no warm pool; each sandbox asks for a ``--disk-mb`` workspace (256: a workspace's cap is
reserved whole against the free disk, which stopped 1024 MB ones at 59 on 59 GB free), then creates sandboxes one after another, each importing pandas, until
``--max`` run, a create is refused (its reason is recorded) or ``--budget`` seconds are
spent. Then every sandbox is asked ``1 + 1`` once more and the answers counted. Reported:
how many were admitted and answer, the first refusal, the host's MemAvailable before and
after, and what the server's ledger reserved. All sandboxes are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import DEFAULT_STATE_DIR, BenchServer, loadavg  # noqa: E402
from sandbox.core.memory_pressure import available_mb  # noqa: E402


def answers(client, sandbox_id: str, code: str) -> str | None:
    """The text result of ``code``, or None when it did not run."""
    result = None
    with client.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code}) as r:
        if r.status_code != 200:
            return None
        for line in r.iter_lines():
            event = json.loads(line) if line else {}
            if event.get("type") == "execute_result":
                result = event["data"].get("text/plain")
            if event.get("type") == "done" and event.get("status") != "ok":
                return None
    return result


def run(server: BenchServer, most: int, budget: float, disk_mb: int, log=print) -> dict:
    started = time.monotonic()
    before = available_mb()
    made, refusal = [], None
    with server.client(timeout=300) as api:
        try:
            while len(made) < most and time.monotonic() - started < budget:
                r = api.post("/v1/sandboxes", json={"ttl_seconds": 3600, "disk_mb": disk_mb})
                if r.status_code != 201:
                    refusal = {"status": r.status_code, "error": r.json().get("error")}
                    log(f"  create {len(made) + 1} refused: {r.text[:300]}")
                    break
                made.append(r.json()["id"])
                if answers(api, made[-1], "import pandas; len(pandas.__version__) > 0") != "True":
                    log(f"  sandbox {len(made)} could not import pandas")
                if len(made) % 10 == 0:
                    log(f"  {len(made)} sandboxes, {available_mb()} MB available, {time.monotonic() - started:.0f} s")
            filled = time.monotonic() - started
            after = available_mb()
            answered = sum(answers(api, sandbox_id, "1 + 1") == "2" for sandbox_id in made)
            capacity = api.get("/v1/info").json()["capacity"]["memory_mb"]
        finally:
            for sandbox_id in made:
                api.delete(f"/v1/sandboxes/{sandbox_id}")
    per_sandbox = (before - after) / len(made) if made else None
    return {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": loadavg(),
            "target": most, "disk_mb": disk_mb, "settings": list(server.extra_args[1::2]), "admitted": len(made), "answered": answered, "refusal": refusal,
            "fill_seconds": round(filled, 1), "memory_available_mb": {"before": before, "after": after},
            "host_mb_per_sandbox": round(per_sandbox, 1) if per_sandbox else None, "ledger_memory_mb": capacity,
            "stopped_by": "refusal" if refusal else ("target" if len(made) >= most else "time budget")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=100)
    parser.add_argument("--disk-mb", type=int, default=256,
                        help="each sandbox's workspace cap: workspaces are reserved whole against the free disk "
                             "(1024 each stopped 59 sandboxes on 59 GB free)")
    parser.add_argument("--budget", type=float, default=1200.0, help="seconds for the creates, at most")
    parser.add_argument("--state-dir", default=os.environ.get("SANDBOX_BENCH_STATE_DIR", DEFAULT_STATE_DIR))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a server setting (the control: --set memory_request_mb=0 reserves whole limits)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "density-latest.json"))
    args = parser.parse_args()
    server = BenchServer(args.state_dir, pool_size=0, extra_args=tuple(a for s in args.set for a in ("--set", s)))
    server.start()
    try:
        result = run(server, args.max, args.budget, args.disk_mb)
    finally:
        server.stop()
    print(json.dumps({k: v for k, v in result.items() if k != "ledger_memory_mb"}, indent=1))
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
