"""A state directory's server and what it leaves on the host: find it, stop it, unmount,
purge.

What a server leaves when it stops, and why:
- *kept sandboxes* (claimed ones, a notebook's kept across kernel restarts): they run on
  under their supervisors, which keep their TTL and lifetime deadlines without a server
  (supervisor/deadlines.py); the next server re-adopts them. Stopping never ends them.
- *image mounts* (a root server's read-only loop mounts of each image's packs,
  ``images/NAME/venv.mnt``, isolation/imagefs.py, and of the pinned roots' system packs,
  ``rootfs/VERSION/system.mnt``, isolation/bwrap_root.py): detached lazily when the server stops
  (``MNT_DETACH``). A sandbox still running keeps its own reference to the filesystem in its
  mount namespace, so it is not disturbed; the loop device goes once the last sandbox
  using it ends, and the next sandbox's supervisor mounts the pack again.
- *workspace mounts* of kept sandboxes: theirs, released when they end.

``purge`` removes the whole directory, and so refuses while a server or a sandbox runs
there (``--force`` ends the sandboxes' supervisors first, which ends the sandboxes).

Root may run these commands on a directory a user writes (``--state-dir ~alice/...``), so
nothing in it is believed: ``server.json`` names a pid that is signalled only once the
kernel's records show it is this directory's server (server_identity.py); files are read
and mounts reached without following a link; a directory named through a link is refused.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field

from ..common import nofollow
from ..common.paths import SOCKET_NAME, StateDir, is_supervisor_of
from ..common.processes import pid_alive
from . import server_identity

_MNT_DETACH = 2


class AdminRefused(RuntimeError):
    """An admin command will not act on what it was pointed at; the message says why."""


def _checked_root(state: StateDir) -> str:
    problem = server_identity.root_problem(state.root)
    if problem:
        raise AdminRefused(problem)
    return os.path.abspath(state.root)


_RECORD_MAX_BYTES = 64 * 1024


def _read_json_below(root: str, parts: list[str], name: str) -> dict | None:
    """The JSON object in ``root/parts…/name``, read as a file someone else wrote: never
    through a link, only a regular file (a FIFO would hang root's command), at most 64 KiB
    (a link to /dev/zero would fill its memory); None if it is not such an object."""
    try:
        dir_fd = nofollow.open_dir(os.path.abspath(root), parts)
    except (nofollow.ComponentRefused, OSError):
        return None
    try:
        fd, _ = nofollow.open_regular(dir_fd, name)
    except (nofollow.FileRefused, OSError):
        return None
    finally:
        os.close(dir_fd)
    try:
        raw = os.read(fd, _RECORD_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        record = json.loads(raw) if len(raw) <= _RECORD_MAX_BYTES else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def server_record(state: StateDir) -> dict | None:
    """``server.json``, as its directory's owner wrote it (see `_read_json_below`)."""
    return _read_json_below(state.root, [], os.path.basename(state.server_file))


def claimed_pid(state: StateDir) -> int | None:
    """The live pid ``server.json`` names, verified or not (for messages only)."""
    pid = (server_record(state) or {}).get("pid")
    return pid if isinstance(pid, int) and pid > 0 and pid_alive(pid) else None


def running_server(state: StateDir) -> dict | None:
    """``server.json`` of the server running on this state directory, or None: no file, its
    pid gone, or a process that is not this directory's server (server_identity.py: the
    file is the directory owner's to write, so its pid is only a hint)."""
    if server_identity.root_problem(state.root):
        return None
    pid = claimed_pid(state)
    if pid is None or server_identity.server_problem(pid, state.root, SOCKET_NAME):
        return None
    return server_record(state)


def stop_server(state: StateDir, timeout: float = 60.0) -> dict | None:
    """SIGTERM the state directory's server and wait for it to exit; its record, or None if
    none ran. Raises AdminRefused if ``server.json`` names a process that is not this
    directory's server (or the directory is reached through a link), and TimeoutError if
    the server is still there after ``timeout``."""
    root = _checked_root(state)
    pid = claimed_pid(state)
    if pid is None:
        return None
    try:
        pidfd = os.pidfd_open(pid)  # signalled through this: a pid reused meanwhile is never hit
    except ProcessLookupError:
        return None
    try:
        problem = server_identity.server_problem(pid, root, SOCKET_NAME)
        if problem:
            raise AdminRefused(f"{state.server_file} names pid {pid}, which is not this directory's server "
                               f"({problem}): not signalled")
        record = server_record(state) or {"pid": pid}
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        except ProcessLookupError:
            return None
    finally:
        os.close(pidfd)
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
    sandboxes = os.path.basename(state.sandboxes)
    try:
        fd = nofollow.open_dir(os.path.abspath(state.root), [sandboxes])  # a link there leads nowhere
    except (nofollow.ComponentRefused, OSError):
        return found
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    for sandbox_id in names:
        d = state.sandbox(sandbox_id)
        pid = (_read_json_below(state.root, [sandboxes, sandbox_id], "state.json") or {}).get("supervisor_pid")
        if isinstance(pid, int) and pid_alive(pid) and is_supervisor_of(pid, d):
            found[sandbox_id] = pid
    return found


def mounts_under(root: str) -> list[str]:
    """Mount points at or below ``root`` in this process's mount namespace, deepest first.

    ``root`` is taken as written, never resolved: mountinfo names real paths, so a link
    inside a state directory (``images`` -> a mount elsewhere) matches nothing here."""
    root = os.path.abspath(root)
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


def detach(root: str, point: str) -> bool:
    """Lazily unmount ``point`` (at or below ``root``), reached from ``root`` one component at
    a time without following a link, and unmounted through that very directory's fd
    (``umount2(/proc/self/fd/N, MNT_DETACH)``): a link swapped in after the mount table was
    read leads nowhere. False if it was not detached."""
    parts = [p for p in os.path.relpath(point, root).split("/") if p not in ("", ".")]
    try:
        fd = nofollow.open_dir(root, parts)
    except (nofollow.ComponentRefused, OSError):
        return False
    try:
        return _umount2(f"/proc/self/fd/{fd}") == 0
    finally:
        os.close(fd)


def _umount2(path: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.umount2(os.fsencode(path), _MNT_DETACH)


def unmount_images(state: StateDir) -> list[str]:
    """Detach every image mount of the state directory, the pinned roots' packs
    (``rootfs/VERSION/system.mnt``) with them (lazily: see the module docstring); the mount
    points it detached."""
    root = os.path.realpath(state.root)  # the server's own directory; below it nothing is followed
    return [point for tree in ("images", "rootfs") for point in mounts_under(os.path.join(root, tree))
            if detach(root, point)]


class PurgeRefused(AdminRefused):
    """The state directory is in use, or not one purge acts on; the message says why."""


@dataclass
class Purged:
    """What a purge did: the mounts it detached, whether the directory is gone, and what is
    left of it (a few paths with the reason each could not be removed)."""

    unmounted: list[str]
    removed: bool
    left: list[str] = field(default_factory=list)


def purge(state: StateDir, force: bool = False) -> Purged:
    """Remove the state directory: refused while its server runs, or (without ``force``)
    while sandboxes run, and for a directory named through a link; every mount under it is
    detached first (through the directory itself, never a link), so that nothing of a
    mounted image or workspace is deleted through its mount point. Reports what it did."""
    try:
        root = _checked_root(state)
    except AdminRefused as exc:
        raise PurgeRefused(str(exc)) from None
    if not os.path.lexists(root):
        return Purged([], removed=False)
    server = running_server(state)
    if server is not None:
        raise PurgeRefused(f"a sandbox server (pid {server['pid']}) runs on {root}: "
                           f"stop it first (sandbox-kernel stop --state-dir {root})")
    live = live_sandboxes(state)
    if live and not force:
        raise PurgeRefused(f"{len(live)} sandbox(es) still run on {root} ({', '.join(sorted(live))}): "
                           "delete them (sandbox-kernel rm --all) or pass --force to end them")
    _end(live.values())
    points = [point for point in mounts_under(root) if detach(root, point)]
    left = mounts_under(root)
    if left:
        raise PurgeRefused(f"could not unmount {', '.join(left)}; nothing was removed")
    errors: list[str] = []
    shutil.rmtree(root, onerror=lambda fn, path, exc: errors.append(f"{path}: {exc[1]}"))
    return Purged(points, removed=not os.path.lexists(root), left=errors[:5])


def _end(supervisors) -> None:
    """SIGTERM (the supervisor tears its sandbox down), then SIGKILL what is left."""
    pids = list(supervisors)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
