"""The airlock magics, run by the kernel and never sent to the sandbox.

The sandbox has no network and cannot see the notebook's files; `%push` and `%pull` are
the only doors, and they are opened from outside. `%sandbox` and `%ttl` show what the
user cannot see from inside: where their code runs, under which limits, and for how long.

    %push LOCAL [DEST]     upload local files (globs, directories) into /workspace
    %pull [--force] REMOTE [LOCAL]
                           download files (globs) from /workspace
    %sandbox               the sandbox's id, state, TTL, limits, isolation and egress policy
    %ttl                   time left; `%ttl renew [SECONDS]` pushes expiry back

Magic lines come first in a cell, any number of them, followed by code. Any other `%` or
`%%` magic is IPython's and runs in the sandbox.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import pathlib
import posixpath
import re
import shlex
import time
import typing as t
import uuid
from dataclasses import dataclass

from sandbox.client import AsyncSandbox, InvalidRequest, SandboxError, SandboxGone, SandboxNotFound, ServerUnavailable

from . import airlock
from .airlock import AirlockError
from .failure import CellFailure
from .outputs import format_bytes, format_duration

MAGICS = ("push", "pull", "sandbox", "ttl")
_MAGIC_LINE = re.compile(r"^%(push|pull|sandbox|ttl)(?:\s+(.*))?$")
# Transfers at least this big get a progress bar; smaller ones are over before it would draw.
PROGRESS_MIN_BYTES = 4 * 1024 * 1024
PROGRESS_INTERVAL = 0.2

HELP = {
    "push": "%push LOCAL [DEST]: upload files (globs like data/*.csv, folders) from the notebook's folder into /workspace",
    "pull": "%pull [--force] REMOTE [LOCAL]: download files (globs like out/*.png) from /workspace into the "
    "notebook's folder; --force replaces existing files",
    "sandbox": "%sandbox: show the sandbox's id, state, TTL, limits, isolation and egress policy",
    "ttl": "%ttl: show the time left; %ttl renew: restart the countdown at the current TTL; "
           "%ttl extend SECONDS: expire that far from now, once (the TTL each cell renews to is unchanged); "
           "%ttl set SECONDS: change the TTL each cell renews to",
}


@dataclass(frozen=True)
class MagicCall:
    name: str
    args: list[str]
    line: str


class MagicHost(t.Protocol):
    """What a magic needs from the kernel."""

    cwd: pathlib.Path
    airlock_root: pathlib.Path  # the only host folder %push reads and %pull writes (see airlock)
    outputs_mode: str
    pushed: list[str]
    server_url: str

    async def sandbox(self) -> AsyncSandbox: ...

    def stdout(self, text: str) -> None: ...

    def display(self, data: dict[str, t.Any], *, display_id: str, update: bool = False) -> None: ...


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


# --------------------------------------------------------------------------- progress


class TransferProgress:
    """A tqdm-style bar in a display that updates in place; called from any thread.

    Small transfers draw nothing: the summary line printed afterwards says it all.
    """

    def __init__(self, host: MagicHost, label: str, min_bytes: int = PROGRESS_MIN_BYTES) -> None:
        self.host = host
        self.label = label
        self.min_bytes = min_bytes
        self.display_id = f"sandbox-transfer-{uuid.uuid4().hex}"
        self.started = time.monotonic()
        self.shown = False
        self.last = 0.0

    def render(self, done: int, total: int | None) -> str:
        from tqdm import tqdm

        return tqdm.format_meter(
            done,
            total,
            time.monotonic() - self.started,
            prefix=self.label,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            ncols=100,
        )

    def __call__(self, done: int, total: int | None) -> None:
        big = (total or done) >= self.min_bytes
        if not big:
            return
        now = time.monotonic()
        finished = total is not None and done >= total
        if self.shown and not finished and now - self.last < PROGRESS_INTERVAL:
            return
        self.host.display({"text/plain": self.render(done, total)}, display_id=self.display_id, update=self.shown)
        self.shown = True
        self.last = now


# --------------------------------------------------------------------------- paths


def _has_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _clean_remote(path: str) -> str:
    """A workspace-relative spelling of a remote path (the server judges its validity)."""
    path = path.strip()
    if path in ("/workspace", "/workspace/"):
        return ""
    if path.startswith("/workspace/"):
        path = path[len("/workspace/") :]
    return path


def _remote_join(*parts: str) -> str:
    joined = posixpath.join(*[p for p in parts if p])
    return posixpath.normpath(joined) if joined else joined


def push_plan(
    pattern: str, dest: str | None, root: pathlib.Path
) -> tuple[list[tuple[list[str], str]], list[str]]:
    """(local path components under `root`, workspace path) pairs for `%push pattern [dest]`,
    and what was skipped (symlinks, special files: the airlock follows no link).

    Local paths stay inside the airlock root (see `airlock`). Without a destination a path
    keeps its shape (`data/a.csv` lands at `/workspace/data/a.csv`, so the same code reads
    it in both places). With one, a single file goes to `dest` unless `dest` ends with `/`;
    several files, or a folder, go under `dest`.
    """
    parts = airlock.check_local(pattern, root, "%push")
    rel = "/".join(parts)
    skipped: list[str] = []
    if _has_glob(rel):
        found: list[list[str]] = []
        for match in sorted(glob.glob(rel, root_dir=root, recursive=True)):
            mparts = [p for p in match.split("/") if p not in ("", ".")]
            try:
                kind = airlock.kind(root, mparts, "%push")
            except AirlockError:  # reached through a symlinked folder
                skipped.append(match)
                continue
            if kind in ("file", "dir"):
                found.append(mparts)
            else:
                skipped.append(match)
        matches = found
    else:
        kind = airlock.kind(root, parts, "%push")
        if kind in ("symlink", "other"):
            raise CellFailure("PermissionError", f"%push: {rel!r} is a symlink or not a regular file; links are never followed")
        matches = [parts] if kind is not None else []
    if not matches:
        why = f" (skipped: {', '.join(skipped)})" if skipped else ""
        raise CellFailure("FileNotFoundError", f"%push: nothing matches {pattern!r} in {root}{why}")

    dest_clean = _clean_remote(dest) if dest is not None else None
    single_file = len(matches) == 1 and airlock.kind(root, matches[0], "%push") == "file"
    plan: list[tuple[list[str], str]] = []
    for mparts in matches:
        name = mparts[-1] if mparts else root.name
        if dest_clean is None:
            base = "/".join(mparts)
        elif single_file and not dest.endswith("/"):  # type: ignore[union-attr]
            base = dest_clean
        else:
            base = _remote_join(dest_clean, name)
        if airlock.kind(root, mparts, "%push") == "dir":
            files, inner_skipped = airlock.walk_files(root, mparts, "%push")
            skipped.extend(inner_skipped)
            plan.extend((f, _remote_join(base, "/".join(f[len(mparts) :]))) for f in files)
        else:
            plan.append((mparts, _remote_join(base)))
    if not plan:
        raise CellFailure("FileNotFoundError", f"%push: {pattern!r} matches no regular file")
    return plan, skipped


def _segments_match(pattern: str, path: str) -> bool:
    """Glob match segment by segment: `*` stays within a directory, `**` spans any number."""
    pat = [p for p in pattern.split("/") if p]
    parts = [p for p in path.split("/") if p]

    def walk(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(parts)
        if pat[i] == "**":
            return any(walk(i + 1, k) for k in range(j, len(parts) + 1))
        return j < len(parts) and fnmatch.fnmatchcase(parts[j], pat[i]) and walk(i + 1, j + 1)

    return walk(0, 0)


def local_target(remote: str, local: str | None, root: pathlib.Path, many: bool) -> list[str]:
    """Where a pulled file lands, as path components under the airlock root. File names
    come from the sandbox, which is untrusted: a name that would leave the chosen folder
    is refused; the local part obeys the airlock's rules (see `airlock`)."""
    pure = pathlib.PurePosixPath(remote)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        raise CellFailure("ValueError", f"%pull: refusing the sandbox's path {remote!r}")
    if local is None:
        return list(pure.parts)
    base = airlock.check_local(local, root, "%pull")
    if many or local.endswith("/") or not base or airlock.kind(root, base, "%pull") == "dir":
        return [*base, pure.name]
    return base


