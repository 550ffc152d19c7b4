"""A state directory's server and what it leaves on the host: find it, stop it, unmount,
purge.

What a server leaves when it stops, and why:
- *kept sandboxes* (claimed ones, a notebook's kept across kernel restarts): they run on
  under their supervisors, which keep their TTL and lifetime deadlines without a server
  (supervisor/deadlines.py); the next server re-adopts them. Stopping never ends them.
- *image mounts* (a root server's read-only loop mounts of each image's packs,
  ``images/NAME/venv.mnt``, isolation/imagefs.py): detached lazily when the server stops
  (``umount -l``). A sandbox still running keeps its own reference to the filesystem in its
  mount namespace, so it is not disturbed; the loop device goes once the last sandbox
  using it ends, and the next sandbox's supervisor mounts the pack again.
- *workspace mounts* of kept sandboxes: theirs, released when they end.

``purge`` removes the whole directory, and so refuses while a server or a sandbox runs
there (``--force`` ends the sandboxes' supervisors first, which ends the sandboxes).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

from ..common import statefile
from ..common.paths import StateDir, is_supervisor_of
from ..common.processes import pid_alive


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def running_server(state: StateDir) -> dict | None:
    """``server.json`` of the server running on this state directory, or None (no file, or
    its pid is gone or is no longer a sandbox server)."""
    record = statefile.read_json(state.server_file) or {}
    pid = record.get("pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return None
    cmd = _cmdline(pid)
    if b"serve" not in cmd or not any(b"sandbox" in part for part in cmd):
        return None
    return record


def stop_server(state: StateDir, timeout: float = 60.0) -> dict | None:
    """SIGTERM the state directory's server and wait for it to exit; its record, or None if
    none ran. Raises TimeoutError if it is still there after ``timeout``."""
    record = running_server(state)
    if record is None:
        return None
    pid = record["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the sandbox server (pid {pid}) did not stop within {timeout:.0f} s; "
                               f"`kill -9 {pid}` ends it (its sandboxes run on)")
        time.sleep(0.1)
    return record


def live_sandboxes(state: StateDir) -> dict[str, int]:
    """Sandbox id -> supervisor pid, for each sandbox whose supervisor still runs."""
    found = {}
    try:
        names = os.listdir(state.sandboxes)
    except FileNotFoundError:
        return found
    for sandbox_id in names:
        d = state.sandbox(sandbox_id)
        pid = (statefile.read_json(os.path.join(d, "state.json")) or {}).get("supervisor_pid")
        if isinstance(pid, int) and pid_alive(pid) and is_supervisor_of(pid, d):
            found[sandbox_id] = pid
    return found


def mounts_under(root: str) -> list[str]:
    """Mount points at or below ``root`` in this process's mount namespace, deepest first."""
    root = os.path.realpath(root)
    points = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4].replace("\\040", " ")
                if point == root or point.startswith(root + "/"):
                    points.append(point)
    except OSError:
        return []
    return sorted(set(points), key=len, reverse=True)


def unmount_images(state: StateDir) -> list[str]:
    """Detach every image mount of the state directory (lazily: see the module docstring);
    the mount points it detached."""
    points = mounts_under(state.images)
    for point in points:
        subprocess.run(["umount", "-l", point], capture_output=True)
    return points


class PurgeRefused(RuntimeError):
    """The state directory is in use; the message says by what and what to do."""


def purge(state: StateDir, force: bool = False) -> list[str]:
    """Remove the state directory: refused while its server runs, or (without ``force``)
    while sandboxes run; every mount under it is detached first, so that nothing of a
    mounted image or workspace is deleted through its mount point. Returns what it
    unmounted."""
    server = running_server(state)
    if server is not None:
        raise PurgeRefused(f"a sandbox server (pid {server['pid']}) runs on {state.root}: "
                           f"stop it first (sandbox-kernel stop --state-dir {state.root})")
    live = live_sandboxes(state)
    if live and not force:
        raise PurgeRefused(f"{len(live)} sandbox(es) still run on {state.root} ({', '.join(sorted(live))}): "
                           "delete them (sandbox-kernel rm --all) or pass --force to end them")
    for signum in (signal.SIGTERM, signal.SIGKILL):  # SIGTERM: the supervisor tears its sandbox down
        for pid in live.values():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in live.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
    points = mounts_under(state.root)
    for point in points:
        subprocess.run(["umount", "-l", point], capture_output=True)
    left = mounts_under(state.root)
    if left:
        raise PurgeRefused(f"could not unmount {', '.join(left)}; nothing was removed")
    shutil.rmtree(state.root, ignore_errors=True)
    return points
