"""A size-capped /workspace: a sparse ext4 image, loop-mounted on the host per sandbox
(and the same tooling packs an image's trees into read-only ext4 images, see ``pack``).

A bind-mounted host directory has no size of its own, so a sandbox could fill the host's
disk. A loop-mounted filesystem gives the sandbox ENOSPC at its cap while the host only
pays for blocks actually written (the image is sparse), and it stays reachable from the
host for the airlock and across server restarts. Needs root and mkfs.ext4; elsewhere the
workspace is a plain directory and ``doctor`` says the cap is not enforced.
"""

from __future__ import annotations

import os
import shutil
import subprocess

MKFS = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"


def available() -> tuple[bool, str]:
    if os.geteuid() != 0:
        return False, "needs root to loop-mount a filesystem per sandbox"
    if not os.path.exists(MKFS):
        return False, "mkfs.ext4 not found (apt-get install e2fsprogs)"
    if not os.path.exists("/dev/loop-control"):
        return False, "no loop device support (/dev/loop-control missing)"
    return True, "sparse ext4 image per sandbox, loop-mounted nosuid,nodev"


def _mkfs(image: str, size_mb: int, *options: str) -> None:
    """A sparse ext4 image of ``size_mb``: the host pays only for the blocks written."""
    with open(image, "wb") as f:
        f.truncate(int(size_mb) * 1024 * 1024)
    os.chmod(image, 0o600)
    _run([MKFS, "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", *options, image])


def create(image: str, mountpoint: str, size_mb: int, owner: int | None) -> None:
    _mkfs(image, size_mb)
    _run(["mount", "-o", "loop,nosuid,nodev", image, mountpoint])
    shutil.rmtree(os.path.join(mountpoint, "lost+found"), ignore_errors=True)
    if owner is not None:
        os.chown(mountpoint, owner, owner)
    os.chmod(mountpoint, 0o700)


def mount(image: str, mountpoint: str, read_only: bool = False) -> None:
    """Mount an existing image again (a paused sandbox's workspace being restored, after a
    reboot too; a packed tree read-only); one already mounted there is reused."""
    if not os.path.ismount(mountpoint):
        os.makedirs(mountpoint, exist_ok=True)
        _run(["mount", "-o", "loop,nosuid,nodev" + ",ro" * read_only, image, mountpoint])


def pack(tree: str, image: str) -> None:
    """An ext4 image holding a copy of ``tree`` (owners, modes and links kept), made without
    root (``mke2fs -d``): a read-only filesystem of its own, so that a mount of it names no
    host directory. No journal (it is never written); sized from the tree, with room for
    each file's last block and inode."""
    files, size = 0, 0
    for root, dirs, names in os.walk(tree):
        for name in names + dirs:
            files += 1
            try:
                size += -(-os.lstat(os.path.join(root, name)).st_size // 4096) * 4096
            except OSError:
                pass
    size_mb = (size + files * 512) * 11 // 10 // (1024 * 1024) + 16
    _mkfs(image, size_mb, "-O", "^has_journal", "-b", "4096", "-N", str(files + 1024), "-d", tree)


def unmount(mountpoint: str) -> None:
    """Unmount a workspace and keep its image (a paused sandbox's files stay on disk)."""
    if os.path.ismount(mountpoint):
        subprocess.run(["umount", mountpoint], capture_output=True)
        if os.path.ismount(mountpoint):
            subprocess.run(["umount", "-l", mountpoint], capture_output=True)


def destroy(image: str, mountpoint: str) -> None:
    unmount(mountpoint)
    try:
        os.unlink(image)
    except FileNotFoundError:
        pass


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{os.path.basename(argv[0])} failed: {r.stderr.strip() or r.returncode}")
