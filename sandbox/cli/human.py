"""Numbers and times as a person reads them, and tables with a header.

Machines get ``--json`` (the server's own objects); these are only for the terminal, so
they round freely: ``1.4 GiB``, ``3 min ago``, ``in 52 min``. Text a sandbox may have
written is shown with its control characters escaped (`terminal_text`).
"""

from __future__ import annotations

import re
import typing as t
from datetime import datetime, timezone


def size(n: float | None) -> str:
    """Bytes as B, KiB, MiB or GiB with one decimal below 10 (``-`` when unknown)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 10 else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``, ``2 d 4 h`` (``-`` when unknown)."""
    if seconds is None:
        return "-"
    s = int(round(abs(seconds)))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def relative(when: datetime | str | None, now: datetime | None = None) -> str:
    """``in 52 min`` or ``3 min ago``."""
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            return when
    if when is None:
        return "-"
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    delta = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return f"in {duration(delta)}" if delta >= 0 else f"{duration(delta)} ago"


def table(header: t.Sequence[str], rows: t.Iterable[t.Sequence[t.Any]], right: t.Collection[int] = ()) -> str:
    """Columns padded to their widest cell; the columns numbered in ``right`` are aligned
    right (numbers)."""
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


_TERMINAL_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_text(raw: bytes) -> str:
    """A line of a log for the terminal: control characters (C0 but the tab, DEL, C1) and
    bytes that are not UTF-8 shown as ``\\xHH``. A runtime's log holds what the sandbox's
    processes wrote to their stderr: printed raw, an escape sequence in it would drive the
    admin's terminal (retitle it, rewrite lines, set the clipboard)."""
    text = raw.decode("utf-8", "backslashreplace")
    return _TERMINAL_CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
