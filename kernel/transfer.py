"""`%push` and `%pull`: the airlock's two doors, opened from outside the sandbox.

Local paths obey the airlock's rules (see `airlock`); names that come from the sandbox
are untrusted. Transfers big enough to take a while draw a progress bar in the cell.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import pathlib
import posixpath
import time
import uuid

from sandbox.client import AsyncSandbox, InvalidRequest, SandboxNotFound

from . import airlock, host_code
from .airlock import AirlockError
from .failure import CellFailure
from .magic_host import HELP, MagicHost
from .outputs import format_bytes

# Transfers at least this big get a progress bar; smaller ones are over before it would draw.
PROGRESS_MIN_BYTES = 4 * 1024 * 1024
PROGRESS_INTERVAL = 0.2


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



async def run_push(args: list[str], host: MagicHost) -> None:
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


async def run_pull(args: list[str], host: MagicHost) -> None:
    force = "--force" in args
    allow_code = host_code.ALLOW_FLAG in args
    args = [a for a in args if a not in ("--force", host_code.ALLOW_FLAG)]
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
    total, cap = 0, host.pull_max_bytes
    listed = sum(f.size or 0 for f in listing if f.path in names) if many else 0
    if listed > cap:
        raise CellFailure("OSError", f"%pull: the {len(names)} matching files are {format_bytes(listed)} (apparent "
                          f"size), more than one %pull may write ({format_bytes(cap)}, pull_max_bytes); "
                          "nothing was written")
    plan = _without_host_code([(name, local_target(name, local, root, many)) for name in sorted(names)],
                              allow_code, host)
    for name, target in plan:
        size = await _pull_one(sbx, name, airlock.Writer(root, target, force, "%pull"), host, cap - total)
        total += size
        host.stdout(f"pulled /workspace/{name} → {'/'.join(target)} ({format_bytes(size)})\n")
    if len(plan) > 1:
        host.stdout(f"{len(plan)} files, {format_bytes(total)}\n")


def _without_host_code(plan: list[tuple[str, list[str]]], allow_code: bool,
                       host: MagicHost) -> list[tuple[str, list[str]]]:
    """The (remote name, local target) pairs to write: a target a host program would run,
    import or read as config (`host_code`) only with --allow-code. One such file is refused;
    a glob skips them, naming each and why, and is refused only when nothing else is left."""
    if allow_code:
        return plan
    kept, refused = [], []
    for name, target in plan:
        reason = host_code.why_host_code(target)
        if reason is None:
            kept.append((name, target))
        else:
            refused.append(("/".join(target), reason))
    if len(plan) == 1 and refused:
        raise CellFailure("PermissionError", host_code.refusal(*refused[0]))
    for shown, reason in refused:
        host.stdout(f"skipped {shown}: {reason} (add {host_code.ALLOW_FLAG} to pull it)\n")
    if not kept:
        raise CellFailure("PermissionError", f"%pull: every matching file is one a host program would run or "
                          f"import; nothing was written (add {host_code.ALLOW_FLAG} to pull them)")
    return kept


async def _pull_one(sbx: AsyncSandbox, name: str, writer: airlock.Writer, host: MagicHost, room: int) -> int:
    """Download one file through ``writer``, at most ``room`` bytes counted as they come (a
    sparse file's apparent size is what would be written); past it nothing is placed."""
    try:
        with writer as sink:
            return await sbx.files.download(name, sink, progress=TransferProgress(host, name), max_bytes=room)
    except SandboxNotFound as exc:
        # 404 is also the answer for an unknown sandbox: if that is what it meant,
        # refresh raises it again and the kernel replaces the sandbox.
        await sbx.refresh()
        raise CellFailure("FileNotFoundError", f"%pull: /workspace/{name}: {exc.message}") from None
    except InvalidRequest as exc:
        if exc.code != "too_large":
            raise
        raise CellFailure("OSError", f"%pull: /workspace/{name}: {exc.message} (pull_max_bytes "
                          f"{format_bytes(host.pull_max_bytes)} per %pull; file_max_bytes per file on the server); "
                          "nothing was written for it") from None
