"""A paused workspace's image is complete before anything reads it, and the workspace store
shares blocks between a workspace and its fork's copy: real loop mounts, real ext4 and XFS.

The first is the cause of a fork that lost a file: a sandbox's last process not quite gone
kept its workspace busy, the unmount went lazy, and the fork copied the image before the
filesystem had written its last data.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

import support

from sandbox.isolation import disk, workspace_store

pytestmark = pytest.mark.skipif(not disk.available()[0], reason=f"no loop-mounted workspaces here: {disk.available()[1]}")


def test_an_unmount_waits_until_the_image_holds_the_last_write(tmp_path):
    image, point = str(tmp_path / "ws.img"), str(tmp_path / "ws")
    os.makedirs(point)
    disk.create(image, point, 64, None)
    # A process that has the workspace open and writes as it goes, as a sandbox's last
    # process does while it is being killed.
    holder = subprocess.Popen(["sh", "-c", "exec 3>data.txt; echo first >&3; read line; echo last >&3"],
                              cwd=point, stdin=subprocess.PIPE, text=True)
    try:
        done: list[bool] = []
        waiter = threading.Thread(target=lambda: done.append(disk.unmount(point, 20, image)))
        waiter.start()
        time.sleep(1.0)
        assert not os.path.ismount(point)  # detached at once (lazily), so nothing new can open it
        assert not done and disk.in_loop(image)  # but not free: the filesystem still lives
        holder.communicate("go\n", timeout=10)
        waiter.join(20)
        assert done == [True] and not disk.in_loop(image)
    finally:
        holder.kill()
    disk.mount(image, point, read_only=True)
    try:
        assert open(os.path.join(point, "data.txt")).read() == "first\nlast\n"
    finally:
        disk.unmount(point)


def test_a_held_image_is_reported_held(tmp_path):
    image, point = str(tmp_path / "ws.img"), str(tmp_path / "ws")
    os.makedirs(point)
    disk.create(image, point, 64, None)
    holder = subprocess.Popen(["sleep", "30"], cwd=point)
    try:
        assert disk.unmount(point, 0.5, image) is False
        assert disk.wait_free(image, 0.2) is False
    finally:
        holder.kill()
        holder.wait()
    assert disk.wait_free(image, 10) is True


def test_a_mount_namespace_made_meanwhile_is_named_as_the_holder(tmp_path):
    """Where the host's mounts are private, a mount namespace made while a workspace is
    mounted keeps its own copy of the mount: unmounted on the host, the image stays held
    until that namespace ends, and the reason names a process of it."""
    image, point = str(tmp_path / "ws.img"), str(tmp_path / "ws")
    os.makedirs(point)
    disk.create(image, point, 64, None)
    pinner = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        assert support.wait_for(lambda: os.readlink(f"/proc/{pinner.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"), 10)
        assert disk.unmount(point, 0.5, image) is False  # gone from here, held there
        assert disk.held_reason("the image", point) == (
            "the image is still held by a copy of its mount in another mount namespace, made on the host while the "
            f"sandbox ran (pid {pinner.pid} (sleep)); it is free once that namespace ends")
    finally:
        pinner.kill()
        pinner.wait()
    assert disk.wait_free(image, 10) is True
    assert disk.held_reason("the image", point) == "the image is still held by the sandbox's previous run"


@pytest.mark.skipif(not workspace_store.available()[0], reason=f"no workspace store here: {workspace_store.available()[1]}")
def test_the_store_clones_a_workspace_sharing_its_blocks(tmp_path):
    root = str(tmp_path)
    try:
        source_link, fork_link = str(tmp_path / "a.img"), str(tmp_path / "b.img")
        workspace_store.place(root, "sbx-a", source_link)
        point = str(tmp_path / "ws")
        os.makedirs(point)
        disk.create(source_link, point, 256, None)
        with open(os.path.join(point, "big.bin"), "wb") as f:
            f.write(os.urandom(32 << 20))
        assert disk.unmount(point, 10, source_link)
        store = workspace_store.mount_point(root)
        before = support.disk_used(store)
        workspace_store.clone(source_link, root, "sbx-b", fork_link)
        assert support.disk_used(store) - before < (4 << 20)
        assert os.path.realpath(fork_link) == workspace_store.image_of(root, "sbx-b")
        disk.mount(fork_link, point)
        try:
            assert os.path.getsize(os.path.join(point, "big.bin")) == 32 << 20
        finally:
            disk.unmount(point)
        disk.destroy(source_link)
        disk.destroy(fork_link)
        assert not os.listdir(store) and not os.path.lexists(fork_link)
    finally:
        disk.unmount(workspace_store.mount_point(root))
