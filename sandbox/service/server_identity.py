"""Whether a process is the server of a state directory, judged from the kernel's records only.

Admin commands (`stop`, `purge`, `lab`) find a server through ``STATE/server.json``, a file
in a directory its owner controls. Root running ``sandbox-kernel stop --state-dir
~alice/...`` must not signal whatever pid Alice wrote there (the system-wide server, say), nor
follow a link Alice planted. So nothing in the directory is believed; a pid is this
directory's server only when the kernel says so:

- the state directory is named by its own path: not a symlink, no symlink above it
  (``realpath`` is the path itself), a directory;
- the process runs as the directory's owner (``/proc/PID/status``, against ``lstat``);
- its command line is a sandbox server's (``serve``);
- it *listens* on a unix socket bound at exactly ``STATE/server.sock``
  (``/proc/PID/fd`` names its socket inodes, ``/proc/PID/net/unix`` their bound paths and
  the listening flag): a server binds its own state directory's socket and no other, and
  nobody but the process itself can make its socket's bound path name a directory.

`stop_server` opens a pidfd before checking and signals through it, so that a pid reused
after the check is never signalled.
"""

from __future__ import annotations

import os
import stat

_ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags: a listening socket


def root_problem(root: str) -> str | None:
    """Why an admin command will not act on the state directory `root` (None: it may). A
    missing directory is not a problem here: callers say there is nothing there."""
    path = os.path.abspath(root)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return (f"{path} is a symlink (to {os.readlink(path)}): admin commands act only on a directory "
                "named by its own path, never through a link")
    real = os.path.realpath(path)
    if real != path:
        return (f"{path} is reached through a symlink (it resolves to {real}): admin commands never follow "
                f"links; if {real} is the directory you mean, name it")
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    return None


def _owner_uid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    real, effective = line.split()[1:3]
                    return int(effective) if real == effective else None
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def is_server_command(pid: int) -> bool:
    """Whether `pid`'s command line is a sandbox server's (`sandbox-kernel serve`,
    `python -m sandbox serve`)."""
    cmd = _cmdline(pid)
    return b"serve" in cmd and any(b"sandbox" in part for part in cmd)


def listening_paths(pid: int) -> set[str]:
    """The paths of the unix sockets `pid` listens on (empty if its fds cannot be read)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:
        return set()
    paths = set()
    try:
        with open(f"/proc/{pid}/net/unix") as f:
            next(f, None)
            for line in f:
                fields = line.split(None, 7)
                if len(fields) == 8 and fields[6] in inodes and int(fields[3], 16) & _ACCEPTING:
                    paths.add(fields[7].rstrip("\n"))
    except (OSError, ValueError):
        return set()
    return paths


def server_problem(pid: int, root: str, socket_name: str) -> str | None:
    """Why `pid` is not the server of the state directory `root` (None: it is). `root` has
    passed `root_problem`."""
    path = os.path.abspath(root)
    want_uid = os.lstat(path).st_uid
    uid = _owner_uid(pid)
    if uid != want_uid:
        return f"process {pid} runs as uid {uid}, the directory belongs to uid {want_uid}"
    if not is_server_command(pid):
        return f"process {pid} is not a sandbox server (its command line says otherwise)"
    socket_path = os.path.join(path, socket_name)
    bound = {p for p in listening_paths(pid)
             if os.path.basename(p) == socket_name and os.path.realpath(os.path.dirname(p)) == path}
    if not bound:
        return f"process {pid} does not listen on {socket_path}"
    return None
