"""Write sandbox/client/sync_client.py from sandbox/client/async_client.py.

The client is written once, async (the kernel's flavour); the blocking one is this file's
output, token for token, as httpcore does with its own unasync script. Run it after editing
the async client:

    python scripts/unasync.py          # rewrite sync_client.py
    python scripts/unasync.py --check  # exit 1 if sync_client.py is stale (the tests run this)

The rules are whole-word replacements, applied in order: a name missing here stays as it
is in the sync client, and a test (tests/unit/test_client_generated.py) fails when the
committed file differs from what the rules make.
"""

from __future__ import annotations

import argparse
import difflib
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "sandbox" / "client" / "async_client.py"
TARGET = ROOT / "sandbox" / "client" / "sync_client.py"

# (async spelling, sync spelling): regular expressions matched as whole words, applied in order.
RULES: list[tuple[str, str]] = [
    # the language
    (r"async def\b", "def"),
    (r"async with\b", "with"),
    (r"async for\b", "for"),
    (r"await ", ""),
    (r"__aenter__\b", "__enter__"),
    (r"__aexit__\b", "__exit__"),
    # typing
    (r"t\.AsyncContextManager\b", "t.ContextManager"),
    (r"t\.AsyncIterator\b", "t.Iterator"),
    # httpx
    (r"httpx\.AsyncClient\b", "httpx.Client"),
    (r"async_transport\b", "transport"),
    (r"aiter_bytes\b", "iter_bytes"),
    (r"aiter_lines\b", "iter_lines"),
    (r"aread\b", "read"),
    (r"aclose\b", "close"),
    # our own pairs (sandbox/client/wire.py)
    (r"aiter_upload\b", "iter_upload"),
    (r"acall\b", "call"),
    # our classes
    (r"_AsyncTransport\b", "_SyncTransport"),
    (r"_AsyncStream\b", "_SyncStream"),
    (r"_AsyncLines\b", "_SyncLines"),
    (r"Async([A-Z]\w*)\b", r"\1"),
]

HEADER = """# GENERATED FILE: do not edit. Written by scripts/unasync.py from async_client.py;
# edit async_client.py and run `python scripts/unasync.py` (a test fails when this is stale).
"""


def generate(source: str) -> str:
    """The sync client's text for the async client's text."""
    lines = []
    for line in source.splitlines(keepends=True):
        for pattern, replacement in RULES:
            line = re.sub(r"\b" + pattern, replacement, line)
        lines.append(line)
    return HEADER + "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether sync_client.py is up to date")
    args = parser.parse_args(argv)
    wanted = generate(SOURCE.read_text())
    current = TARGET.read_text() if TARGET.exists() else ""
    if args.check:
        if current == wanted:
            return 0
        diff = difflib.unified_diff(current.splitlines(keepends=True), wanted.splitlines(keepends=True),
                                    str(TARGET.relative_to(ROOT)), "generated from async_client.py")
        sys.stderr.write("".join(diff))
        sys.stderr.write(f"\n{TARGET.relative_to(ROOT)} is stale: run python scripts/unasync.py\n")
        return 1
    if current != wanted:
        TARGET.write_text(wanted)
        print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
