"""Soak: one sandbox attacks a shared resource while ten others run cells and list files.

`python -m bench.soak_shared [--cells N] [--rounds R] [--only files,capacity,display] [--state-dir DIR]`

Each attack runs for the length of the others' work, then stops:

- **files**: the attacker keeps refilling a tree (three processes) while eight
  ``DELETE /files/tree`` of it run at once, again and again: the file-work threads;
- **capacity**: a caller holds every sandbox the server will still make
  (``max_sandboxes``) and keeps asking for more (409s): capacity and the create path;
- **display**: the attacker, in a 256 MB sandbox, displays metadata of 2.5 million empty
  dicts in a loop and raises a 10 MB exception: the runtime's trimming, the supervisor's
  frame checks and the server's event path.

Meanwhile ten other sandboxes each run a small cell and list their files, one after the
other. Quiet rounds (no attacker) and attacked rounds are interleaved on the same server,
so both see the same machine; the report is the others' p50/p99 per call and errors in
each, and the attacked/quiet ratios (target: no error, p99 within 2x). Nothing here asserts.
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
from bench.soak import WORKERS, list_files, run_cell, run_workers  # noqa: E402

SPARE = 6  # sandboxes the capacity attacker may still take
# What each of the others does, round after round, while the attack runs.
CALLS = {"cell": run_cell, "listing": list_files}

REFILL = '''
import os, multiprocessing, time
def fill(n):
    i = 0
    while True:
        try:
            d = "tree/d%d" % (i % 8)
            os.makedirs(d, exist_ok=True)
            for j in range(100):
                open("%s/f%d_%d_%d" % (d, n, i, j), "w").close()
                open("tree/top%d_%d_%d" % (n, i, j), "w").close()
        except OSError:
            pass
        i += 1
for n in range(3):
    multiprocessing.Process(target=fill, args=(n,), daemon=True).start()
time.sleep(1)
'''

BIG_OUTPUT = '''
import time
from IPython.display import display
end = time.monotonic() + DURATION
n = 0
while time.monotonic() < end:
    display({"text/plain": "x"}, metadata={"m": [{}] * 2_500_000}, raw=True)
    n += 1
raise ValueError("q" * 10_000_000)  # trimmed in the sandbox, sent as an error of a few KB
'''


class Attack:
    """One attack, started before the workers' round and stopped after it."""

    def __init__(self, server: BenchServer) -> None:
        self.server, self.stop, self.threads = server, threading.Event(), []
        self.note: dict[str, t.Any] = {}
        self.client = server.client(timeout=300)

    def spawn(self, fn: t.Callable[[], None]) -> None:
        thread = threading.Thread(target=fn, daemon=True)
        thread.start()
        self.threads.append(thread)

    def finish(self) -> dict[str, t.Any]:
        self.stop.set()
        for thread in self.threads:
            thread.join(300)
        self.cleanup()
        self.client.close()
        return self.note

    def cleanup(self) -> None:
        pass


class FilesAttack(Attack):
    def start(self) -> None:
        # Half a CPU: what is measured is the server's file threads, not the CPU share granted.
        self.sid = create(self.client, cpus=0.5)["id"]
        execute(self.client, self.sid, REFILL)
        self.note["deletes"] = {}
        lock = threading.Lock()

        def deleter() -> None:
            with self.server.client(timeout=300) as c:
                while not self.stop.is_set():
                    code = c.delete(f"/v1/sandboxes/{self.sid}/files/tree").status_code
                    with lock:
                        self.note["deletes"][code] = self.note["deletes"].get(code, 0) + 1

        for _ in range(8):
            self.spawn(deleter)

    def cleanup(self) -> None:
        delete(self.client, self.sid)


class CapacityAttack(Attack):
    def start(self) -> None:
        self.held: list[str] = []
        self.note["refused"] = 0

        def ask() -> bool:
            r = self.client.post("/v1/sandboxes", json={})
            if r.status_code == 201:
                self.held.append(r.json()["id"])
                return True
            self.note["refused"] += 1
            self.note["last_refusal"] = r.json().get("error", {}).get("message", "")[:160]
            return False

        while ask():  # take every sandbox the server will still make
            pass

        def hammer() -> None:
            while not self.stop.is_set():
                ask()
                time.sleep(0.02)

        self.spawn(hammer)

    def cleanup(self) -> None:
        self.note["held"] = len(self.held)
        for sid in self.held:
            delete(self.client, sid)


class DisplayAttack(Attack):
    def start(self) -> None:
        self.sid = create(self.client, memory_mb=256)["id"]

        def flood() -> None:
            with self.server.client(timeout=600) as c:
                while not self.stop.is_set():
                    done = done_of(execute(c, self.sid, "DURATION = 10\n" + BIG_OUTPUT, timeout_seconds=120))
                    state = f"{done.get('status')}/{done.get('sandbox_state')}/{done.get('reason')}"
                    states = self.note.setdefault("states", {})
                    states[state] = states.get(state, 0) + 1

        self.spawn(flood)

    def cleanup(self) -> None:
        delete(self.client, self.sid)


ATTACKS = {"files": FilesAttack, "capacity": CapacityAttack, "display": DisplayAttack}


def soak(server: BenchServer, name: str, workers: list[str], cells: int, rounds: int) -> dict[str, t.Any]:
    quiet: dict[str, list] = {"cell": [], "listing": [], "errors": []}
    attacked: dict[str, list] = {"cell": [], "listing": [], "errors": []}
    notes = []
    for _ in range(rounds):
        for k, v in run_workers(server, workers, cells, CALLS).items():
            quiet[k] += v
        attack = ATTACKS[name](server)
        attack.start()
        time.sleep(2)  # the attack under way before the others start
        for k, v in run_workers(server, workers, cells, CALLS).items():
            attacked[k] += v
        notes.append(attack.finish())
    out: dict[str, t.Any] = {"attack": notes, "load": loadavg()}
    for call in ("cell", "listing"):
        q, a = summary(quiet[call], 1000), summary(attacked[call], 1000)
        out[call] = {"quiet_ms": q, "attacked_ms": a, "p50_ratio": ratio(a.get("p50"), q.get("p50")),
                     "p99_ratio": ratio(a.get("p99"), q.get("p99"))}
    out["quiet_errors"], out["attacked_errors"] = quiet["errors"][:10], attacked["errors"][:10]
    out["errors"] = {"quiet": len(quiet["errors"]), "attacked": len(attacked["errors"])}
    return out


def main(argv: list[str] | None = None) -> dict[str, t.Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_shared")
    parser.add_argument("--cells", type=int, default=20, help="(cell, listing) pairs per worker per round")
    parser.add_argument("--rounds", type=int, default=2, help="quiet/attacked pairs per attack")
    parser.add_argument("--only", default="files,capacity,display")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    args = parser.parse_args(argv)
    server = BenchServer(args.state_dir, pool_size=2,
                         extra_args=("--set", f"max_sandboxes={WORKERS + SPARE}"))
    server.start()
    report: dict[str, t.Any] = {}
    try:
        with server.client(timeout=300) as c:
            workers = [create(c)["id"] for _ in range(WORKERS)]
            run_workers(server, workers, 2, CALLS)  # warm
            for name in args.only.split(","):
                report[name] = soak(server, name, workers, args.cells, args.rounds)
                print(json.dumps({name: report[name]}, indent=1, default=str), flush=True)
            for w in workers:
                delete(c, w)
    finally:
        server.stop()
    return report


if __name__ == "__main__":
    main()
