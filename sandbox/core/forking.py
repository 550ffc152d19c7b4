"""A fork of a paused gVisor sandbox, laid out on disk as if it had been paused itself.

runsc can restore one checkpoint image more than once, each time as an independent
container. A fork is therefore a second sandbox directory holding what a paused sandbox
holds (``spec.json``, a ``paused`` ``state.json``, ``checkpoint/`` with its record, a
bundle, a workspace) under a new id; the manager then restores it like any paused
sandbox, through the same version checks (``checkpoints.check_restorable``).

What the fork shares and what it owns:

* the checkpoint image is hard-linked, not copied: runsc only reads it, and a later pause
  of either sandbox writes a new directory and renames it into place, so neither can
  change the other's files;
* the workspace is copied (its ext4 image file, sparse, or its plain directory, with
  owners and modes), so the two diverge from the first write; where the image lives in the
  workspace store (``isolation/workspace_store.py``) the copy is a reflink: instant, and
  the two share every block neither has written since;
* the bundle is written anew: it binds the fork's own workspace, on the same pinned root
  filesystem the checkpoint was taken on;
* the uid stays the source's: the restored processes carry the uid they were
  checkpointed with and the copied files are owned by it. Under gVisor that uid is the
  Sentry's, not a host process's (runsc runs as root, each sandbox in its own cgroup).

The source must be paused while this runs (its workspace unmounted, nothing writing).
"""

from __future__ import annotations

import os
import time

from ..isolation import checkpoints
from ..common import statefile
from ..isolation import disk, gvisor, host, workspace_store
from ..runtime import vocabulary as V
from ..common.timeline import Timeline

# Fields of the source's record that describe its own life, not the state it holds.
_OWN_LIFE = ("supervisor_pid", "cgroup_dirs", "restore_error", "restored_in_seconds", "exit_code", "ended_at",
             "extended_until", "pause_message", "paused_by")


def lay_out(source_dir: str, fork_dir: str, fork_id: str, *, ttl: int, max_life: int,
            metadata: dict | None, timeline: Timeline | None = None) -> tuple[dict, dict]:
    """Write the fork's directory from its paused source's; return its spec and record.
    ``timeline`` gets a step per part (workspace, checkpoint, bundle and records)."""
    timeline = timeline or Timeline("fork")
    timeline.restart()
    spec = statefile.read_json(os.path.join(source_dir, "spec.json"))
    record = statefile.read_json(os.path.join(source_dir, "state.json"))
    if spec is None or record is None or record.get("state") != V.PAUSED:
        raise RuntimeError(f"{source_dir} holds no paused sandbox to fork")
    if os.path.ismount(host.workspace_dir(source_dir)):
        raise RuntimeError("the source's workspace is still mounted: it is not paused yet")
    if not disk.wait_free(host.workspace_image(source_dir), host.SETTLE_SECONDS):
        raise RuntimeError(disk.held_reason("the source's workspace image", host.workspace_dir(source_dir)))
    os.makedirs(fork_dir, mode=0o711)
    os.chmod(fork_dir, 0o711)
    _copy(host.workspace_dir(source_dir), host.workspace_dir(fork_dir))
    if workspace_store.in_store(host.workspace_image(source_dir)):
        workspace_store.clone(host.workspace_image(source_dir), spec["workspace_store"], fork_id,
                              host.workspace_image(fork_dir))
    elif os.path.exists(host.workspace_image(source_dir)):
        _copy(host.workspace_image(source_dir), host.workspace_image(fork_dir))
    timeline.mark("lay_out.copy_workspace")
    disk.run(["cp", "-al", checkpoints.image_path(source_dir), checkpoints.image_path(fork_dir)])
    _copy(checkpoints.record_path(source_dir), checkpoints.record_path(fork_dir))
    timeline.mark("lay_out.link_checkpoint")

    spec.update(id=fork_id, workspace=host.workspace_dir(fork_dir), ttl_seconds=ttl, max_lifetime_seconds=max_life,
                pooled=False, forked_from=spec["id"])
    if metadata is not None:
        spec["metadata"] = metadata
    gvisor.write_bundle(fork_dir, spec, {"path": record["isolation"]["rootfs_path"]})
    statefile.write_json(os.path.join(fork_dir, "spec.json"), spec)

    source_id, now = record["id"], time.time()
    # The fork's state is the source's, so it lives no longer than the source may: its
    # absolute end is the source's (or sooner), never a fresh one, else forking again
    # and again would keep a sandbox's state past its maximum lifetime forever.
    source_end = record.get("max_expires_at")
    max_expires = min(now + max_life, statefile.epoch(source_end)) if source_end is not None else now + max_life
    for key in _OWN_LIFE:
        record.pop(key, None)
    record.update(id=fork_id, created_at=statefile.iso(now), booted_at=statefile.iso(now), ttl_seconds=ttl,
                  expires_at=min(now + ttl, max_expires), max_expires_at=max_expires, metadata=spec["metadata"],
                  pooled=False, from_pool=False, forked_from=source_id, restores=0)
    statefile.write_json(os.path.join(fork_dir, "state.json"), record)
    timeline.mark("lay_out.bundle_and_records")
    return spec, record


def _copy(source: str, dest: str) -> None:
    """A copy that keeps owners, modes and holes (a workspace image is a sparse file), and
    shares blocks where the filesystem makes reflinks (``--sparse=always`` would rule them
    out: cp makes reflinks only with ``--sparse=auto``, which keeps holes all the same)."""
    disk.run(["cp", "-a", "--reflink=auto", "--sparse=auto", source, dest])