# --------------------------------------------------------------------------- running


async def run_magic(call: MagicCall, host: MagicHost) -> None:
    """Run one magic; CellFailure for what the user can fix, SandboxGone and
    ServerUnavailable left to the kernel, which knows how to recover from them."""
    handler = {"push": _push, "pull": _pull, "sandbox": _sandbox, "ttl": _ttl}[call.name]
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


async def _push(args: list[str], host: MagicHost) -> None:
    if not 1 <= len(args) <= 2:
        raise CellFailure("UsageError", HELP["push"])
    root = host.airlock_root
    plan, skipped = push_plan(args[0], args[1] if len(args) == 2 else None, root)
    for name in skipped:
        host.stdout(f"skipped {name}: a symlink or special file (the airlock follows no link)\n")
    sbx = await host.sandbox()
    total = 0
    for parts, remote in plan:
        progress = TransferProgress(host, remote)
        with airlock.open_for_read(root, parts, "%push") as source:
            local_size = os.fstat(source.fileno()).st_size
            result = await sbx.files.write(remote, source, progress=progress)
        size = result.get("size", local_size) if isinstance(result, dict) else local_size
        stored = result.get("path", remote) if isinstance(result, dict) else remote
        total += size or 0
        if stored not in host.pushed:
            host.pushed.append(stored)
        host.stdout(f"pushed {'/'.join(parts)} → /workspace/{stored} ({format_bytes(size)})\n")
    if len(plan) > 1:
        host.stdout(f"{len(plan)} files, {format_bytes(total)}\n")


