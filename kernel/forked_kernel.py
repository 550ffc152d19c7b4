"""A kernel forked by the fork server, seen by its launcher as a `subprocess.Popen` is.

jupyter_client's LocalProvisioner manages its kernel through a Popen: `poll()`, `wait()`,
`send_signal()`, `kill()`, `terminate()`, `pid`. The fork provisioner hands it this object
instead, so that every one of its lifecycle paths (interrupt, restart, shutdown) is
LocalProvisioner's own. The kernel is the fork server's child, not ours: its exit status
comes over the launch's connection (kernel/fork_wire.py), and signals go to it by pid,
never after its status came (the pid may be another process's by then).
"""

from __future__ import annotations

import os
import signal
import socket
import time
import typing as t

from .fork_wire import Channel, WireError


class ForkedKernel:
    """The Popen-like handle of one forked kernel."""

    stdin = stdout = stderr = None  # its stdio went to the fork server as descriptors

    def __init__(self, channel: Channel, pid: int, server_pid: int) -> None:
        self.channel = channel
        self.pid = pid
        self.server_pid = server_pid  # the fork server: what the kernel's memory is shared with
        self.returncode: int | None = None

    @classmethod
    def launch(cls, path: str, argv: list[str], env: dict[str, str], cwd: str, stdio: t.Sequence[int],
               timeout: float) -> ForkedKernel:
        """Ask the fork server at `path` for a kernel; OSError or WireError if it does not give one."""
        from .fork_wire import peer_pid, peer_uid

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        channel = Channel(sock)
        try:
            sock.connect(path)
            if peer_uid(sock) != os.getuid():  # the folder is ours, so this is only belt and braces
                raise WireError(f"the fork server at {path} runs as uid {peer_uid(sock)}")
            server_pid = peer_pid(sock)
            channel.send({"argv": argv, "env": env, "cwd": cwd}, fds=stdio)
            reply = channel.receive(timeout=timeout)
            if reply is None:
                raise WireError(f"no answer from the fork server at {path} in {timeout:g} s")
            if "pid" not in reply:
                raise WireError(f"the fork server refused the launch: {reply.get('error', reply)}")
        except BaseException:
            channel.close()
            raise
        kernel = cls(channel, int(reply["pid"]), server_pid)
        kernel._take(reply)  # a status that came with the pid (a kernel that exited at once)
        return kernel

    def _take(self, message: dict[str, t.Any]) -> None:
        if "exit" in message:
            self.returncode = int(message["exit"])
            self.channel.close()

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        try:
            message = self.channel.receive(timeout=timeout)
        except (EOFError, WireError, OSError):
            # the fork server is gone without a word: the kernel is nobody's child we can
            # ask; it lives as long as its pid does
            self.returncode = None if _alive(self.pid) else -signal.SIGKILL
            if self.returncode is None:
                return
            self.channel.close()
            return
        if message is not None:
            self._take(message)

    def poll(self) -> int | None:
        self._read(timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                import subprocess

                raise subprocess.TimeoutExpired(["kernel"], timeout or 0)
            self._read(timeout=0.1 if left is None else min(left, 0.1))
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
