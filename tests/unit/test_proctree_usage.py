"""A sandbox's usage where it has no cgroup (an ordinary user's server): read from its process
tree in /proc (sandbox/usage/proctree.py), here on a real tree of processes: a parent whose
child holds memory it wrote and spins, and a grandchild that ended (its CPU is its parent's
children's time)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sandbox.usage.meter import UsageMeter
from sandbox.usage.proctree import ProcessTreeUsage

CHILD = r"""
import subprocess, sys, time
subprocess.run([sys.executable, "-c", "x = sum(range(2 * 10**7))"])   # a grandchild, ended
block = b"\x01" * (64 * 2**20)                                         # written: resident
x = sum(range(2 * 10**7))
print("ready", flush=True)
time.sleep(120)
"""
PARENT = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {CHILD!r}])"


class NoCgroup:
    cgroup = None
    workspace = "/nonexistent"


def test_cpu_memory_and_processes_of_a_tree_without_a_cgroup():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        tree = ProcessTreeUsage(parent.pid)
        deadline = time.monotonic() + 120
        while not (tree.refresh() and len(tree.pids) == 2 and tree.memory_working_set() > 64 * 2**20):
            assert time.monotonic() < deadline, tree.pids
            time.sleep(0.2)
        assert tree.processes() >= 2
        assert tree.cpu_seconds() > 0.2  # the child's loop and the ended grandchild's

        meter = UsageMeter({"state": "running"}, NoCgroup(), root_pid=lambda: parent.pid)
        usage = meter.sample(with_disk=False)
        assert usage["measured_by"] == "processes", usage
        assert usage["memory_bytes"] > 64 * 2**20 and usage["memory_peak_bytes"] >= usage["memory_bytes"], usage
        assert usage["cpu_seconds"] > 0.2 and usage["processes"] >= 2, usage
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the whole tree
        parent.wait()
    ended = UsageMeter({"state": "running"}, NoCgroup(), root_pid=lambda: parent.pid).sample(with_disk=False)
    # said, never a silent 0: null figures, "not measured"
    assert ended["measured_by"] == "not measured", ended
    assert all(ended[name] is None for name in ("cpu_seconds", "memory_bytes", "memory_peak_bytes", "processes",
                                                "memory_gib_hours")), ended
