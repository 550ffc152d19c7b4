"""How the kernel provisioner and its fork server talk: one Unix stream connection per
kernel, carrying length-prefixed JSON messages and, with the launch request, the kernel's
stdin, stdout and stderr as file descriptors (SCM_RIGHTS).

A launch's connection stays open for the kernel's life: the fork server answers the
request with the child's pid, and later writes the child's exit status on the same
connection when it reaps it, so that the provisioner's poll() and wait() see a real exit
code although the kernel is not its own child.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import typing as t

_HEADER = struct.Struct("!I")
#: A launch request is argv, an environment and a path; anything near this is not one.
MAX_MESSAGE = 4 * 1024 * 1024
#: stdin, stdout and stderr.
STDIO_FDS = 3


class WireError(Exception):
    """The other end sent something that is not a message of this protocol."""


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (SO_PEERCRED:
    the kernel's word, not the peer's)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def peer_pid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


class Channel:
    """One connection: messages out (with file descriptors), messages in (buffered, since
    a pid and an exit status may arrive in one read)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self.fds: list[int] = []  # received, owned by the caller once taken

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict[str, t.Any], fds: t.Sequence[int] = ()) -> None:
        data = json.dumps(message).encode()
        payload = _HEADER.pack(len(data)) + data
        self.sock.settimeout(None)
        sent = socket.send_fds(self.sock, [payload], list(fds)) if fds else self.sock.send(payload)
        self.sock.sendall(payload[sent:])

    def receive(self, timeout: float | None = None) -> dict[str, t.Any] | None:
        """The next message; None if none came within `timeout` (0: only what is there).
        EOFError when the other end closed the connection."""
        while (message := self._take()) is None:
            self.sock.settimeout(timeout)
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, STDIO_FDS)
            except (BlockingIOError, TimeoutError):
                return None
            self.fds.extend(fds)
            if not data:
                raise EOFError("connection closed")
            self._buffer += data
            if len(self._buffer) > MAX_MESSAGE + _HEADER.size:
                raise WireError("message too long")
        return message

    def _take(self) -> dict[str, t.Any] | None:
        if len(self._buffer) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(self._buffer)
        if size > MAX_MESSAGE:
            raise WireError(f"message of {size} bytes announced")
        if len(self._buffer) < _HEADER.size + size:
            return None
        data, self._buffer = self._buffer[_HEADER.size:_HEADER.size + size], self._buffer[_HEADER.size + size:]
        try:
            message = json.loads(data)
        except ValueError as exc:
            raise WireError(f"not JSON: {exc}") from None
        if not isinstance(message, dict):
            raise WireError("not a JSON object")
        return message

    def close_fds(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []

    def close(self) -> None:
        self.close_fds()
        self.sock.close()