async def _pull(args: list[str], host: MagicHost) -> None:
    force = "--force" in args
    args = [a for a in args if a != "--force"]
    if not 1 <= len(args) <= 2:
        raise CellFailure("UsageError", HELP["pull"])
    remote = _clean_remote(args[0])
    local = args[1] if len(args) == 2 else None
    root = host.airlock_root
    if local is not None:
        airlock.check_local(local, root, "%pull")  # refused before anything is downloaded
    sbx = await host.sandbox()
    if _has_glob(remote):
        # Listed names are escaped (a byte that is not UTF-8 or a control byte as \xHH, a
        # backslash as \\): the glob matches that spelling, which the download takes back.
        listing = await sbx.files.list()
        names = [f.path for f in listing if f.type == "file" and _segments_match(remote, f.path)]
        if getattr(listing, "truncated", False):
            host.stdout(f"%pull: the workspace listing stopped at {listing.limit} entries; "
                        "files past that are not matched\n")
        if not names:
            raise CellFailure("FileNotFoundError", f"%pull: nothing in /workspace matches {args[0]!r}")
        many = True
    else:
        names = [remote]
        many = False
    total = 0
    for name in sorted(names):
        target = local_target(name, local, root, many)
        try:
            with airlock.Writer(root, target, force, "%pull") as sink:
                size = await sbx.files.download(name, sink, progress=TransferProgress(host, name))
        except SandboxNotFound as exc:
            # 404 is also the answer for an unknown sandbox: if that is what it meant,
            # refresh raises it again and the kernel replaces the sandbox.
            await sbx.refresh()
            raise CellFailure("FileNotFoundError", f"%pull: /workspace/{name}: {exc.message}") from None
        total += size
        host.stdout(f"pulled /workspace/{name} → {'/'.join(target)} ({format_bytes(size)})\n")
    if len(names) > 1:
        host.stdout(f"{len(names)} files, {format_bytes(total)}\n")


