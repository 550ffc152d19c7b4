"""The bubblewrap tier's root: the image's pinned root (``rootfs.py``), the gVisor tier's tree.

A venv image's bwrap sandbox used to bind the host's live ``/usr``: a host upgrade changed
every running image, and every program the host has was visible to sandbox code. Now it
runs on the same pinned root as a gVisor sandbox of that image (same builder, same version):
the ldd closure of the interpreter and the image's extension modules, the shell tools, a few
``/etc`` files, copied from the host once.

bwrap binds the image's trees over that root as it always has (each an ext4 filesystem of
its own, ``imagefs.py``), and copies the runtime and the font cache into tmpfs mounts: so its
view of the root is the root's *system*, the tree minus those parts, with empty mount points
in their place and the interpreter's prefix a link to ``PYTHON_MOUNT``. The view is made of
hard links to the root's own files (nothing copied twice) and, where the server can
loop-mount (root), packed into a small read-only ext4 of its own (``system.ext4``, about
30 MB for the default image) whose mount is bound as ``/``: so the sandbox's mountinfo names
no state path, as for the image trees. Without loop mounts the view's directory is bound.

Built once per root version, under the root's lock, by the server (off a request's path
when the warm pool starts the image first); a sandbox's supervisor only mounts the pack
again after a reboot.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time

from ..common import statefile
from . import disk, imagefs, rootfs
from .bwrap import EGRESS_CA_BUNDLE, EGRESS_PACKAGES, EGRESS_SOCKET_DIR, MPLCACHE_MOUNT, PYTHON_MOUNT, RUNTIME_MOUNT

VIEW = "system"
# Directories and files the sandbox's other mounts land on: bwrap cannot make them in a
# read-only root. (/sys is gVisor's sysfs; bwrap mounts none.)
MOUNT_DIRS = (RUNTIME_MOUNT, MPLCACHE_MOUNT, PYTHON_MOUNT, EGRESS_SOCKET_DIR, EGRESS_PACKAGES)
NOT_MOUNTED = ("/sys",)
MOUNT_FILES = (EGRESS_CA_BUNDLE,)


def _left_out(image: dict) -> set[str]:
    """The root's paths bwrap mounts from elsewhere: the image's trees, runtime, font cache."""
    return {tree for _, tree in rootfs.image_trees(image)} | {RUNTIME_MOUNT, MPLCACHE_MOUNT}


def _make_view(root: str, view: str, image: dict) -> None:
    """Hard-link ``root`` into ``view`` without the parts bwrap mounts over it."""
    left_out = _left_out(image)

    def ignore(directory: str, names: list[str]) -> set[str]:
        inside = os.path.normpath(os.path.join("/", os.path.relpath(directory, root)))
        return {n for n in names if os.path.join(inside, n) in left_out}

    shutil.copytree(root, view, symlinks=True, ignore=ignore, copy_function=os.link)
    for path in NOT_MOUNTED:
        os.rmdir(view + path)
    for path in sorted(left_out | set(MOUNT_DIRS)):
        os.makedirs(view + path, exist_ok=True)
    for path in MOUNT_FILES:
        os.makedirs(os.path.dirname(view + path), exist_ok=True)
        open(view + path, "wb").close()
    if image.get("python_copy"):  # the venv's references name the prefix: a link to the copy's mount
        prefix = view + image["python_prefix"]
        os.rmdir(prefix)
        os.symlink(PYTHON_MOUNT, prefix)
    for d, _, _ in os.walk(view):
        os.chmod(d, 0o755)


def ensure(rootfs_dir: str, image: dict, runtime_dir: str, *, pack: bool) -> dict:
    """The bwrap view of ``image``'s pinned root (built now if need be): ``{"version", "tree",
    "pack"}``, ``pack`` an ext4 of the view where ``pack`` is asked for and mke2fs is there."""
    record = rootfs.ensure(rootfs_dir, image, runtime_dir)
    target = os.path.dirname(record["path"])
    done = os.path.join(target, f"{VIEW}.json")
    view = statefile.read_json(done)
    if view is not None and (view.get("pack") or not pack):
        return view
    with open(os.path.join(rootfs_dir, f".{record['version']}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        view = statefile.read_json(done)
        if view is not None and (view.get("pack") or not pack):
            return view
        started = time.monotonic()
        tree = os.path.join(target, VIEW)
        if view is None:
            shutil.rmtree(tree + ".building", ignore_errors=True)
            _make_view(record["path"], tree + ".building", image)
            os.rename(tree + ".building", tree)
        packed = None
        if pack and disk.available()[0]:
            packed = os.path.join(target, f"{VIEW}.ext4")
            disk.pack(tree, packed + ".building")
            # mke2fs makes a lost+found, which no sandbox needs to see
            try:
                subprocess.run(["debugfs", "-w", "-R", "rmdir lost+found", packed + ".building"], capture_output=True)
            except OSError:  # no debugfs (e2fsprogs has it): an empty lost+found it is
                pass
            os.rename(packed + ".building", packed)
        view = {"version": record["version"], "tree": tree, "pack": packed, "image": image["name"],
                "image_hash": image["hash"], "build_seconds": round(time.monotonic() - started, 2)}
        statefile.write_json(done, view, mode=0o644)
        return view


def source(view: dict) -> str:
    """What bwrap binds as ``/``: the pack's read-only mount where this process can make one
    (made again after a reboot), else the view's directory."""
    if view.get("pack") and imagefs.loop_mounts():
        return imagefs.ensure_mounted(view["pack"])
    return view["tree"]
