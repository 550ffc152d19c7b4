"""The one spelling of workspace file names in the HTTP API: bytes, escaped where needed.

A file name on Linux is any bytes but ``/`` and NUL, and the sandbox chooses its names, so
they need not be UTF-8 (``b'bad-\\xff-name.txt'``) and may hold control characters that
would rewrite a terminal or a log line. JSON strings and URLs carry text, so the files
routes speak one escaped form, used both ways (listed by ``GET /files``, accepted by
``GET``, ``PUT`` and ``DELETE /files/{path}``):

- a backslash is written ``\\\\`` (two backslashes);
- a byte that is not part of valid UTF-8, and a control byte (0x00-0x1f, 0x7f), is
  written ``\\xHH`` (two lowercase hex digits);
- everything else is the name's own UTF-8 text.

So an ordinary name is spelled as itself, the escaped form never holds a ``/`` the name did
not have, and decoding is exact: ``\\\\`` and ``\\xHH`` are the only escapes, and any other
backslash is an error. It is Python's ``backslashreplace`` with the backslash itself
escaped first, the spelling ``repr(bytes)`` shows.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ESCAPE = re.compile(r"\\(\\|x[0-9a-fA-F]{2})?")


class BadEscape(ValueError):
    """A backslash that starts no valid escape."""


def escape(raw: bytes) -> str:
    """The escaped spelling of a name (or a path: ``/`` passes through)."""
    text = raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def unescape(text: str) -> bytes:
    """The bytes an escaped spelling stands for; ValueError for a stray backslash."""
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(text):
        out += text[pos:m.start()].encode("utf-8", "strict")
        code = m.group(1)
        if code is None:
            raise BadEscape(f"a backslash at offset {m.start()} starts no escape: write '\\\\' for a backslash "
                             f"or '\\xHH' for a byte")
        out += b"\\" if code == "\\" else bytes([int(code[1:], 16)])
        pos = m.end()
    out += text[pos:].encode("utf-8", "strict")
    return bytes(out)
