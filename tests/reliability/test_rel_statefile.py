"""``state.json`` must survive its writer being killed at any instant.

Re-adoption after a crash trusts ``state.json``: a torn file would turn a live sandbox
into a lost one. So a real process writes ``statefile.write_json`` in a loop and is
SIGKILLed at random moments, many times; after every kill the file must parse and be
exactly one of the versions written. The same harness with a naive writer (truncate and
write in place) must catch torn files, which shows the harness can see the failure.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import support

# Reads "go <first-version>" lines; forks a child that rewrites the file in a loop from that
# version on; prints the child's pid, then "reaped" once the child is dead.
FORKER = r"""
import json, os, sys
sys.path.insert(0, sys.argv[3])
from sandbox.common.statefile import write_json

path, naive = sys.argv[1], sys.argv[2] == "naive"

def version(i):
    return {"version": i, "pad": ("%d-" % i) * (2000 + (i * 7919) % 40000)}

def naive_write(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())

write = naive_write if naive else write_json
for line in sys.stdin:
    first = int(line.split()[1])
    pid = os.fork()
    if pid == 0:
        i = first
        while True:
            write(path, version(i))
            i += 1
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def version(i: int) -> dict:
    return {"version": i, "pad": ("%d-" % i) * (2000 + (i * 7919) % 40000)}


def crash_loop(path: str, naive: bool, budget: float, stop_on_torn: bool = False,
               kills_wanted: int | None = None) -> tuple[int, int, set[int]]:
    """Kill the writer at random moments for ``budget`` seconds, or until ``kills_wanted``
    kills (``budget`` then only a safety cap: a loaded host makes fewer kills a second):
    (kills, torn files, versions seen)."""
    with open(path, "w") as f:
        json.dump(version(0), f)
    forker = subprocess.Popen([sys.executable, "-c", FORKER, path, "naive" if naive else "atomic", str(support.REPO)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rng = random.Random(1234)
    kills = torn = 0
    seen: set[int] = set()
    deadline = time.monotonic() + budget
    try:
        while time.monotonic() < deadline and (kills_wanted is None or kills < kills_wanted):
            forker.stdin.write(f"go {(kills + 1) * 1_000_000}\n")
            forker.stdin.flush()
            child = int(forker.stdout.readline())
            time.sleep(rng.uniform(0.0, 0.02))
            os.kill(child, signal.SIGKILL)
            assert forker.stdout.readline().strip() == "reaped"
            kills += 1
            try:
                with open(path) as f:
                    data = json.load(f)
            except ValueError:
                torn += 1
                if stop_on_torn:
                    break
                continue
            assert data == version(data["version"]), f"a mix of versions after kill {kills}"
            seen.add(data["version"])
    finally:
        forker.kill()
        forker.wait(10)
    return kills, torn, seen


def test_write_json_is_atomic_under_kill9(tmp_path):
    kills, torn, seen = crash_loop(str(tmp_path / "state.json"), naive=False, budget=300.0, kills_wanted=60)
    print(f"\nwrite_json: {kills} kills, {torn} torn files, {len(seen)} distinct versions read back")
    assert torn == 0
    assert kills >= 50
    # The kills landed while writes were happening, not only before the first one.
    assert len(seen - {0}) >= kills // 4
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "state.json"]
    # Temporary files of killed writers may stay behind (mkstemp names): never the target.
    assert all(name.startswith(".tmp-") for name in leftovers), leftovers


def test_the_harness_catches_a_non_atomic_writer(tmp_path):
    kills, torn, _ = crash_loop(str(tmp_path / "state.json"), naive=True, budget=5.0, stop_on_torn=True)
    assert torn >= 1, f"{kills} kills of a truncate-then-write writer left no torn file"
