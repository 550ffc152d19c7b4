"""An image's trees as filesystems of their own, so that a sandbox's mount table names no
host directory.

A bind mount of a directory shows, in the sandbox's ``/proc/self/mountinfo``, that
directory's path inside its filesystem: the state directory's layout. So each tree of an
image (its venv, the interpreter copy) is also packed into a read-only ext4 image when it is
built (``disk.pack``, no root needed). A root server's supervisor loop-mounts each pack
read-only on the host, once, next to it (``venv.ext4`` at ``venv.mnt``), and binds that
mount's root into the sandbox, which mountinfo shows as ``/``. The mount outlives the server
(a restarted one reuses it, a reboot mounts it again) and goes with its image
(``unmount``). Without root there are no loop mounts: the trees themselves are bound, at the
same neutral sandbox paths, and mountinfo names them.
"""

from __future__ import annotations

import fcntl
import os

from . import disk


def mount_point(pack: str) -> str:
    return os.path.splitext(pack)[0] + ".mnt"


def loop_mounts() -> bool:
    return disk.available()[0]


def sources(image: dict) -> list[tuple[str, str]]:
    """(host directory, sandbox directory) of each of the image's trees: its pack's mount
    where this process can loop-mount, else the tree."""
    loop = loop_mounts()
    return [(ensure_mounted(m["pack"]) if loop and m.get("pack") else m["tree"], m["path"])
            for m in image["mounts"]]


def ensure_mounted(pack: str) -> str:
    """The pack's read-only mount (made now, one at a time, if it is not there)."""
    point = mount_point(pack)
    if os.path.ismount(point):
        return point
    with open(pack + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        disk.mount(pack, point, read_only=True)
    return point


def unmount(packs: list[str]) -> None:
    for pack in packs:
        disk.unmount(mount_point(pack))
