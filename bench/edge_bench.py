"""Benchmark 8: what a hostile sandbox's output costs the host (supervisor and server).

A sandbox created with `memory_mb=256, cpus=0.1` runs cells that write straight onto its
runtime's channel or produce oversized output: the flood of the issue (five 39 MB frames of
13 million empty dicts), the same structure under the frame cap, deep nesting, display
metadata far past the output cap, and a flood of many small frames. For each, the peak RSS
above the process's own start and the CPU seconds of the sandbox's supervisor and of the
server are sampled, next to an idle cell (`pass`) as the baseline, with the time until the
execute ended (sandbox stopped or output truncated). Targets: each process under 64 MiB
above idle, and the execute over within a second of the cell's writing.
"""

from __future__ import annotations

import time
import typing as t

from bench.harness import BenchServer, RssSampler, create, delete, done_of, execute, process_cpu_seconds
from sandbox.runtime.forge import FORGE_CELL as FORGE  # frame(), write_all() onto the cell's own channel

MiB = 1 << 20


VARIANTS: dict[str, str] = {
    "idle cell (baseline)": "pass",
    "5 x 39 MB frames of 13 M empty dicts": FORGE + '''
body = b"[" + b"{}," * 12_999_999 + b"{}]"
head = json.dumps({"type": "display_data", "exec": runtime.current, "data": {"text/plain": "x"},
                   "transient": {}, "metadata": {"m": None}}).encode()[:-6]
payload = frame(head + body + b"}}")
del body
t0 = time.monotonic()
for _ in range(5):
    write_all(payload)
''',
    "9 MB frame of 3 M empty dicts (under the size cap)": FORGE + '''
body = b"[" + b"{}," * 2_999_999 + b"{}]"
head = json.dumps({"type": "display_data", "exec": runtime.current, "data": {"text/plain": "x"},
                   "transient": {}, "metadata": {"m": None}}).encode()[:-6]
write_all(frame(head + body + b"}}"))
''',
    "100000 nested [": FORGE + '''
write_all(frame(b'{"type":"stream","name":"stdout","text":' + b"[" * 100_000 + b"]" * 100_000 + b"}"))
''',
    "10 displays with 10 MB metadata": '''
from IPython.display import display
for i in range(10):
    display({"text/plain": "x"}, metadata={"m": "y" * 10_000_000}, raw=True)
''',
    "40 MiB of 64-byte stream frames": FORGE + '''
one = frame({"type": "stream", "exec": runtime.current, "name": "stdout", "text": "z" * 4})
block = one * ((1 << 20) // len(one))
for _ in range(40):
    write_all(block)
''',
}


def _measure(server: BenchServer, code: str) -> dict[str, t.Any]:
    client = server.client()
    sandbox = create(client, memory_mb=256, cpus=0.1)
    sid = sandbox["id"]
    supervisor = server.supervisor_pid(sid)
    try:
        cpu_sup, cpu_srv = process_cpu_seconds(supervisor) or 0.0, process_cpu_seconds(server.pid) or 0.0
        with RssSampler(supervisor) as sup_rss, RssSampler(server.pid) as srv_rss:
            t0 = time.monotonic()
            events = execute(client, sid, code, timeout_seconds=120)
            seconds = time.monotonic() - t0
        done = done_of(events)
        after_sup = process_cpu_seconds(supervisor)  # None once a stopped sandbox's supervisor exited
        return {
            "seconds": round(seconds, 3),
            "reason": done.get("reason"), "truncated": done.get("truncated"), "sandbox_state": done.get("sandbox_state"),
            "supervisor_peak_mib": round((sup_rss.peak - sup_rss.before) / MiB, 1),
            "server_peak_mib": round((srv_rss.peak - srv_rss.before) / MiB, 1),
            "supervisor_cpu_s": round(after_sup - cpu_sup, 3) if after_sup is not None else None,
            "server_cpu_s": round((process_cpu_seconds(server.pid) or 0.0) - cpu_srv, 3),
            "events": len(events),
        }
    finally:
        delete(client, sid)
        client.close()


def bench_edge(server: BenchServer, reps: int = 1) -> dict[str, t.Any]:
    metrics: dict[str, t.Any] = {}
    for name, code in VARIANTS.items():
        runs = [_measure(server, code) for _ in range(reps)]
        metrics[name] = max(runs, key=lambda r: r["supervisor_peak_mib"] + r["server_peak_mib"])
    idle = metrics["idle cell (baseline)"]
    rows, met = [], True
    for name, m in metrics.items():
        worst = max(m["supervisor_peak_mib"], m["server_peak_mib"])
        rows.append((name, "peak RSS MiB sup/srv", f"{m['supervisor_peak_mib']}/{m['server_peak_mib']}",
                     f"{idle['supervisor_peak_mib']}/{idle['server_peak_mib']}", None, "< 64 MiB above idle"))
        rows.append(("", "s to end; reason", f"{m['seconds']}; {m['reason'] or ('truncated' if m['truncated'] else 'ok')}",
                     idle["seconds"], None, ""))
        rows.append(("", "CPU s sup/srv", f"{m['supervisor_cpu_s']}/{m['server_cpu_s']}",
                     f"{idle['supervisor_cpu_s']}/{idle['server_cpu_s']}", None, ""))
        if worst - max(idle["supervisor_peak_mib"], idle["server_peak_mib"]) >= 64:
            met = False
    return {"metrics": metrics, "rows": rows, "meets_target": met}
