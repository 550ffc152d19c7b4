"""The airlock's host side: the only folder `%push` reads from and `%pull` writes to.

Cells may be written by a model, and `%pull` writes bytes the sandbox chose: so the magics
get no more of the host than one folder, the *airlock root* (the kernel's working
directory, which is the notebook's folder, unless an operator sets `airlock_root`).
The rules, the same as the server's for /workspace (sandbox/core/files.py):

- a local path is relative to the root: no absolute path, no `~`, no `..` component;
- the path is walked one component at a time with `O_NOFOLLOW`, each relative to the
  previous directory's fd: no symlink is ever followed, in the middle or at the end, so a
  link planted in the folder (by an earlier `%pull`, say) leads nowhere, dangling or not;
- only regular files are read;
- `%pull` writes a temporary file next to the target and links it into place, which fails
  if anything (a file, a dangling link) took the name meanwhile; an existing file is
  replaced only with `--force`, and never when it is not a regular file.

There is no switch that relaxes these rules, so they hold whatever the configuration,
with host cells on or off. A user who needs a file from elsewhere copies it into the
folder first, with their own tools and rights.
"""

from __future__ import annotations

import errno
import os
import pathlib
import secrets
import stat
import typing as t

from sandbox.common import nofollow

from .failure import CellFailure


class AirlockError(CellFailure):
    """A local path the airlock refuses; shown in the notebook as `ename: evalue`."""



