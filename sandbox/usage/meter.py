"""A sandbox's live usage, measured by its supervisor and kept in its state record.

The supervisor is the one process that lives as long as the sandbox (it survives server
restarts), so it owns the figures: it samples the sandbox's cgroup (CPU time, memory,
processes) and workspace (disk) every few seconds, integrates memory and disk over time
(GiB-hours, what a bill is made of) and keeps the totals in ``state.json``'s ``usage``
field. Under gVisor the cgroup holds the Sentry and the Gofer with the sandbox's code
(runsc runs with ``--ignore-cgroups`` inside it), so the same counters cover the whole
sandbox, the guest kernel's own work included.

Counters only move forward across a pause: a restored sandbox has a new cgroup whose
counters start at zero, so what the previous one counted is carried in ``*_base``.
A warm sandbox is nobody's until it is claimed: its boot is not billed (``start_billing``).

Without a cgroup (an ordinary user's server) the same figures come from the sandbox's
process tree in /proc (``proctree.py``); ``measured_by`` says which ("cgroup", "processes"),
or "not measured" while neither can be read: a reader shows that, never a 0 it never read.
"""

from __future__ import annotations

import os
import time
import typing as t

from ..common import statefile
from .proctree import ProcessTreeUsage

GIB = 1024 ** 3
DISK_WALK_LIMIT = 20000  # files: a plain-directory workspace is measured by walking it

# The figures a sandbox's ``usage`` holds (GET /v1/sandboxes/{id}, docs/api.md): one list,
# so that the record, the store and the report agree on the names.
FIELDS = ("cpu_seconds", "memory_bytes", "memory_peak_bytes", "disk_bytes", "processes", "executes",
          "commands", "alive_seconds", "paused_seconds", "memory_gib_hours", "disk_gib_hours")


def disk_used(workspace: str) -> int:
    """Bytes used in the workspace: its own filesystem's count when it is one (the capped
    ext4 image), else the files' allocated blocks, walking at most DISK_WALK_LIMIT entries."""
    try:
        if os.path.ismount(workspace):
            st = os.statvfs(workspace)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
    except OSError:
        return 0
    total, seen, stack = 0, 0, [workspace]
    while stack and seen < DISK_WALK_LIMIT:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
    return total


class UsageMeter:
    """Keeps ``record["usage"]`` up to date from ``host`` (the sandbox's HostResources)."""

    def __init__(self, record: dict, host, restoring: bool = False,
                 root_pid: t.Callable[[], int | None] = lambda: None):
        self.record = record
        self.host = host
        self.root_pid = root_pid  # the sandbox's first process (bwrap), for the /proc fallback
        usage = record.get("usage") or {}
        self.usage = {name: usage.get(name, 0) for name in FIELDS}
        self.usage["sampled_at"] = usage.get("sampled_at")
        record["usage"] = self.usage
        # What earlier cgroups of this sandbox counted (a restore starts a new one).
        self.cpu_base = float(self.usage["cpu_seconds"]) if restoring else 0.0
        self.last = time.time()
        if restoring and record.get("paused_at"):
            self.usage["paused_seconds"] += max(0.0, self.last - statefile.epoch(record["paused_at"]))

    def source(self) -> tuple[t.Any, str]:
        """What the figures are read from now: the cgroup, else the process tree, else None."""
        if self.host.cgroup is not None:
            return self.host.cgroup, "cgroup"
        pid = self.root_pid()
        if pid:
            processes = ProcessTreeUsage(pid)
            if processes.refresh():
                return processes, "processes"
        return None, "not measured"

    def start_billing(self) -> None:
        """A claimed warm sandbox: what it used while it waited in the pool is not its owner's."""
        counters, _ = self.source()
        self.cpu_base = -(counters.cpu_seconds() if counters is not None else 0.0)
        for name in ("executes", "commands", "alive_seconds", "memory_gib_hours", "disk_gib_hours"):
            self.usage[name] = 0
        self.usage["memory_peak_bytes"] = 0
        self.last = time.time()

    def count_execute(self) -> None:
        self.usage["executes"] += 1

    def count_command(self) -> None:
        self.usage["commands"] += 1

    def sample(self, with_disk: bool = True) -> dict:
        """Read the counters now; fold the time since the last sample into the integrals.
        ``with_disk`` false keeps the last disk figure (a walk of a plain workspace costs)."""
        now = time.time()
        elapsed = max(0.0, now - self.last)
        self.last = now
        usage = self.usage
        counters, source = self.source()
        if counters is not None or "measured_by" not in usage:  # an ended sandbox keeps what measured it
            usage["measured_by"] = source
        if counters is not None:
            cpu = round(self.cpu_base + counters.cpu_seconds(), 6)
            # a process tree's sum can step back (a parent gone with children uncounted)
            usage["cpu_seconds"] = cpu if source == "cgroup" else max(float(usage["cpu_seconds"]), cpu)
            usage["memory_bytes"] = counters.memory_working_set()
            peak = counters.memory_peak() if source == "cgroup" else usage["memory_bytes"]
            usage["memory_peak_bytes"] = max(int(usage["memory_peak_bytes"]), peak)
            usage["processes"] = counters.processes()
        if with_disk:
            usage["disk_bytes"] = disk_used(self.host.workspace)
        hours = elapsed / 3600
        usage["alive_seconds"] = round(usage["alive_seconds"] + elapsed, 3)
        usage["memory_gib_hours"] = round(usage["memory_gib_hours"] + usage["memory_bytes"] / GIB * hours, 9)
        usage["disk_gib_hours"] = round(usage["disk_gib_hours"] + usage["disk_bytes"] / GIB * hours, 9)
        usage["sampled_at"] = statefile.iso(now)
        return usage


def public(usage: dict | None, egress: dict | None) -> dict | None:
    """A sandbox's ``usage`` as GET /v1/sandboxes/{id} shows it: the supervisor's figures and
    the egress bytes the server's proxy counted (0 without an egress policy)."""
    if usage is None:
        return None
    counted = (egress or {}).get("usage") or {}
    return {**usage, "egress_bytes_in": counted.get("bytes_in", 0), "egress_bytes_out": counted.get("bytes_out", 0)}
