"""The escaped spelling of file names (sandbox/common/filenames.py): exact both ways, plain names
spelled as themselves, and nothing but its two escapes accepted."""

from __future__ import annotations

import pytest

from sandbox.common import filenames


@pytest.mark.parametrize("raw", [
    bytes(range(1, 256)),  # every byte but NUL, in one name
    b"plain-name.csv", "caf\u00e9 \u65e5\u672c.txt".encode(), b"bad-\xff-name.txt", b"a\\b", b"\\x41",
    b"\xed\xa0\x80surrogate", b"\xc3", b"tab\there", b"x" * 255,
])
def test_round_trip_is_exact(raw):
    text = filenames.escape(raw)
    assert filenames.unescape(text) == raw
    assert text.isprintable() or "\\" in text
    assert not any(ord(c) < 0x20 or ord(c) == 0x7f for c in text), text


def test_ordinary_names_are_spelled_as_themselves():
    for name in ("data.csv", "out/fig 1.png", "caf\u00e9/\u65e5\u672c.txt", "100%.txt"):
        assert filenames.escape(name.encode()) == name
    assert filenames.escape(b"bad-\xff-name.txt") == "bad-\\xff-name.txt"
    assert filenames.escape(b"a\\b") == "a\\\\b"  # else a real name "a\xff" would read as a byte


@pytest.mark.parametrize("text", ["a\\", "a\\q", "\\x4", "\\xzz", "\\u00e9", "\ud800"])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError):
        filenames.unescape(text)