def check_local(path: str, root: pathlib.Path, what: str) -> list[str]:
    """The components of a local path (relative to `root`), refusing any that could leave it.

    An empty list means the root itself. `what` names the magic, for the message.
    """
    where = f"paths are relative to {root}"
    if "\0" in path:
        raise AirlockError("ValueError", f"{what}: the path {path!r} contains a NUL byte")
    if path.startswith("~"):
        raise AirlockError("PermissionError", f"{what}: {path!r}: home-relative paths are not allowed; {where}")
    if path.startswith("/"):
        raise AirlockError("PermissionError", f"{what}: {path!r}: absolute paths are not allowed; {where}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise AirlockError("PermissionError", f"{what}: {path!r}: '..' is not allowed; {where}")
    return parts


def _shown(parts: t.Sequence[str]) -> str:
    return "/".join(parts) or "."


def open_dir(root: pathlib.Path, parts: t.Sequence[str], what: str, create: bool = False) -> int:
    """An fd for the directory `root/parts…`, reached without following any link below
    `root` (sandbox/common/nofollow.py)."""
    try:
        return nofollow.open_dir(root, parts, make=_make_dir if create else None, follow_root=True)
    except nofollow.ComponentRefused as exc:
        shown = _shown(parts[: exc.index + 1])
        if exc.missing:
            raise AirlockError("FileNotFoundError", f"{what}: no folder {shown!r} in {root}") from None
        raise AirlockError(
            "PermissionError", f"{what}: {shown!r} is a symlink or not a folder; links are never followed"
        ) from None


def _make_dir(parent_fd: int, name: str) -> None:
    os.mkdir(name, 0o777, dir_fd=parent_fd)


def kind(root: pathlib.Path, parts: t.Sequence[str], what: str) -> str | None:
    """'file', 'dir', 'symlink', 'other', or None if nothing is there (links not followed)."""
    if not parts:
        return "dir"
    try:
        dir_fd = open_dir(root, parts[:-1], what)
    except AirlockError as exc:
        if exc.ename == "FileNotFoundError":
            return None
        raise
    try:
        st = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(dir_fd)
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    return "file" if stat.S_ISREG(st.st_mode) else "other"


def open_for_read(root: pathlib.Path, parts: t.Sequence[str], what: str) -> t.BinaryIO:
    """The regular file `root/parts…`, opened without following any link."""
    if not parts:
        raise AirlockError("IsADirectoryError", f"{what}: {root} is a folder, not a file")
    dir_fd = open_dir(root, parts[:-1], what)
    try:
        fd, _ = nofollow.open_regular(dir_fd, parts[-1])
    except nofollow.FileRefused as refused:
        raise AirlockError(*{
            "missing": ("FileNotFoundError", f"{what}: no file {_shown(parts)!r} in {root}"),
            "symlink": ("PermissionError", f"{what}: {_shown(parts)!r} is a symlink; links are never followed"),
            "not_regular": ("PermissionError", f"{what}: {_shown(parts)!r} is not a regular file"),
        }[refused.why]) from None
    finally:
        os.close(dir_fd)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def walk_files(root: pathlib.Path, parts: t.Sequence[str], what: str) -> tuple[list[list[str]], list[str]]:
    """The regular files under the folder `root/parts…` (sorted, as component lists) and
    what was skipped (symlinks, special files): nothing is followed."""
    files: list[list[str]] = []
    skipped: list[str] = []
    top = open_dir(root, parts, what)
    try:
        for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            base = [p for p in dirpath.split("/") if p not in ("", ".")]
            for name in list(dirnames):
                if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                    dirnames.remove(name)
                    skipped.append(_shown([*parts, *base, name]))
            dirnames.sort()
            for name in sorted(filenames):
                mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
                if stat.S_ISREG(mode):
                    files.append([*parts, *base, name])
                else:
                    skipped.append(_shown([*parts, *base, name]))
    finally:
        os.close(top)
    return files, skipped


class Writer:
    """A new file at `root/parts…`, written to a temporary name and put in place only when
    complete, so a failed transfer leaves what was there before.

        with Writer(root, parts, force, "%pull") as f:
            f.write(...)
    """

    def __init__(self, root: pathlib.Path, parts: t.Sequence[str], force: bool, what: str) -> None:
        if not parts:
            raise AirlockError("IsADirectoryError", f"{what}: {root} is a folder; name a file")
        self.root, self.parts, self.force, self.what = root, list(parts), force, what
        self.name = self.parts[-1]
        self.dir_fd: int | None = None
        self.tmp: str | None = None
        self.file: t.BinaryIO | None = None

    def _check_existing(self) -> None:
        assert self.dir_fd is not None
        try:
            st = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        shown = _shown(self.parts)
        if stat.S_ISLNK(st.st_mode):
            raise AirlockError("PermissionError", f"{self.what}: {shown!r} is a symlink; links are never written through")
        if not stat.S_ISREG(st.st_mode):
            raise AirlockError("PermissionError", f"{self.what}: {shown!r} exists and is not a regular file")
        if not self.force:
            raise AirlockError("FileExistsError", f"{self.what}: {shown!r} exists; add --force to replace it")

    def __enter__(self) -> t.BinaryIO:
        self.dir_fd = open_dir(self.root, self.parts[:-1], self.what, create=True)
        try:
            self._check_existing()
            self.tmp = f".{self.name[:200]}.{secrets.token_hex(4)}.part"
            fd = os.open(
                self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=self.dir_fd
            )
        except BaseException:
            os.close(self.dir_fd)
            raise
        self.file = os.fdopen(fd, "wb")
        return self.file

    def _place(self) -> None:
        assert self.dir_fd is not None and self.tmp is not None
        if self.force:
            self._check_existing()
            os.rename(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            return
        try:
            # link(2) never replaces: if anything took the name since the check, it fails.
            os.link(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
        except FileExistsError:
            raise AirlockError("FileExistsError", f"{self.what}: {_shown(self.parts)!r} exists; add --force to replace it") from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            # A filesystem without hard links: check, then rename.
            self._check_existing()
            os.rename(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            return
        os.unlink(self.tmp, dir_fd=self.dir_fd)

    def __exit__(self, exc_type: t.Any, *rest: t.Any) -> None:
        assert self.file is not None and self.dir_fd is not None
        try:
            self.file.close()
            if exc_type is None:
                self._place()
                self.tmp = None
        finally:
            if self.tmp is not None:
                try:
                    os.unlink(self.tmp, dir_fd=self.dir_fd)
                except FileNotFoundError:
                    pass
            os.close(self.dir_fd)
