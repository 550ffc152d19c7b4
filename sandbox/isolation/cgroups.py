"""Memory, pids and CPU limits through cgroups, v1 or v2, whichever this host has in force.

Detection looks at where *this* process lives (``/proc/self/cgroup``) and creates each
sandbox's group below it, so the limits nest inside whatever the operator gave the server
(on hosts that already put the server in a limited memory group, a sandbox can never take
more than the server's share). On v1 each controller is its own hierarchy; on v2 one
directory holds every controller, and only controllers delegated to us can be used.
Where no group can be written (not root, no delegation) the caller falls back to rlimits.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field

ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "pids", "cpu")
# v1 only: CPU time is counted by cpuacct (often its own hierarchy, or co-mounted as
# "cpu,cpuacct"); it limits nothing, so it is joined for the usage figures alone. On v2
# every group's cpu.stat counts CPU time, whichever controllers are delegated.
V1_ACCOUNTING = ("cpuacct",)
GROUP_PREFIX = "sandbox-kernel"


@dataclass
class CgroupSupport:
    version: str | None  # "v1", "v2" or None
    parents: dict[str, str] = field(default_factory=dict)  # controller -> parent directory
    reason: str = ""

    @property
    def controllers(self) -> list[str]:
        return sorted(self.parents)


def _own_paths() -> tuple[dict[str, str], str | None]:
    v1, v2 = {}, None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                hid, ctrls, path = line.rstrip("\n").split(":", 2)
                if hid == "0" and ctrls == "":
                    v2 = path
                for c in ctrls.split(","):
                    if c:
                        v1[c] = path
    except OSError:
        pass
    return v1, v2


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


def detect() -> CgroupSupport:
    v1, v2 = _own_paths()
    parents = {}
    for ctrl in CONTROLLERS + V1_ACCOUNTING:
        if ctrl in v1:
            base = os.path.join(ROOT, ctrl)
            if not os.path.ismount(base) and ctrl in ("cpu", "cpuacct"):
                base = os.path.join(ROOT, "cpu,cpuacct")
            parent = os.path.join(base, v1[ctrl].lstrip("/"))
            if _writable_dir(parent):
                parents[ctrl] = parent
    if set(parents) - set(V1_ACCOUNTING):
        return CgroupSupport("v1", parents, "cgroup v1 hierarchies: " + ", ".join(sorted(parents)))
    if v2 is not None:
        unified = ROOT if os.path.exists(os.path.join(ROOT, "cgroup.controllers")) else os.path.join(ROOT, "unified")
        own = os.path.join(unified, v2.lstrip("/"))
        try:
            with open(os.path.join(own, "cgroup.controllers")) as f:
                available = f.read().split()
        except OSError:
            available = []
        usable = [c for c in CONTROLLERS if c in available]
        if usable and _writable_dir(own):
            return CgroupSupport("v2", {c: own for c in usable}, "cgroup v2 controllers: " + ", ".join(usable))
        return CgroupSupport(None, {}, f"cgroup v2 at {own} has no delegated controllers (has: {' '.join(available) or 'none'})")
    return CgroupSupport(None, {}, "no writable cgroup hierarchy for this process")


def parse_number(text: str) -> int:
    """A single-number cgroup file (``memory.current``, ``pids.current``...); 0 for "max",
    empty (the group is gone) or anything else that is not a count."""
    text = text.strip()
    return int(text) if text.isdigit() else 0


def parse_keyed(text: str) -> dict[str, int]:
    """A flat-keyed cgroup file, one ``key value`` a line (``cpu.stat``, ``memory.stat``,
    ``memory.events``, v1's ``memory.oom_control``)."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[key] = int(value)
    return found


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class SandboxCgroup:
    """One sandbox's group(s). Created by its supervisor; the bwrap child joins it before exec."""

    def __init__(self, support: CgroupSupport, name: str):
        self.support = support
        self.name = name
        self.dirs: dict[str, str] = {}
        self._kept: dict[str, int] = {}  # counter file -> descriptor (see _counter)
        if support.version == "v1":
            for ctrl, parent in support.parents.items():
                self.dirs[ctrl] = os.path.join(parent, GROUP_PREFIX, name)
        elif support.version == "v2":
            parent = next(iter(support.parents.values()))
            self.dirs = {c: os.path.join(parent, GROUP_PREFIX, name) for c in support.parents}

    @classmethod
    def from_dirs(cls, dirs: list[str]) -> "SandboxCgroup":
        """The groups a dead supervisor recorded, to empty and remove (only under ROOT)."""
        group = cls(CgroupSupport(None, {}, "recorded"), "")
        group.dirs = {str(i): d for i, d in enumerate(dirs) if d.startswith(ROOT + "/")}
        return group

    @property
    def version(self) -> str | None:
        return self.support.version

    def create(self, memory_mb: int | None, pids: int | None, cpus: float | None) -> dict[str, str]:
        """Make the group(s) and set the limits; return what is enforced and how."""
        enforced = {}
        if self.version == "v2":
            parent = os.path.dirname(next(iter(self.dirs.values())))
            os.makedirs(parent, exist_ok=True)
            # Controllers must be enabled from the top of our subtree down to the leaf.
            for d in (os.path.dirname(parent), parent):
                try:
                    _write(os.path.join(d, "cgroup.subtree_control"),
                           " ".join("+" + c for c in self.support.parents))
                except OSError:
                    pass
        for d in set(self.dirs.values()):
            os.makedirs(d, exist_ok=True)
        self.set_limits(memory_mb, pids, cpus, enforced)
        return enforced

    def set_limits(self, memory_mb, pids, cpus, enforced: dict | None = None) -> dict[str, str]:
        enforced = {} if enforced is None else enforced
        v1 = self.version == "v1"
        if "memory" in self.dirs and memory_mb:
            d = self.dirs["memory"]
            limit = str(int(memory_mb) * 1024 * 1024)
            if v1:
                _write(os.path.join(d, "memory.limit_in_bytes"), limit)
                memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
                if os.path.exists(memsw):
                    try:
                        _write(memsw, limit)
                    except OSError:
                        pass
            else:
                _write(os.path.join(d, "memory.max"), limit)
                try:
                    _write(os.path.join(d, "memory.swap.max"), "0")
                except OSError:
                    pass
            enforced["memory"] = f"cgroup {self.version}"
        if "pids" in self.dirs and pids:
            _write(os.path.join(self.dirs["pids"], "pids.max"), str(int(pids)))
            enforced["pids"] = f"cgroup {self.version}"
        if "cpu" in self.dirs and cpus:
            d = self.dirs["cpu"]
            period = 100000
            quota = max(1000, int(float(cpus) * period))
            if v1:
                _write(os.path.join(d, "cpu.cfs_period_us"), str(period))
                _write(os.path.join(d, "cpu.cfs_quota_us"), str(quota))
            else:
                _write(os.path.join(d, "cpu.max"), f"{quota} {period}")
            enforced["cpu"] = f"cgroup {self.version}"
        return enforced

    def lift_cpu(self) -> bool:
        """No CPU quota until ``set_limits`` puts it back: for runsc's checkpoint and restore,
        gVisor's own work while the sandbox's code cannot run (the Sentry stops the tasks
        before it compresses a checkpoint, and decompresses a restore before they run
        again), on all the host's cores. Under the sandbox's 1-CPU quota that work took
        1.5-1.8x a bare runsc's time on a quiet host, as much as a bare container's under
        the same quota (bench/README.md, sleep at its floor)."""
        d = self.dirs.get("cpu")
        if not d:
            return False
        if self.version == "v1":
            _write(os.path.join(d, "cpu.cfs_quota_us"), "-1")
        else:
            _write(os.path.join(d, "cpu.max"), "max")
        return True

    def _counter(self, path: str) -> str:
        """A counter file's text, through a descriptor kept open: a read at offset 0 reads
        it afresh, and the open and close it saves were most of the cost of the usage
        figures every cell's ``done`` carries."""
        fd = self._kept.get(path)
        if fd is None:
            try:
                fd = self._kept[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return ""
        try:
            return os.pread(fd, 65536, 0).decode()
        except OSError:  # the group went away
            os.close(self._kept.pop(path))
            return ""

    def close_counters(self) -> None:
        while self._kept:
            os.close(self._kept.popitem()[1])

    def join(self, pid: int = 0) -> None:
        """Move ``pid`` (default: the caller, used between fork and exec) into every group."""
        pid = pid or os.getpid()
        for d in set(self.dirs.values()):
            _write(os.path.join(d, "cgroup.procs"), str(pid))

    def pids(self) -> set[int]:
        found = set()
        for d in set(self.dirs.values()):
            for line in _read(os.path.join(d, "cgroup.procs")).split():
                found.add(int(line))
        return found

    def oom_kills(self) -> int:
        d = self.dirs.get("memory")
        if not d:
            return 0
        text = _read(os.path.join(d, "memory.oom_control" if self.version == "v1" else "memory.events"))
        return parse_keyed(text).get("oom_kill", 0)

    def pids_limit_hits(self) -> int:
        d = self.dirs.get("pids")
        if not d:
            return 0
        return parse_keyed(_read(os.path.join(d, "pids.events"))).get("max", 0)

    def memory_peak(self) -> int:
        d = self.dirs.get("memory")
        if not d:
            return 0
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        return parse_number(self._counter(os.path.join(d, name)))

    def memory_usage(self) -> int:
        d = self.dirs.get("memory")
        if not d:
            return 0
        name = "memory.usage_in_bytes" if self.version == "v1" else "memory.current"
        return parse_number(self._counter(os.path.join(d, name)))

    def memory_working_set(self) -> int:
        """Memory in use less the page cache the kernel would drop first (inactive files),
        as ``docker stats`` and the kubelet count it: a sandbox that wrote a large file is
        not near its limit for that. The limit itself is enforced on ``memory_usage``."""
        d = self.dirs.get("memory")
        if not d:
            return 0
        stat = parse_keyed(self._counter(os.path.join(d, "memory.stat")))
        inactive = stat.get("total_inactive_file" if self.version == "v1" else "inactive_file", 0)
        usage = self.memory_usage()
        return max(0, usage - inactive) if inactive <= usage else usage

    def cpu_seconds(self) -> float:
        """CPU time used by every process in the group (user + system), in seconds."""
        if self.version == "v1":
            d = self.dirs.get("cpuacct")
            return parse_number(self._counter(os.path.join(d, "cpuacct.usage"))) / 1e9 if d else 0.0
        d = next(iter(self.dirs.values()), None)
        if not d:
            return 0.0
        return parse_keyed(self._counter(os.path.join(d, "cpu.stat"))).get("usage_usec", 0) / 1e6

    def processes(self) -> int:
        """Tasks in the group now (threads count on both versions, as the pids limit does)."""
        d = self.dirs.get("pids")
        if d:
            return parse_number(self._counter(os.path.join(d, "pids.current")))
        return len(self.pids())

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty; True when it is."""
        if self.version == "v2":
            d = next(iter(self.dirs.values()))
            try:
                _write(os.path.join(d, "cgroup.kill"), "1")
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def remove(self) -> None:
        self.close_counters()
        for d in set(self.dirs.values()):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.02)
