"""A paused sandbox's checkpoint: where it lives, what it was taken under, whether it may be restored.

``SANDBOX/checkpoint/`` holds runsc's image of the live container (its memory, its processes,
its open files); ``SANDBOX/checkpoint.json`` records what it was taken under: the runsc
release (an image restores only with the same binary), the image's recipe hash and the
pinned root filesystem's version (a restored process keeps libraries mapped that it loaded
before, so its files must be the same ones). A restore under anything else is refused, with
a message that says what differs, and the sandbox stays paused: installing the old runsc
again, or deleting the sandbox, are the ways on.

A checkpoint is written to ``checkpoint.new/`` and renamed into place only once runsc
reports success, so a failed or interrupted pause never leaves a half image to restore.
"""

from __future__ import annotations

import os
import shutil
import time

from ..common import statefile
from ..images.build_steps import dir_size as _dir_size
from ..runtime import vocabulary as V


class RestoreRefused(RuntimeError):
    """A checkpoint that must not be restored here; ``reason`` is a vocabulary word."""

    def __init__(self, message: str, reason: str = V.RESTORE_VERSION_MISMATCH):
        super().__init__(message)
        self.reason = reason


def image_path(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "checkpoint")


def staging_path(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "checkpoint.new")


def record_path(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "checkpoint.json")


def read(sandbox_dir: str) -> dict:
    record = statefile.read_json(record_path(sandbox_dir))
    if record is None or not os.path.isdir(image_path(sandbox_dir)):
        raise RestoreRefused(f"the sandbox has no complete checkpoint in {sandbox_dir}", reason=V.PAUSE_FAILED)
    return record


def commit(sandbox_dir: str, *, runsc_version: str, spec: dict, rootfs_version: str | None,
           seconds: float, memory_bytes: int | None) -> dict:
    """Move the staged image into place and record what it was taken under."""
    staged, final = staging_path(sandbox_dir), image_path(sandbox_dir)
    record = {
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runsc_version": runsc_version,
        "image": spec["image"],
        "image_hash": spec["image_info"]["hash"],
        "rootfs_version": rootfs_version,
        "size_bytes": _dir_size(staged),
        "seconds": round(seconds, 3),
        "memory_bytes_before": memory_bytes,
    }
    shutil.rmtree(final, ignore_errors=True)
    os.rename(staged, final)
    statefile.write_json(record_path(sandbox_dir), record)
    return record


def discard(sandbox_dir: str) -> None:
    for path in (staging_path(sandbox_dir), image_path(sandbox_dir)):
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.unlink(record_path(sandbox_dir))
    except FileNotFoundError:
        pass


def check_restorable(record: dict, runsc_version: str, spec: dict, rootfs_version: str | None,
                     rootfs_exists: bool) -> None:
    """Raise RestoreRefused unless this host can restore the checkpoint as it was taken."""
    problems = []
    if record.get("runsc_version") != runsc_version:
        problems.append(f"it was taken under runsc {record.get('runsc_version')} and this host has runsc "
                        f"{runsc_version} (a checkpoint restores only with the same runsc release)")
    if record.get("image_hash") != spec["image_info"]["hash"]:
        problems.append(f"it was taken on image {record.get('image')!r} version {record.get('image_hash')} and the "
                        f"sandbox's image is now version {spec['image_info']['hash']}")
    if record.get("rootfs_version") != rootfs_version or not rootfs_exists:
        problems.append(f"its root filesystem {record.get('rootfs_version')} is "
                        + ("not the sandbox's" if rootfs_exists else "gone"))
    if problems:
        raise RestoreRefused("the paused sandbox cannot be restored here: " + "; ".join(problems)
                             + ". It stays paused: restore it where these match, or delete it.")
