"""Which sandbox a notebook owns: notebook -> sandbox id, per user, in the user's state directory.

Jupyter Server starts a notebook's kernel with ``JPY_SESSION_NAME`` set to the notebook's
path; without it (nbclient, papermill, a console) a kernel binds nothing. A binding is a
small JSON file in ``<state_dir>/notebooks/`` (0700, the user's own), named by a hash of
the server, the isolation tier and the notebook's path: a notebook opened with another tier
or against another server has a sandbox of its own.

Which state directory: the server's when it is the user's own (the embedded default, a
state directory given), else the user's own default one (`bindings_dir`). A shared host's
system server keeps its state in root's directory, which a user cannot write: the bindings
of every user there would fail, and no notebook would keep its sandbox.

Two kernels on one notebook must never share its sandbox silently. The kernel that serves
the notebook holds an exclusive ``flock`` on the binding's lease file for its whole life:
the lock goes with the process, so a kernel that crashed or was killed (SIGKILL) leaves no
stale claim, and a second kernel on the same notebook cannot take it while the first lives.

Trust: the files are the user's own, written by the user's kernels; a malformed file is
ignored (the notebook then starts fresh), never an error that stops the kernel. The
sandbox id read back is only ever used as a path segment of a request to the user's own
server, which answers 404 for an id that is not the caller's.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import time
from dataclasses import asdict, dataclass

from sandbox.common.paths import users_own_state_dir

NOTEBOOKS_DIR = "notebooks"
SANDBOX_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class Binding:
    """What is kept of a notebook's sandbox between kernels."""

    notebook: str
    sandbox_id: str
    bound_at: float  # when this notebook first got the sandbox (epoch seconds)
    max_expires_at: str | None = None  # the sandbox's hard cap, for a note once the server forgot it
    kernel_pid: int | None = None  # the kernel that last held it


def bindings_dir(server_state_dir: pathlib.Path) -> pathlib.Path:
    """Where this user's notebook bindings for the server of `server_state_dir` live: in it
    when it is the user's (or not made yet: the user's server will make it), else in the
    user's own state directory."""
    try:
        owner = server_state_dir.stat().st_uid
    except OSError:
        return server_state_dir / NOTEBOOKS_DIR
    if owner == os.geteuid():
        return server_state_dir / NOTEBOOKS_DIR
    return pathlib.Path(users_own_state_dir()) / NOTEBOOKS_DIR


class NotebookLease:
    """One notebook's binding file and the lease that says a live kernel serves it."""

    def __init__(self, state_dir: pathlib.Path, notebook: str, server: str, tier: str) -> None:
        self.notebook = notebook
        self.dir = bindings_dir(state_dir)
        key = hashlib.sha256(f"{server}\0{tier}\0{notebook}".encode()).hexdigest()[:32]
        self.path = self.dir / f"{key}.json"
        self.lock_path = self.dir / f"{key}.lock"
        self._lock_fd: int | None = None

    # ------------------------------------------------------------------ the lease

    def acquire(self) -> int | None:
        """Take the lease; None on success, else the pid of the live kernel that holds it
        (0 when it cannot be told). Held until `release` or the process's end."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            return int(holder) if holder.isdigit() else 0
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd
        return None

    @property
    def held(self) -> bool:
        return self._lock_fd is not None

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    # ------------------------------------------------------------------ the binding

    def read(self) -> Binding | None:
        """The notebook's binding; None if there is none or it cannot be read."""
        binding = _load(self.path)
        if binding is None:
            return None
        if binding.notebook != self.notebook or not SANDBOX_ID.match(str(binding.sandbox_id)):
            return None
        return binding

    def write(self, sandbox_id: str, max_expires_at: str | None, bound_at: float | None = None) -> None:
        """Bind the notebook to `sandbox_id` (only the lease's holder writes)."""
        if not self.held:
            return
        binding = Binding(self.notebook, sandbox_id, bound_at or time.time(), max_expires_at, os.getpid())
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(binding), f)
        os.replace(tmp, self.path)

    def clear(self) -> None:
        if self.held:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def all_bindings(state_dir: pathlib.Path) -> list[tuple[Binding, pathlib.Path, bool]]:
    """Every notebook binding of the user: (binding, its file, whether a live kernel holds it)."""
    found = []
    for path in sorted(bindings_dir(state_dir).glob("*.json")):
        binding = _load(path)
        if binding is None:
            continue
        found.append((binding, path, _lease_held(path.with_suffix(".lock"))))
    return found


def _load(path: pathlib.Path) -> Binding | None:
    """A binding file as written by `NotebookLease.write`; None if unreadable or malformed."""
    try:
        data = json.loads(path.read_text())
        return Binding(**{k: data[k] for k in Binding.__dataclass_fields__ if k in data})
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _lease_held(lock_path: pathlib.Path) -> bool:
    """Whether some live process holds this lease (tried without taking it for long)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def unbind_elsewhere(state_dir: pathlib.Path, sandbox_id: str, keep: pathlib.Path | None) -> list[str]:
    """Remove other notebooks' bindings to `sandbox_id` (it has moved to the notebook whose
    binding is `keep`); the notebooks it was taken from."""
    moved = []
    for binding, path, _held in all_bindings(state_dir):
        if binding.sandbox_id == sandbox_id and path != keep:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            moved.append(binding.notebook)
    return moved


def holder_of(state_dir: pathlib.Path, sandbox_id: str, keep: pathlib.Path | None) -> str | None:
    """The notebook whose live kernel holds `sandbox_id`, other than `keep`'s; None if none."""
    for binding, path, held in all_bindings(state_dir):
        if binding.sandbox_id == sandbox_id and path != keep and held:
            return binding.notebook
    return None


def notebook_from_env() -> str | None:
    """The notebook this kernel serves, as Jupyter Server says (None outside one)."""
    name = os.environ.get("JPY_SESSION_NAME", "").strip()
    return name or None
