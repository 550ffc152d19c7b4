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
or "not measured" while neither can be read: the figures read from them (PROCESS_FIGURES) are
then null, and every reader shows "not measured", never a 0 it never read (an ordinary
user's `ls` once said 0 s of CPU for a busy sandbox).
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
# Where those figures come from (``measured_by``); the figures below need one of the first two.
CGROUP, PROCESSES, NOT_MEASURED = "cgroup", "processes", "not measured"
MEASURED = (CGROUP, PROCESSES)
# The figures read from a cgroup or the process tree: null while neither could be read.
PROCESS_FIGURES = ("cpu_seconds", "memory_bytes", "memory_peak_bytes", "processes", "memory_gib_hours")


def is_measured(usage: dict | None) -> bool:
    """Whether a ``usage`` object's CPU, memory and process figures were read from somewhere."""
    return (usage or {}).get("measured_by") in MEASURED


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
        self.usage = {name: usage.get(name, None if name in PROCESS_FIGURES else 0) for name in FIELDS}
        self.usage["measured_by"] = usage.get("measured_by", NOT_MEASURED)
        self.usage["sampled_at"] = usage.get("sampled_at")
        record["usage"] = self.usage
        # What earlier cgroups of this sandbox counted (a restore starts a new one).
        self.cpu_base = float(self.usage["cpu_seconds"] or 0) if restoring else 0.0
        self.last = time.time()
        if restoring and record.get("paused_at"):
            self.usage["paused_seconds"] += max(0.0, self.last - statefile.epoch(record["paused_at"]))

    def source(self) -> tuple[t.Any, str]:
        """What the figures are read from now: the cgroup, else the process tree, else None."""
        if self.host.cgroup is not None:
            return self.host.cgroup, CGROUP
        pid = self.root_pid()
        if pid:
            processes = ProcessTreeUsage(pid)
            if processes.refresh():
                return processes, PROCESSES
        return None, NOT_MEASURED

    def start_billing(self) -> None:
        """A claimed warm sandbox: what it used while it waited in the pool is not its owner's."""
        counters, _ = self.source()
        self.cpu_base = -(counters.cpu_seconds() if counters is not None else 0.0)
        for name in ("executes", "commands", "alive_seconds", "disk_gib_hours"):
            self.usage[name] = 0
        for name in ("memory_gib_hours", "memory_peak_bytes"):
            self.usage[name] = 0 if counters is not None else None
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
        if counters is not None:  # else what measured it last stays (an ended sandbox's), or "not measured"
            usage["measured_by"] = source
            cpu = round(self.cpu_base + counters.cpu_seconds(), 6)
            # a process tree's sum can step back (a parent gone with children uncounted)
            usage["cpu_seconds"] = cpu if source == CGROUP else max(float(usage["cpu_seconds"] or 0), cpu)
            usage["memory_bytes"] = counters.memory_working_set()
            peak = counters.memory_peak() if source == CGROUP else usage["memory_bytes"]
            usage["memory_peak_bytes"] = max(int(usage["memory_peak_bytes"] or 0), peak)
            usage["processes"] = counters.processes()
        if with_disk:
            usage["disk_bytes"] = disk_used(self.host.workspace)
        hours = elapsed / 3600
        usage["alive_seconds"] = round(usage["alive_seconds"] + elapsed, 3)
        if usage["memory_bytes"] is not None:
            usage["memory_gib_hours"] = round((usage["memory_gib_hours"] or 0) + usage["memory_bytes"] / GIB * hours, 9)
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
