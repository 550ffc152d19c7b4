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
import time

MKFS = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
# A busy workspace is unmounted again for this long (its last processes going), then lazily.
BUSY_RETRY_SECONDS = 0.5


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
    run([MKFS, "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", *options, image])


def create(image: str, mountpoint: str, size_mb: int, owner: int | None) -> None:
    _mkfs(image, size_mb)
    run(["mount", "-o", "loop,nosuid,nodev", image, mountpoint])
    shutil.rmtree(os.path.join(mountpoint, "lost+found"), ignore_errors=True)
    if owner is not None:
        os.chown(mountpoint, owner, owner)
    os.chmod(mountpoint, 0o700)


def mount(image: str, mountpoint: str, read_only: bool = False) -> None:
    """Mount an existing image again (a paused sandbox's workspace being restored, after a
    reboot too; a packed tree read-only); one already mounted there is reused."""
    if not os.path.ismount(mountpoint):
        os.makedirs(mountpoint, exist_ok=True)
        run(["mount", "-o", "loop,nosuid,nodev" + ",ro" * read_only, image, mountpoint])


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


def unmount(mountpoint: str, settle_seconds: float = 0.0, image: str | None = None) -> bool:
    """Unmount a workspace and keep its image (a paused sandbox's files stay on disk).

    A mount still busy (a process of the sandbox not quite gone) is tried again for
    ``settle_seconds``, then detached lazily: the filesystem then lives on, unwritten, until
    its last user goes. Whoever reads the image next (a restore, a fork's copy) must not
    start before that, so with ``settle_seconds`` and the mount's ``image`` this also waits
    for the loop device to let go of the image. True when the image is free (always,
    without them)."""
    deadline = time.monotonic() + settle_seconds
    retry_until = time.monotonic() + min(settle_seconds, BUSY_RETRY_SECONDS)
    if os.path.ismount(mountpoint):
        while True:
            subprocess.run(["umount", mountpoint], capture_output=True)
            if not os.path.ismount(mountpoint) or time.monotonic() >= retry_until:
                break
            time.sleep(0.05)
        if os.path.ismount(mountpoint):
            subprocess.run(["umount", "-l", mountpoint], capture_output=True)
        if settle_seconds and image:
            return wait_free(image, deadline - time.monotonic())
    return True


def wait_free(image: str, seconds: float) -> bool:
    """Wait until no loop device holds ``image`` (a lazily detached mount writes its last
    data on its way out); True once free, False if still held after ``seconds``."""
    deadline = time.monotonic() + max(0.0, seconds)
    while in_loop(image):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def pinning_namespaces(mountpoint: str) -> list[str]:
    """Processes of other mount namespaces that still have ``mountpoint`` mounted, one named
    per namespace. A mount namespace made while the mount existed (``unshare --mount``, a
    service's private /tmp) keeps a copy of it where the host's mounts are private, and that
    copy holds the image until the namespace ends, whatever the host unmounts."""
    own = os.readlink("/proc/self/ns/mnt")
    found: dict[str, str] = {}
    for pid in (entry for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            namespace = os.readlink(f"/proc/{pid}/ns/mnt")
            if namespace == own or namespace in found:
                continue
            with open(f"/proc/{pid}/mountinfo") as f:
                if not any(line.split()[4] == mountpoint for line in f):
                    continue
            with open(f"/proc/{pid}/comm") as f:
                found[namespace] = f"pid {pid} ({f.read().strip()})"
        except (OSError, IndexError):  # gone meanwhile, or not ours to read
            continue
    return sorted(found.values())


def held_reason(what: str, mountpoint: str) -> str:
    """Why ``what`` (a workspace's image, mounted at ``mountpoint`` in its last run) is not free."""
    pins = pinning_namespaces(mountpoint)
    if pins:
        return (f"{what} is still held by a copy of its mount in another mount namespace, made on the host while "
                f"the sandbox ran ({', '.join(pins[:3])}); it is free once that namespace ends")
    return f"{what} is still held by the sandbox's previous run"


def in_loop(image: str) -> bool:
    """Whether a loop device still holds ``image`` (a lazily detached mount not yet gone)."""
    image = os.path.realpath(image)
    for entry in os.listdir("/sys/block"):
        if entry.startswith("loop"):
            try:
                with open(f"/sys/block/{entry}/loop/backing_file") as f:
                    if f.read().strip().removesuffix(" (deleted)") == image:
                        return True
            except OSError:
                continue
    return False


def destroy(image: str, mountpoint: str | None = None) -> None:
    """Unmount a workspace and delete its image: the file a link names too (a workspace in
    the store of ``workspace_store.py``), then the link."""
    if mountpoint is not None:
        unmount(mountpoint)
    paths = [os.path.realpath(image), image] if os.path.islink(image) else [image]
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{os.path.basename(argv[0])} failed: {r.stderr.strip() or r.returncode}")
