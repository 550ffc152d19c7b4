"""A sandbox's CPU time, memory and processes read from /proc, where it has no cgroup.

An ordinary user's server has no cgroup to write (no delegation): without this, its
sandboxes' usage read 0 everywhere (`ls`, `%sandbox`, `usage`, MCP), and the notebook's
80 % memory warning never fired. The supervisor started the sandbox's process (bwrap), so
the sandbox is that process and its descendants, all readable by the supervisor's user.

- CPU: each live process's own time plus what its reaped children used (`utime + stime +
  cutime + cstime` of /proc/PID/stat): a process that ended is counted in its parent's
  children's time, once. Kept monotonic by the meter (a parent ending with uncounted
  children could step it back).
- Memory: the proportional set size of each process (/proc/PID/smaps_rollup: shared pages
  split between their users, so the image's libraries are not counted once per process),
  falling back to the resident size where it cannot be read.
- Processes: the tasks (threads count, as a pids cgroup counts them).
"""

from __future__ import annotations

import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state is [0], ppid [1])."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return data.rsplit(")", 1)[1].split()


def tree(root: int) -> list[int]:
    """`root` and its live descendants (pids), found from every process's parent."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _memory(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


class ProcessTreeUsage:
    """The figures a cgroup would give (`cpu_seconds`, `memory_working_set`, `processes`),
    read from the sandbox's process tree; `alive` says whether there is one to read."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.pids: list[int] = []

    def refresh(self) -> bool:
        fields = _stat_fields(self.root_pid)
        self.pids = tree(self.root_pid) if fields is not None and fields[0] != "Z" else []
        return bool(self.pids)

    def cpu_seconds(self) -> float:
        ticks = 0
        for pid in self.pids:
            fields = _stat_fields(pid)
            if fields is not None:  # utime, stime, cutime, cstime: fields 14-17 of stat
                ticks += sum(int(v) for v in fields[11:15])
        return ticks / CLOCK_TICKS

    def memory_working_set(self) -> int:
        return sum(_memory(pid) for pid in self.pids)

    def processes(self) -> int:
        count = 0
        for pid in self.pids:
            fields = _stat_fields(pid)
            if fields is not None:
                count += int(fields[17])  # num_threads: field 20
        return count
