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
import os
import secrets
import shutil
import stat
from datetime import datetime, timezone

from .errors import ApiError

CHUNK = 1024 * 1024
MAX_LIST = 10000


def check_path(path: str) -> list[str]:
    """Split a workspace-relative path, refusing anything that could leave the workspace."""
    if not path or "\0" in path:
        raise ApiError(400, "invalid_path", "the path is empty or contains a NUL byte")
    if path.startswith("/"):
        raise ApiError(400, "invalid_path", f"absolute paths are not allowed ({path!r}); paths are relative to /workspace")
    if len(path.encode("utf-8", "surrogateescape")) > 4096:
        raise ApiError(400, "invalid_path", "the path is longer than 4096 bytes")
    parts = [p for p in path.split("/") if p not in ("",)]
    for part in parts:
        if part in (".", ".."):
            raise ApiError(400, "invalid_path", f"'..' and '.' are not allowed in paths ({path!r})")
        if len(part.encode("utf-8", "surrogateescape")) > 255:
            raise ApiError(400, "invalid_path", "a path component is longer than 255 bytes")
    if not parts:
        raise ApiError(400, "invalid_path", "the path names no file")
    return parts


def _open_dir(root: str, parts: list[str], create: bool, owner: int | None) -> int:
    """An fd for the directory ``root/parts...``, walked without following any link."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts:
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise ApiError(404, "not_found", f"no directory {part!r} in the workspace") from None
                os.mkdir(part, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(part, owner, owner, dir_fd=fd, follow_symlinks=False)
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ApiError(400, "invalid_path", f"{part!r} is a symlink or not a directory; links are never followed") from None
                raise
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


class Workspace:
    def __init__(self, root: str, owner: int | None, max_bytes: int):
        self.root = root
        self.owner = owner
        self.max_bytes = max_bytes

    async def write(self, path: str, chunks) -> dict:
        parts = check_path(path)
        dir_fd = _open_dir(self.root, parts[:-1], create=True, owner=self.owner)
        name = parts[-1]
        tmp = f".upload-{secrets.token_hex(6)}"
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
        return {"path": "/".join(parts), "size": size}

    def open_for_read(self, path: str) -> tuple[int, int]:
        parts = check_path(path)
        dir_fd = _open_dir(self.root, parts[:-1], create=False, owner=None)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            raise ApiError(404, "not_found", f"no file {path!r} in the workspace") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ApiError(400, "invalid_path", f"{path!r} is a symlink; links are never followed") from None
            raise
        finally:
            os.close(dir_fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ApiError(400, "invalid_path", f"{path!r} is not a regular file")
        return fd, st.st_size

    async def read_chunks(self, fd: int):
        try:
            while True:
                chunk = await asyncio.to_thread(os.read, fd, CHUNK)
                if not chunk:
                    return
                yield chunk
        finally:
            os.close(fd)

    def list(self) -> list[dict]:
        out: list[dict] = []
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._walk(root_fd, "", out)
        finally:
            os.close(root_fd)
        return out

    def _walk(self, fd: int, prefix: str, out: list[dict]) -> None:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if len(out) >= MAX_LIST:
                return
            if entry.name.startswith(".upload-"):
                continue
            st = entry.stat(follow_symlinks=False)
            kind = "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else \
                "symlink" if stat.S_ISLNK(st.st_mode) else "other"
            rel = prefix + entry.name
            out.append({"path": rel, "size": st.st_size if kind == "file" else 0, "type": kind,
                        "modified": datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")})
            if kind == "directory":
                try:
                    sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError:
                    continue
                try:
                    self._walk(sub, rel + "/", out)
                finally:
                    os.close(sub)

    def delete(self, path: str) -> dict:
        parts = check_path(path)
        dir_fd = _open_dir(self.root, parts[:-1], create=False, owner=None)
        try:
            try:
                st = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise ApiError(404, "not_found", f"no file {path!r} in the workspace") from None
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(parts[-1], dir_fd=dir_fd)
            else:
                os.unlink(parts[-1], dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        return {"path": "/".join(parts), "deleted": True}
