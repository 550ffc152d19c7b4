"""The airlock magics, run by the kernel and never sent to the sandbox.

The sandbox has no network and cannot see the notebook's files; `%push` and `%pull` are
the only doors, and they are opened from outside. `%sandbox` and `%ttl` show what the
user cannot see from inside: where their code runs, under which limits, and for how long.

    %push LOCAL [DEST]     upload local files (globs, directories) into /workspace
    %pull [--force] [--allow-code] REMOTE [LOCAL]
                           download files (globs) from /workspace
    %sandbox               the sandbox's id, state, TTL, limits, isolation and egress policy
    %ttl                   time left; `%ttl renew [SECONDS]` pushes expiry back

Magic lines come first in a cell, any number of them, followed by code. Any other `%` or
`%%` magic is IPython's and runs in the sandbox.

This module parses the magic lines, runs each through its handler (transfer.py: `%push`,
`%pull`; report.py: `%sandbox`, `%ttl`) and completes their names and local paths.
"""

from __future__ import annotations

import glob
import pathlib
import re
import shlex
import typing as t

from sandbox.client import InvalidRequest, SandboxError, SandboxGone, SandboxNotFound, ServerUnavailable

from .failure import CellFailure
from .magic_host import MagicCall, MagicHost
from .report import run_sandbox, run_ttl
from .transfer import run_pull, run_push

MAGICS = ("push", "pull", "sandbox", "ttl")
_MAGIC_LINE = re.compile(r"^%(push|pull|sandbox|ttl)(?:\s+(.*))?$")


# --------------------------------------------------------------------------- parsing


def split_cell(code: str) -> tuple[list[MagicCall], str]:
    """Take the kernel's magic lines off the top of a cell.

    Returns the magics and the code to send to the sandbox ("" if there is none). Magic
    lines are commented out rather than removed, so that line numbers in the sandbox's
    tracebacks still match the cell. Blank and comment lines may sit among the magics.
    """
    lines = code.split("\n")
    calls: list[MagicCall] = []
    consumed = 0
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _MAGIC_LINE.match(line.rstrip())
        if not match:
            break
        name, rest = match.group(1), match.group(2) or ""
        try:
            args = shlex.split(rest)
        except ValueError as exc:
            raise CellFailure("UsageError", f"%{name}: {exc}") from None
        calls.append(MagicCall(name, args, line))
        consumed = index + 1
    if not calls:
        return [], code
    code_lines = lines[consumed:]
    if not "\n".join(code_lines).strip():
        return calls, ""
    # Comments, not blank lines: IPython drops leading blank lines, which would shift
    # every line number in a traceback.
    placeholders = [f"# {line}" if line.strip() else "#" for line in lines[:consumed]]
    return calls, "\n".join(placeholders + code_lines)


# --------------------------------------------------------------------------- running


async def run_magic(call: MagicCall, host: MagicHost) -> None:
    """Run one magic; CellFailure for what the user can fix, SandboxGone and
    ServerUnavailable left to the kernel, which knows how to recover from them."""
    handler = {"push": run_push, "pull": run_pull, "sandbox": run_sandbox, "ttl": run_ttl}[call.name]
    try:
        await handler(call.args, host)
    except (SandboxGone, SandboxNotFound, ServerUnavailable, CellFailure):
        raise
    except InvalidRequest as exc:
        raise CellFailure("InvalidRequest", f"%{call.name}: {exc.message}") from None
    except SandboxError as exc:
        raise CellFailure(type(exc).__name__, f"%{call.name}: {exc.message}") from None
    except OSError as exc:
        raise CellFailure(
            type(exc).__name__, f"%{call.name}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
        ) from None


# --------------------------------------------------------------------------- completion


def magic_name_matches(code: str, cursor_pos: int) -> list[str]:
    """Our magic names that complete the `%word` at the cursor, to add to the sandbox's
    own magic completions (IPython there knows `%pushd`, not `%push`)."""
    line_start = code.rfind("\n", 0, cursor_pos) + 1
    line = code[line_start:cursor_pos]
    if not re.fullmatch(r"%\w*", line):
        return []
    return [f"%{m}" for m in MAGICS if f"%{m}".startswith(line)]


def push_path_completions(code: str, cursor_pos: int, root: pathlib.Path) -> dict[str, t.Any] | None:
    """Local paths for the first argument of `%push`, which the sandbox cannot see: only
    paths inside the airlock root, the only ones `%push` accepts.

    None when the cursor is elsewhere, so that the sandbox answers.
    """
    line_start = code.rfind("\n", 0, cursor_pos) + 1
    line = code[line_start:cursor_pos]
    if not re.match(r"%push\s", line):
        return None
    tokens = line[len("%push") :].split()
    ends_with_space = line[-1].isspace()
    if len(tokens) > 1 or (tokens and ends_with_space):
        return None  # past the local path: the destination is the sandbox's business
    word = tokens[0] if tokens else ""
    matches = []
    if not word.startswith(("/", "~")) and ".." not in word.split("/"):
        for candidate in sorted(glob.glob(glob.escape(word) + "*", root_dir=root)):
            full = root / candidate
            matches.append(candidate + ("/" if full.is_dir() and not full.is_symlink() else ""))
    return {
        "matches": matches,
        "cursor_start": cursor_pos - len(word),
        "cursor_end": cursor_pos,
        "metadata": {},
        "status": "ok",
    }
