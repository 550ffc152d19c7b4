"""A sandbox's supervisor, forked from the supervisor template or started as a new interpreter:
its start and its memory.

    .venv/bin/python -m bench.supervisor_bench [--sandboxes 10] [--state-dir DIR]

Two servers of its own, one after the other on the same state directory (no warm pool, so
every create starts a supervisor): ``supervisor_template=false`` (each supervisor a new
``python -m sandbox.supervisor``) and the default (forked by the template). In each,
``--sandboxes`` bwrap sandboxes are created one after another, each answers ``1 + 1``, and
then, all idle, each supervisor's PSS, USS (its private pages) and RSS are read from
``/proc/PID/smaps_rollup``, with the template's PSS (shared out over the supervisors it
forked: the figure to compare is "supervisor + template share"). Reported: the p50 create
(POST to its 201: the supervisor's start, bwrap's and the runtime's boot) and the memory
figures; bench/results/supervisor.json holds every create.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import (DEFAULT_STATE_DIR, MiB, BenchServer, HostLoad, create, delete, execute,  # noqa: E402
                           markdown_table, server_settings, smaps_rollup)
from bench.peers_memory import supervisor_template  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
ARMS = {"new interpreter (supervisor_template=false)": ("supervisor_template=false",),
        "forked by the template (default)": ()}


def arm(state_dir: str, settings: tuple[str, ...], n: int) -> dict:
    server = BenchServer(state_dir, pool_size=0, extra_args=server_settings(settings))
    server.start()
    creates, ids = [], []
    try:
        with server.client(timeout=300) as c:
            for _ in range(n):
                t0 = time.perf_counter()
                ids.append(create(c, isolation="bwrap")["id"])
                creates.append(time.perf_counter() - t0)
                execute(c, ids[-1], "1 + 1")
            time.sleep(2)  # idle: the cells' buffers settled
            supervisors = [server.supervisor_pid(i) for i in ids]
            memory = [smaps_rollup(p) for p in supervisors]
            template = sum(smaps_rollup(p).get("pss", 0) for p in supervisor_template(server.pid))
            for i in ids:
                delete(c, i)
    finally:
        server.stop()
    mean = lambda key: statistics.mean(m.get(key, 0) for m in memory) / MiB  # noqa: E731
    uss = statistics.mean(m.get("private_dirty", 0) + m.get("private_clean", 0) for m in memory) / MiB
    return {"create_p50_s": statistics.median(creates), "create_s": creates,
            "supervisor_pss_mib": mean("pss"), "supervisor_uss_mib": uss, "supervisor_rss_mib": mean("rss"),
            "template_pss_mib": template / MiB, "template_share_mib": template / MiB / n,
            "supervisor_and_share_mib": mean("pss") + template / MiB / n}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.supervisor_bench")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--sandboxes", type=int, default=10)
    args = parser.parse_args()
    load = HostLoad()
    result = {label: arm(args.state_dir, settings, args.sandboxes) for label, settings in ARMS.items()}
    result["host_load"] = load.finish()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "supervisor.json").write_text(json.dumps(result, indent=1) + "\n")
    keys = ["create_p50_s", "supervisor_pss_mib", "supervisor_uss_mib", "supervisor_rss_mib", "template_pss_mib",
            "supervisor_and_share_mib"]
    rows = [[label] + [f"{result[label][k]:.3f}" if k == "create_p50_s" else f"{result[label][k]:.1f}" for k in keys]
            for label in ARMS]
    print(markdown_table(["supervisor"] + keys, rows))
    print("host load:", json.dumps(result["host_load"]))


if __name__ == "__main__":
    main()
