"""The airlock: files in and out of a sandbox's /workspace, without trusting the sandbox.

The server runs as root and the workspace is writable by sandbox code, which may plant
symlinks, FIFOs or deep directory trees to trick it. So every path is checked lexically
(no absolute paths, no ``..``, no NUL), then walked one component at a time with
``O_NOFOLLOW`` relative to the previous directory's fd: no link is ever followed, and a
component that turns into a link between two requests is refused, not followed. Only
regular files are read; uploads go to a temporary file that replaces the target by rename,
so a failed upload leaves what was there before.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import secrets
import stat
import time
from datetime import datetime, timezone

from ..common import filenames, nofollow
from ..common.nofollow import DIR_FLAGS
from ..common.errors import ApiError

CHUNK = 1024 * 1024
DELETE_BATCH = 1000  # names read from a directory between two deletions
DELETE_SECONDS = 60.0  # a sandbox that keeps filling a directory cannot keep a delete going (file_delete_seconds)


def check_path(path: str) -> list[bytes]:
    """Split a workspace-relative path in its escaped spelling (see sandbox/common/filenames.py) into
    the names it stands for, refusing anything that could leave the workspace."""
    if not path:
        raise ApiError(400, "invalid_path", "the path is empty")
    try:
        raw = filenames.unescape(path)
    except ValueError as exc:
        raise ApiError(400, "invalid_path", f"{path!r} is not a valid escaped path: {exc}") from None
    if raw.startswith(b"/"):
        raise ApiError(400, "invalid_path", f"absolute paths are not allowed ({path!r}); paths are relative to /workspace")
    if b"\0" in raw:
        raise ApiError(400, "invalid_path", "the path contains a NUL byte")
    if len(raw) > 4096:
        raise ApiError(400, "invalid_path", "the path is longer than 4096 bytes")
    parts = [p for p in raw.split(b"/") if p]
    for part in parts:
        if part in (b".", b".."):
            raise ApiError(400, "invalid_path", f"'..' and '.' are not allowed in paths ({path!r})")
        if len(part) > 255:
            raise ApiError(400, "invalid_path", "a path component is longer than 255 bytes")
    if not parts:
        raise ApiError(400, "invalid_path", "the path names no file")
    return parts


def _open_dir(root: str, parts: list[bytes], create: bool, owner: int | None) -> int:
    """An fd for the directory ``root/parts...``, walked without following any link
    (sandbox/common/nofollow.py); made, and given to `owner`, where missing if `create`."""

    def make(parent_fd: int, name: bytes) -> None:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        if owner is not None:
            os.chown(name, owner, owner, dir_fd=parent_fd, follow_symlinks=False)

    try:
        return nofollow.open_dir(root, parts, make=make if create else None)
    except nofollow.ComponentRefused as exc:
        name = filenames.escape(parts[exc.index])
        if exc.missing:
            raise ApiError(404, "not_found", f"no directory {name!r} in the workspace") from None
        raise ApiError(400, "invalid_path", f"{name!r} is a symlink or not a directory; links are never followed") from None


class _OpenPath:
    """The directories from a walk's top down to where the walk is, holding few fds.

    Walks are iterative (a tree may be deeper than Python's recursion limit) and must not
    hold one fd per level (it may be deeper than the process may open files). So fds are
    kept for the last KEEP levels and for every STRIDE-th level; a level whose fd was
    closed is opened again when the walk comes back to it, by name, from the nearest open
    level above it, one O_NOFOLLOW step at a time like every other walk here: a sandbox
    that renames things meanwhile can make the walk miss a directory, never leave the tree.
    """

    KEEP = 32
    STRIDE = 32

    def __init__(self, top_fd: int):
        self.names: list[bytes] = [b""]
        self.fds: list[int | None] = [top_fd]  # the top's fd belongs to the caller

    @property
    def depth(self) -> int:
        return len(self.names) - 1

    def rel(self, name: bytes) -> bytes:
        return b"/".join(self.names[1:] + [name])

    def fd(self) -> int:
        level = base = self.depth
        while self.fds[base] is None:
            base -= 1
        for i in range(base + 1, level + 1):
            self.fds[i] = os.open(self.names[i], DIR_FLAGS, dir_fd=self.fds[i - 1])
        return self.fds[level]

    def enter(self, name: bytes) -> None:
        fd = os.open(name, DIR_FLAGS, dir_fd=self.fd())
        self.names.append(name)
        self.fds.append(fd)
        old = self.depth - self.KEEP
        if old > 0 and old % self.STRIDE and self.fds[old] is not None:
            os.close(self.fds[old])
            self.fds[old] = None

    def leave(self) -> bytes:
        name = self.names.pop()
        fd = self.fds.pop()
        if fd is not None:
            os.close(fd)
        return name

    def close(self) -> None:
        while self.depth:
            self.leave()


def _kind(st: os.stat_result) -> str:
    return ("directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else
            "symlink" if stat.S_ISLNK(st.st_mode) else "other")


class Workspace:
    def __init__(self, root: str, owner: int | None, max_bytes: int, delete_seconds: float = DELETE_SECONDS):
        self.root = root
        self.owner = owner
        self.max_bytes = max_bytes
        self.delete_seconds = delete_seconds

    async def write(self, path: str, chunks) -> dict:
        parts = check_path(path)
        dir_fd = _open_dir(self.root, parts[:-1], create=True, owner=self.owner)
        name = parts[-1]
        tmp = f".upload-{secrets.token_hex(6)}".encode()
        size = 0
        try:
            try:
                existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISREG(existing.st_mode):
                    raise ApiError(400, "invalid_path", f"{path!r} exists and is not a regular file")
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
            try:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ApiError(413, "too_large", f"the file is larger than the {self.max_bytes} byte limit for one file")
                    view = memoryview(chunk)
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
                if self.owner is not None:
                    os.fchown(fd, self.owner, self.owner)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise ApiError(507, "no_space", f"the sandbox's workspace is full ({os.strerror(exc.errno)})") from None
                raise
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            tmp = None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
            os.close(dir_fd)
        return {"path": filenames.escape(b"/".join(parts)), "size": size}

    def open_for_read(self, path: str) -> tuple[int, int]:
        """An fd of the regular file and its apparent size, refused (413) past ``max_bytes``:
        a sparse file of a terabyte uses no quota but would stream a terabyte of zeros."""
        parts = check_path(path)
        dir_fd = _open_dir(self.root, parts[:-1], create=False, owner=None)
        try:
            fd, st = nofollow.open_regular(dir_fd, parts[-1])
        except nofollow.FileRefused as refused:
            raise {
                "missing": ApiError(404, "not_found", f"no file {path!r} in the workspace"),
                "symlink": ApiError(400, "invalid_path", f"{path!r} is a symlink; links are never followed"),
                "not_regular": ApiError(400, "invalid_path", f"{path!r} is not a regular file"),
            }[refused.why] from None
        finally:
            os.close(dir_fd)
        if st.st_size > self.max_bytes:
            os.close(fd)
            raise ApiError(413, "too_large", f"{path!r} is {st.st_size} bytes (its apparent size; a sparse file counts "
                           f"whole), more than the {self.max_bytes} byte limit for one file (file_max_bytes)",
                           extra={"size": st.st_size, "limit": self.max_bytes})
        return fd, st.st_size

    @staticmethod
    async def read_chunks(fd: int, size: int, run=None):
        """The file's first ``size`` bytes (what was announced: a file the sandbox grows
        meanwhile is not read past it), each chunk read by ``run(os.read, fd, n)``."""
        run = run or asyncio.to_thread
        left = size
        try:
            while left > 0:
                chunk = await run(os.read, fd, min(CHUNK, left))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk
        finally:
            os.close(fd)

    def list(self, limit: int) -> dict:
        """Every entry under /workspace, depth first, each directory's names in byte order,
        paths escaped (sandbox/common/filenames.py). At most ``limit`` directory entries are read:
        past that the walk stops and ``truncated`` says so, so the cost of a listing does
        not grow with what the sandbox made."""
        out: list[dict] = []
        budget = [limit]
        truncated = False
        root_fd = os.open(self.root, DIR_FLAGS)
        walk = _OpenPath(root_fd)
        try:
            entries, cut = _read_dir(root_fd, budget)
            truncated |= cut
            pending = [entries]  # per level: the names still to list, last one first
            while pending:
                if not pending[-1]:
                    pending.pop()
                    if walk.depth:
                        walk.leave()
                    continue
                name, st = pending[-1].pop()
                kind = _kind(st)
                out.append({"path": filenames.escape(walk.rel(name)), "size": st.st_size if kind == "file" else 0,
                            "type": kind, "modified": _timestamp(st.st_mtime)})
                if kind != "directory":
                    continue
                try:
                    walk.enter(name)
                except OSError:  # replaced or removed meanwhile: listed, not entered
                    continue
                try:
                    entries, cut = _read_dir(walk.fd(), budget)
                except OSError:
                    walk.leave()
                    continue
                truncated |= cut
                pending.append(entries)
        finally:
            walk.close()
            os.close(root_fd)
        return {"files": out, "count": len(out), "truncated": truncated, "limit": limit}

    def delete(self, path: str) -> dict:
        parts = check_path(path)
        dir_fd = _open_dir(self.root, parts[:-1], create=False, owner=None)
        try:
            try:
                st = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise ApiError(404, "not_found", f"no file {path!r} in the workspace") from None
            try:
                if stat.S_ISDIR(st.st_mode):
                    _remove_tree(dir_fd, parts[-1], self.delete_seconds)
                else:
                    os.unlink(parts[-1], dir_fd=dir_fd)
            except OSError as exc:
                raise ApiError(409, "conflict", f"could not delete {path!r}: {exc.strerror}") from None
        finally:
            os.close(dir_fd)
        return {"path": filenames.escape(b"/".join(parts)), "deleted": True}


def _timestamp(mtime: float) -> str:
    return datetime.fromtimestamp(mtime, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _read_dir(fd: int, budget: list[int]) -> tuple[list[tuple[bytes, os.stat_result]], bool]:
    """(name, lstat) of a directory's entries, last in byte order first; reads at most
    ``budget[0]`` entries (and spends them), and says whether it had to stop early."""
    entries = []
    cut = False
    with os.scandir(fd) as it:
        for entry in it:
            if budget[0] <= 0:
                cut = True
                break
            budget[0] -= 1
            name = os.fsencode(entry.name)
            if name.startswith(b".upload-"):
                continue
            try:
                entries.append((name, entry.stat(follow_symlinks=False)))
            except OSError:
                continue  # gone meanwhile
    entries.sort(key=lambda e: e[0], reverse=True)
    return entries, cut


def _remove_tree(parent_fd: int, name: bytes, seconds: float = DELETE_SECONDS) -> None:
    """``rm -r`` of ``name`` in ``parent_fd``, iteratively and without following links.

    Each directory is read in batches; its files are unlinked as they are read and its
    subdirectories entered one after the other, then it is read again until it is empty.
    A sandbox still writing into the tree can only make this take longer, up to
    ``seconds``, after which the delete fails with what it could not remove.
    """
    deadline = time.monotonic() + seconds
    walk = _OpenPath(parent_fd)
    try:
        walk.enter(name)
        pending: list[list[bytes]] = [[]]  # per level: subdirectories to enter before reading it again
        while walk.depth:
            if time.monotonic() > deadline:
                raise OSError(errno.EBUSY, f"the sandbox kept adding files for {seconds:.0f} s")
            if pending[-1]:
                sub = pending[-1].pop()
                try:
                    walk.enter(sub)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    _unlink(walk.fd(), sub)  # it became a link or a file meanwhile
                    continue
                pending.append([])
                continue
            fd = walk.fd()
            read = 0
            with os.scandir(fd) as it:
                for entry in itertools.islice(it, DELETE_BATCH):
                    read += 1
                    entry_name = os.fsencode(entry.name)
                    if entry.is_dir(follow_symlinks=False):
                        pending[-1].append(entry_name)
                    else:
                        _unlink(fd, entry_name)
            if read:
                continue
            done = walk.leave()
            pending.pop()
            try:
                os.rmdir(done, dir_fd=walk.fd())
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY:
                    raise
                walk.enter(done)  # filled again meanwhile: read it again
                pending.append([])
    finally:
        walk.close()


def _unlink(dir_fd: int, name: bytes) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
