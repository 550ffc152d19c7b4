"""Reaching a directory one path component at a time, never following a link.

Both airlocks need it: the server's (sandbox/core/files.py), whose workspace is writable by
sandbox code that may plant symlinks, and the kernel's (kernel/airlock.py), whose
notebook folder may hold links out of it. Each component is opened with `O_NOFOLLOW`
relative to the fd of the one before, so a component that is, or turns into, a link is
refused rather than followed. The callers say what a refusal means to their users.
"""

from __future__ import annotations

import errno
import os
import stat
import typing as t

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Name = t.TypeVar("Name", str, bytes)


class ComponentRefused(Exception):
    """Component `index` of the path could not be entered: it is `missing` (and was not to
    be created), or it is a symlink or not a directory."""

    def __init__(self, index: int, missing: bool) -> None:
        super().__init__(index, missing)
        self.index = index
        self.missing = missing


def open_dir(
    root: str | os.PathLike,
    parts: t.Sequence[Name],
    *,
    make: t.Callable[[int, Name], None] | None = None,
    follow_root: bool = False,
) -> int:
    """An fd for the directory `root/parts…`, walked without following any link.

    A missing component is made by `make(parent_fd, name)` when given, else refused.
    `follow_root`: the root itself may be reached through a link (a user's own folder);
    below it, nothing is followed. Raises ComponentRefused.
    """
    fd = os.open(root, (DIR_FLAGS & ~os.O_NOFOLLOW) if follow_root else DIR_FLAGS)
    try:
        for index, part in enumerate(parts):
            try:
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if make is None:
                    raise ComponentRefused(index, missing=True) from None
                make(fd, part)
                next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ComponentRefused(index, missing=False) from None
                raise
            os.close(fd)
            fd = next_fd
        return fd
    except BaseException:
        os.close(fd)
        raise


class FileRefused(Exception):
    """The last component could not be opened as a regular file: `why` is "missing",
    "symlink" or "not_regular"."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def open_regular(dir_fd: int, name: Name) -> tuple[int, os.stat_result]:
    """An fd (non-blocking until the caller says otherwise, so a FIFO cannot hang the open)
    and the stat of the regular file `name` in `dir_fd`, never through a link.
    Raises FileRefused."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FileRefused("missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileRefused("symlink") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FileRefused("not_regular")
    return fd, st
