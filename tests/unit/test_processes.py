"""Whether a pid names a running process (sandbox/common/processes.py), the one answer the
kernel (its started server), the server's housekeeping and the gateway (a gone gateway's
private directory) share: a zombie is not running, though ``kill(pid, 0)`` succeeds on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sandbox.common.processes import pid_alive
from sandbox.gateway.server import PRIVATE_PREFIX, remove_stale_private_dirs


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0]


def _zombie():
    """A child that has exited and is not reaped yet (the caller waits for it)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60
    while _state(child.pid) != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.02)
    return child


def test_a_running_process_is_alive_and_an_exited_one_is_not():
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)


def test_a_zombie_is_not_alive_though_it_can_be_signalled():
    child = _zombie()
    try:
        os.kill(child.pid, 0)  # control: existence alone says it runs
        assert not pid_alive(child.pid)
    finally:
        child.wait()


def test_the_gateway_removes_the_private_directory_of_a_zombie_gateway_and_keeps_a_live_ones(tmp_path):
    child = _zombie()
    try:
        gone = tmp_path / f"{PRIVATE_PREFIX}{child.pid}-x"
        live = tmp_path / f"{PRIVATE_PREFIX}{os.getpid()}-y"
        gone.mkdir()
        live.mkdir()
        assert remove_stale_private_dirs(str(tmp_path)) == [str(gone)]
        assert live.is_dir() and not gone.exists()
    finally:
        child.wait()
