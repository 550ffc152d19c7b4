"""File-descriptor-level capture of stdout and stderr.

Capturing fds 1 and 2 (not just ``sys.stdout``) is what makes output of C extensions,
``os.system`` and ``!ls`` visible. Each fd is a pipe, drained by a thread that forwards text
as it arrives. Before the runtime reports anything that must come after a cell's output (a
display, a result, ``done``), everything already written must have been forwarded: ``sync``
does that itself, in the caller's thread. The drain thread reads and forwards only while it
holds the drain's lock, so once ``sync`` holds it, every byte written before the call is
either forwarded already or still in the pipe, where ``sync`` reads it. Nothing is written
into the pipe to find where a cell's output ends, so a cell has nothing to forge.
"""

from __future__ import annotations

import array
import codecs
import fcntl
import os
import select
import termios
import threading


class OutputBudget:
    """What a single execution may send (frame bytes, as ``framecheck.frame_cost`` counts
    them, for every output event) before output is cut or dropped, and what was."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()  # held while an event is fitted, charged and sent
        self.reset()

    def reset(self, stream_limit: int | None = None) -> None:
        self.used = 0
        self.dropped = 0      # bytes of events dropped whole
        self.cut = 0          # events sent trimmed
        self.closing_sent: set[str] = set()  # answer events already sent (runtime.CLOSING_EVENTS)
        # The caller's own, smaller cap on stream text (a notebook's kernel asks for one the
        # Jupyter server's IOPub rate limit never reaches), and its count in bytes of text.
        self.stream_limit = stream_limit
        self.stream_used = 0
        self.stream_dropped = 0

    def take_stream(self, text: str) -> str | None:
        """``text`` as far as the caller's stream limit still allows (all of it when there is
        none), or None when nothing is left; what is cut off is counted. Past the limit the
        text is counted, never encoded again or framed: the rest of a 30 MB print costs the
        sandbox little more than reading it from the pipe."""
        if self.stream_limit is None:
            return text
        room = self.stream_limit - self.stream_used
        if room <= 0:
            self.stream_dropped += len(text)  # characters: close enough for a note, and cheap
            return None
        raw = text.encode("utf-8", "replace")
        if len(raw) <= room:
            self.stream_used += len(raw)
            return text
        kept = raw[:room].decode("utf-8", "ignore")
        self.stream_used = self.stream_limit
        self.stream_dropped += len(raw) - len(kept.encode("utf-8"))
        return kept or None

    @property
    def room(self) -> int:
        return max(0, self.limit - self.used)

    @property
    def truncated(self) -> bool:
        return bool(self.dropped or self.cut or self.stream_dropped)

    def take(self, n: int) -> int:
        """How many of ``n`` raw bytes may still be sent (a command's output, which the
        runtime forwards in chunks of its own)."""
        with self.lock:
            allowed = max(0, min(n, self.limit - self.used))
            self.used += allowed
            self.dropped += n - allowed
            return allowed


class PipeDrain(threading.Thread):
    """Redirects one fd into a pipe and forwards what comes out of it as stream events."""

    def __init__(self, fd: int, name: str, emit):
        super().__init__(name=f"drain-{name}", daemon=True)
        self.name_ = name
        self.emit = emit  # charges the execution's output budget (runtime.publish_stream)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        os.set_blocking(read_end, False)
        self.read_end = read_end
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.lock = threading.Lock()

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.read_end, select.POLLIN)
        while True:
            poller.poll()
            with self.lock:
                if not self._drain(1 << 20):
                    return

    def _drain(self, limit: int) -> bool:
        """Forward up to ``limit`` bytes the pipe holds now; False at end of file."""
        while limit > 0:
            try:
                data = os.read(self.read_end, min(limit, 65536))
            except (BlockingIOError, InterruptedError):
                return True
            if not data:
                return False
            limit -= len(data)
            self._forward(data)
        return True

    def _forward(self, data: bytes, final: bool = False) -> None:
        text = self.decoder.decode(data, final=final)
        if text:
            self.emit(self.name_, text)

    def sync(self) -> None:
        """Forward every byte written to the fd before this call.

        Only what is in the pipe now is read: a background thread that never stops
        writing cannot keep the caller here. An incomplete UTF-8 sequence at the end is
        flushed as U+FFFD, since what follows is another message.
        """
        with self.lock:
            pending = array.array("i", [0])
            fcntl.ioctl(self.read_end, termios.FIONREAD, pending)
            self._drain(pending[0])
            self._forward(b"", final=True)
