"""Where gVisor sandboxes keep their workspace images: on a filesystem that shares blocks
between copies, so that a fork's workspace costs neither the time nor the disk of a copy.

A workspace is a sparse ext4 image (``disk.py``); a fork must get a workspace of its own
that starts as its source's. On a filesystem with reflinks (XFS, btrfs) ``cp
--reflink=always`` makes that copy in milliseconds, whatever the size, and the two share
every block until one of them writes it. The host's own filesystem here is ext4, which has
none: a 300 MB workspace took 0.47 s to copy and twice its disk. So a root server keeps
the workspace images of its gVisor sandboxes in one *store* per state directory: a sparse
file holding an XFS filesystem made with ``reflink=1``, loop-mounted (``discard``, so that
blocks freed inside it are given back to the host's file) at ``workspace-store/`` beside it.
Each sandbox's ``workspace.img`` is then a symbolic link to ``workspace-store/ID.img``; every
other user of the path (mount, the disk admission's ``st_blocks``) follows the link, and
``disk.destroy`` removes both.

The store is made on first use and kept mounted (like the images' packs, ``imagefs.py``); a
restarted server reuses it, and after a reboot the first restore mounts it again
(``ensure``). Where the state directory's own filesystem has reflinks, no store is needed
and none is made; without root, ``mkfs.xfs`` or the kernel's XFS, forks copy as before.
Only the gVisor tier forks, so only its sandboxes live in the store.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile

from . import disk

STORE = "workspace-store"
MKFS_XFS = shutil.which("mkfs.xfs") or "/usr/sbin/mkfs.xfs"
# XFS wants at least 300 MiB; the file is sparse, so its size is only a ceiling.
MIN_BYTES = 1 << 30


def available() -> tuple[bool, str]:
    """Whether this process can make and mount a store, and why not."""
    ok, why = disk.available()
    if not ok:
        return False, why
    if not os.path.exists(MKFS_XFS):
        return False, "mkfs.xfs not found (apt-get install xfsprogs)"
    try:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1] == "xfs" for line in f if line.strip()):
                return False, "this kernel has no XFS"
    except OSError:
        return False, "cannot read /proc/filesystems"
    return True, f"an XFS store with reflinks ({STORE}/), so a fork shares its source's blocks"


def shares_blocks(directory: str) -> bool:
    """Whether ``directory``'s filesystem makes reflinks (then workspaces stay where they are)."""
    try:
        with tempfile.TemporaryDirectory(dir=directory, prefix=".reflink-") as tmp:
            source = os.path.join(tmp, "a")
            with open(source, "wb") as f:
                f.write(b"x" * 4096)
            r = subprocess.run(["cp", "--reflink=always", source, os.path.join(tmp, "b")], capture_output=True)
            return r.returncode == 0
    except OSError:
        return False


def mount_point(state_root: str) -> str:
    return os.path.join(state_root, STORE)


def image_of(state_root: str, sandbox_id: str) -> str:
    return os.path.join(mount_point(state_root), sandbox_id + ".img")


def ensure(state_root: str) -> str:
    """The store's mount point, mounted now (made first, if it is not there), one process
    at a time: the server, and a supervisor restoring after a reboot."""
    point = mount_point(state_root)
    if os.path.ismount(point):
        return point
    backing = point + ".xfs"
    with open(point + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.ismount(point):
            return point
        if not os.path.exists(backing):
            tmp = backing + ".tmp"
            with open(tmp, "wb") as f:
                f.truncate(max(MIN_BYTES, _host_bytes(state_root)))
            os.chmod(tmp, 0o600)
            # the smallest log XFS takes (64 MiB, written at once): the default grows with the size
            disk.run([MKFS_XFS, "-q", "-f", "-m", "reflink=1", "-l", "size=64m", tmp])
            os.rename(tmp, backing)
        os.makedirs(point, mode=0o700, exist_ok=True)
        disk.run(["mount", "-o", "loop,discard,nosuid,nodev,noexec", backing, point])
        os.chmod(point, 0o700)
    return point


def place(state_root: str, sandbox_id: str, link: str) -> str:
    """Put a sandbox's workspace image in the store: ``link`` (its ``workspace.img``) names
    the store's file, which is returned (not created: ``disk.create`` makes it)."""
    ensure(state_root)
    target = image_of(state_root, sandbox_id)
    os.symlink(target, link)
    return target


def clone(source_link: str, state_root: str, fork_id: str, fork_link: str) -> None:
    """A fork's workspace image: the source's, sharing its blocks (a reflink), in the store."""
    target = place(state_root, fork_id, fork_link)
    try:
        disk.run(["cp", "--reflink=always", "--preserve=mode,ownership", os.path.realpath(source_link), target])
    except RuntimeError:
        disk.destroy(fork_link)
        raise


def in_store(link: str) -> bool:
    return os.path.islink(link)


def _host_bytes(state_root: str) -> int:
    st = os.statvfs(state_root)
    return st.f_blocks * st.f_frsize

