"""File-descriptor-level capture of stdout and stderr.

Capturing fds 1 and 2 (not just ``sys.stdout``) is what makes output of C extensions,
``os.system`` and ``!ls`` visible. Each fd is a pipe drained by a thread that forwards text
as it arrives. Because the bytes travel through a pipe and a thread, the runtime must know
when everything a cell wrote has been forwarded before it reports the cell done: it writes
a random marker into each pipe and waits until the drain thread has seen it (``sync``).
The marker is drawn fresh each time, so a cell cannot forge it.
"""

from __future__ import annotations

import codecs
import os
import secrets
import threading

MARKER_PREFIX = b"\x00\x1bSBX-SYNC:"
MARKER_LEN = len(MARKER_PREFIX) + 32 + 1  # prefix, 32 hex digits, newline


class OutputBudget:
    """Bytes a single execution may emit before output is dropped (and the drop counted)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.used = 0
        self.dropped = 0

    def take(self, n: int) -> int:
        """How many of ``n`` bytes may still be sent."""
        with self.lock:
            allowed = max(0, min(n, self.limit - self.used))
            self.used += allowed
            self.dropped += n - allowed
            return allowed


class PipeDrain(threading.Thread):
    """Redirects one fd into a pipe and forwards what comes out of it as stream events."""

    def __init__(self, fd: int, name: str, emit, budget: OutputBudget):
        super().__init__(name=f"drain-{name}", daemon=True)
        self.name_ = name
        self.emit = emit
        self.budget = budget
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self.read_end = read_end
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._expected: bytes | None = None
        self._seen = threading.Event()
        self._pending = b""

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.read_end, 65536)
            except InterruptedError:
                continue
            if not data:
                return
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        buf = self._pending + data
        self._pending = b""
        expected = self._expected
        if expected is not None:
            at = buf.find(expected)
            if at >= 0:
                self._forward(buf[:at], final=True)
                rest = buf[at + len(expected):]
                self._expected = None
                self._seen.set()
                if rest:
                    self._forward(rest)
                return
            # Hold back a tail that could be the start of the marker.
            keep = _partial_suffix(buf, expected)
            if keep:
                self._pending = buf[-keep:]
                buf = buf[:-keep]
        self._forward(buf)

    def _forward(self, data: bytes, final: bool = False) -> None:
        if data:
            allowed = self.budget.take(len(data))
            data = data[:allowed]
        text = self.decoder.decode(data, final=final)
        if text:
            self.emit(self.name_, text)

    def sync(self, fd: int, timeout: float = 5.0) -> bool:
        """Block until every byte written to ``fd`` before this call has been forwarded."""
        marker = MARKER_PREFIX + secrets.token_hex(16).encode() + b"\n"
        self._seen.clear()
        self._expected = marker
        view = memoryview(marker)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        ok = self._seen.wait(timeout)
        if not ok:
            self._expected = None
        return ok


def _partial_suffix(buf: bytes, marker: bytes) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``marker``."""
    for n in range(min(len(buf), len(marker) - 1), 0, -1):
        if marker.startswith(buf[-n:]):
            return n
    return 0
