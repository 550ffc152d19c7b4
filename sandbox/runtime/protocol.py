"""Length-prefixed JSON frames: the only language spoken between server, supervisor and runtime.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Framing
(rather than newline-delimited text on stdout) keeps the protocol on a channel of its own,
so nothing a cell prints can be mistaken for a message; JSON (never pickle) keeps the host
from executing anything that came out of a sandbox. The reader enforces a size cap before
it allocates, so a hostile peer cannot make the host buffer an arbitrary amount.

This module is copied into every sandbox, so it uses the standard library only. The
runtime in the sandbox speaks over a blocking socket or pipes (`SocketChannel`); only the
host's side (the supervisor, the server) reads frames with asyncio, which is imported when
it first does: asyncio, and the ssl it loads, are about 2 MiB of every sandbox's memory
that a sandbox whose cells never use them would otherwise carry.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import typing as t

if t.TYPE_CHECKING:
    import asyncio

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 * 1024 * 1024


class ProtocolError(Exception):
    """The peer sent something that is not a well-formed frame."""


class FrameTooLarge(ProtocolError):
    def __init__(self, size: int, limit: int):
        super().__init__(f"frame of {size} bytes exceeds the {limit}-byte limit")
        self.size = size
        self.limit = limit


def encode(message: dict) -> bytes:
    payload = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> dict:
    try:
        message = json.loads(payload.decode("utf-8", "replace"))
    except ValueError as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


#: The runtime's argument naming its channel "the container's stdin and stdout" (gVisor);
#: otherwise the argument is the fd of a socket (bwrap).
STDIO_CHANNEL = "stdio"


class _PipePair:
    """The two calls SocketChannel makes of a socket, over a pipe each way."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.write_fd, view):]

    def recv(self, n: int) -> bytes:
        return os.read(self.read_fd, n)


class SocketChannel:
    """Blocking frames over a socket, safe to send from several threads (the runtime's side)."""

    def __init__(self, sock: socket.socket, max_frame: int = MAX_FRAME_BYTES):
        self.sock = sock
        self.max_frame = max_frame
        self._send_lock = threading.Lock()

    @classmethod
    def from_fd(cls, fd: int) -> "SocketChannel":
        return cls(socket.socket(fileno=fd))

    @classmethod
    def from_pipes(cls, read_fd: int, write_fd: int) -> "SocketChannel":
        """The channel over two pipes (gVisor: the container's stdin and stdout)."""
        return cls(_PipePair(read_fd, write_fd))

    def send(self, message: dict) -> None:
        data = encode(message)
        with self._send_lock:
            self.sock.sendall(data)

    def send_payload(self, payload: bytes) -> None:
        """Send a payload already encoded (and checked) by the caller."""
        with self._send_lock:
            self.sock.sendall(HEADER.pack(len(payload)) + payload)

    def _read_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise EOFError("channel closed")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv(self) -> dict:
        (size,) = HEADER.unpack(self._read_exact(HEADER.size))
        if size > self.max_frame:
            raise FrameTooLarge(size, self.max_frame)
        return decode(self._read_exact(size))


async def read_frame(reader: asyncio.StreamReader, max_frame: int = MAX_FRAME_BYTES) -> dict:
    """Read one frame. An oversized one raises FrameTooLarge before anything is buffered;
    the channel is then out of step, and the caller must drop it."""
    return decode(await read_payload(reader, max_frame))


async def read_payload(reader: asyncio.StreamReader, max_frame: int = MAX_FRAME_BYTES) -> bytes:
    """Read one frame's payload, unparsed (for a caller that checks it first)."""
    import asyncio  # the host's side only (the module's docstring says why not at the top)

    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError:
        raise EOFError("channel closed") from None
    (size,) = HEADER.unpack(header)
    if size > max_frame:
        raise FrameTooLarge(size, max_frame)
    try:
        payload = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise EOFError("channel closed") from None
    return payload


async def write_frame(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(encode(message))
    await writer.drain()


def set_inheritable(fd: int) -> int:
    os.set_inheritable(fd, True)
    return fd