def _when(value: t.Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "?"


def ttl_line(info: t.Any) -> str:
    left = info.ttl_left()
    parts = [f"{format_duration(left)} left" if left is not None else "unknown"]
    if info.ttl_seconds:
        parts.append(f"renewed to {format_duration(info.ttl_seconds)} by each cell")
    parts.append(f"expires {_when(info.expires_at)}")
    if info.max_expires_at is not None:
        parts.append(f"hard cap {_when(info.max_expires_at)}")
    return ", ".join(parts)


def describe_isolation(iso: dict[str, t.Any]) -> list[str]:
    """The isolation the server reports, a few facts a line: what confines the code,
    what enforces each limit, what the code can reach."""
    lines = []
    backend = iso.get("backend")
    first = []
    if backend:
        version = iso.get(f"{backend}_version")
        first.append(f"{backend} {version}" if version else str(backend))
    if "seccomp" in iso:
        first.append("seccomp on" if iso["seccomp"] else "seccomp OFF")
    if iso.get("user_namespace"):
        first.append("own user namespace")
    if iso.get("host_uid") is not None:
        first.append(f"host uid {iso['host_uid']}")
    elif "host_uid" in iso:  # a server not run as root: weaker, and said so
        first.append("runs as your own uid (no uid of its own: the server is not root)")
    if first:
        lines.append(", ".join(first))
    enforced = [f"{k} by {iso[k]}" for k in ("memory", "pids", "cpu") if iso.get(k)]
    if enforced:
        lines.append("limits enforced: " + ", ".join(enforced))
    reach = [f"{k}: {iso[k]}" for k in ("network", "disk") if iso.get(k)]
    if reach:
        lines.append("; ".join(reach))
    shown = {"backend", f"{backend}_version", "seccomp", "user_namespace", "host_uid", "memory", "pids", "cpu"}
    shown |= {"network", "disk", "cgroup", "cgroup_detail"}
    lines.extend(f"{k}: {v}" for k, v in iso.items() if k not in shown)
    return lines


def describe_egress(egress: dict[str, t.Any] | None) -> list[str]:
    """The egress policy in force, as the server reports it: what the sandbox may reach,
    which secrets it holds as placeholders, and what it has used of its budgets."""
    if not egress:
        return ["none: no network at all"]
    policy, usage = egress.get("policy") or {}, egress.get("usage") or {}
    reach = list(policy.get("allow") or [])
    if policy.get("pip"):
        reach.append("the package index (" + ", ".join(policy.get("pip_hosts") or []) + ")")
    lines = [f"only {', '.join(reach) or 'nothing'}, through {egress.get('proxy', 'the proxy')} (HTTP(S)_PROXY)"]
    if egress.get("secrets"):
        names = ", ".join(f"${name}" for name in egress["secrets"])
        lines.append(f"secrets as placeholders: {names} (the value only reaches their bound hosts)")
    lines.append(f"used {usage.get('requests', 0)} of {policy.get('max_requests', '?')} requests, "
                 f"{format_bytes(int(usage.get('bytes', 0)))} of {format_bytes(int(policy.get('max_bytes', 0)))}; "
                 f"{usage.get('refused', 0)} refused")
    return lines


def describe(
    info: t.Any, server_url: str, pushed: t.Sequence[str], outputs: str = "", airlock: str = ""
) -> str:
    """The `%sandbox` report: one fact a line, for people."""
    lim = info.limits
    limits = []
    if lim.memory_mb is not None:
        limits.append(f"memory {lim.memory_mb} MB")
    if lim.cpus is not None:
        limits.append(f"{lim.cpus:g} CPU")
    if lim.pids is not None:
        limits.append(f"{lim.pids} processes")
    if lim.disk_mb is not None:
        limits.append(f"disk {lim.disk_mb} MB")
    if lim.output_bytes is not None:
        limits.append(f"output {format_bytes(lim.output_bytes)} per cell")
    if lim.file_bytes is not None:
        limits.append(f"files up to {format_bytes(lim.file_bytes)}")
    iso_lines = describe_isolation(info.isolation or {})
    state = info.state + (f" ({info.dead_reason})" if info.dead_reason else "")
    rows = [
        ("sandbox", f"{info.id}"),
        ("state", state + (", running a cell" if info.executing else "")),
        ("image", f"{info.image or '?'}" + (" (from the warm pool)" if info.from_pool else "")),
        ("created", _when(info.created_at)),
        ("TTL", ttl_line(info)),
        ("limits", ", ".join(limits) or "server defaults"),
        ("isolation", iso_lines[0] if iso_lines else "not reported"),
        *[("", line) for line in iso_lines[1:]],
        *[("egress" if i == 0 else "", line) for i, line in enumerate(describe_egress((info.raw or {}).get("egress")))],
        ("cells run", str(info.execution_count)),
        ("pushed", ", ".join(pushed) if pushed else "nothing yet"),
        *([("airlock", airlock)] if airlock else []),
        *([("outputs", outputs)] if outputs else []),
        ("server", server_url),
    ]
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k:<{width}}  {v}\n" for k, v in rows)


async def _sandbox(args: list[str], host: MagicHost) -> None:
    if args:
        raise CellFailure("UsageError", HELP["sandbox"])
    sbx = await host.sandbox()
    info = await sbx.refresh()
    if host.airlock_root == host.cwd:
        where = "%push/%pull only inside the notebook's folder (the kernel's working directory)"
    else:
        where = f"%push/%pull only inside {host.airlock_root} (airlock_root)"
    host.stdout(describe(info, host.server_url, host.pushed, host.outputs_mode, where))


async def _ttl(args: list[str], host: MagicHost) -> None:
    sbx = await host.sandbox()
    if not args:
        info = await sbx.refresh()
        host.stdout(f"TTL: {ttl_line(info)}\n")
        return
    verb = args[0]
    if verb not in ("renew", "extend", "set") or len(args) > 2 or (verb != "renew" and len(args) != 2):
        raise CellFailure("UsageError", HELP["ttl"])
    seconds: int | None = None
    if len(args) == 2:
        try:
            seconds = int(args[1])
        except ValueError:
            raise CellFailure("UsageError", f"%ttl {verb}: {args[1]!r} is not a number of seconds") from None
    if verb == "extend":
        info = await sbx.renew(extend_seconds=seconds)
        host.stdout(f"extended once to {format_duration(seconds)} from now (each cell still renews to "
                    f"{format_duration(info.ttl_seconds or 0)}). TTL: {ttl_line(info)}\n")
    elif seconds is not None:  # `set N`, and `renew N` as it always meant
        info = await sbx.renew(seconds)
        host.stdout(f"TTL set to {format_duration(seconds)}: this and every later cell renew expiry to "
                    f"{format_duration(seconds)} ahead (to push expiry back once instead: %ttl extend SECONDS). "
                    f"TTL: {ttl_line(info)}\n")
    else:
        info = await sbx.renew()
        host.stdout(f"renewed. TTL: {ttl_line(info)}\n")


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
