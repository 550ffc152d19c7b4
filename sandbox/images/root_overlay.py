"""A layered image's root made from its base image's root without touching it: the build's
tools (apt, uv, npm) run on an overlay whose lower layer is the base's root, read-only, so
every file they write lands in the overlay's upper directory; the layered root is then the
base's root hard-linked (sharing its files' disk blocks, never re-debootstrapped) with that
upper directory laid over it.

Why an overlay rather than running the tools on the hard-linked copy itself: a hard link
is the same inode, so a tool that rewrote a file in place (a maintainer script's ``>>``)
would change the base image too, and an image is immutable (gVisor checkpoints taken on it
map its very files). On the overlay a write to a base file copies it up first.

The upper directory's format is the kernel's (Documentation/filesystems/overlayfs.rst): a
deleted file is a whiteout (a character device 0/0), a directory replaced as a whole is
"opaque" (the ``trusted.overlay.opaque`` xattr). The mount turns off what would put other
meanings into it (``redirect_dir``, ``metacopy``, ``index``).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from contextlib import contextmanager
from typing import Iterator

from .build_steps import ImageError

OPAQUE = "trusted.overlay.opaque"
OPTIONS = "redirect_dir=off,metacopy=off,index=off,xino=off"


@contextmanager
def overlay(lower: str, work_dir: str) -> Iterator[tuple[str, str]]:
    """``lower`` (read-only) under a writable overlay in ``work_dir``: yields the merged
    tree the tools run in and the upper directory that collects what they write."""
    upper, work, merged = (os.path.join(work_dir, d) for d in ("upper", "work", "merged"))
    for d in (upper, work, merged):
        os.makedirs(d)
    os.chmod(upper, os.stat(lower).st_mode & 0o7777)
    mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                              f"lowerdir={lower},upperdir={upper},workdir={work},{OPTIONS}", merged],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        raise ImageError(f"cannot lay an overlay over the base image's root: {mounted.stderr.strip()} "
                         "(a layered image on a root of its own needs overlayfs and root)")
    try:
        yield merged, upper
    finally:
        if subprocess.run(["umount", merged], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", merged], capture_output=True)


def link_tree(source: str, dest: str) -> None:
    """``dest`` as a copy of ``source`` whose files are hard links (directories and symbolic
    links are new, with the same modes and owners)."""
    done = subprocess.run(["cp", "-a", "--link", "--no-target-directory", source, dest],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageError(f"cannot share the base image's root: {done.stderr.strip()[:500]}")


def lay_over(upper: str, root: str) -> int:
    """Apply an overlay's upper directory to ``root`` (the base's hard-linked copy): its
    whiteouts delete, its opaque directories replace, its other entries are moved in (a
    rename: the base's inodes are never written). The number of entries applied."""
    applied = 0
    for name in sorted(os.listdir(upper)):
        source, target = os.path.join(upper, name), os.path.join(root, name)
        info = os.lstat(source)
        applied += 1
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:  # a whiteout: deleted in the layer
            _remove(target)
        elif stat.S_ISDIR(info.st_mode) and not _opaque(source) and os.path.isdir(target) \
                and not os.path.islink(target):
            os.chown(target, info.st_uid, info.st_gid)
            os.chmod(target, stat.S_IMODE(info.st_mode))
            applied += lay_over(source, target)
        else:  # a file, a link, a new or opaque directory: the layer's, whole
            _remove(target)
            _strip_overlay_xattrs(source)
            os.rename(source, target)
    return applied


def _opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _strip_overlay_xattrs(path: str) -> None:
    """The overlay's bookkeeping (origin, opaque) off an entry that leaves it."""
    entries = [path]
    if os.path.isdir(path) and not os.path.islink(path):
        for where, dirs, files in os.walk(path):
            entries += [os.path.join(where, n) for n in dirs + files]
    for entry in entries:
        try:
            for attr in os.listxattr(entry, follow_symlinks=False):
                if attr.startswith("trusted.overlay."):
                    os.removexattr(entry, attr, follow_symlinks=False)
        except OSError:
            pass


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
