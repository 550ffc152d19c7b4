"""Where the service keeps its state, and the layout inside it.

state/
  token                  bearer token (0600), needed on TCP only
  server.sock            the server's unix socket (0600: only its owner connects)
  server.json            the running server's pid, socket and TCP address if any
  images/NAME/           built images (read-only once image.json exists)
                         venv/ and its read-only ext4 pack venv.ext4 (venv.mnt: its mount)
  images/_python/TAG/    the interpreter copy, its pack TAG.ext4 (TAG.mnt: its mount)
  runtime/HASH/          the in-sandbox runtime, copied where sandbox uids can read it
  sandboxes/ID/          one per sandbox (0711): spec.json, state.json, control.sock (0600),
                         supervisor.log, workspace/ (owned by the sandbox's uid, 0700)

When the server runs as root, sandboxes run as unprivileged uids that must be able to reach
images and workspaces, so root's default is /var/lib/sandbox-kernel rather than a path
under /root (which is 0700).
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass

SOCKET_NAME = "server.sock"
ROOTS_STATE_DIR = "/var/lib/sandbox-kernel"


def default_state_dir() -> str:
    env = os.environ.get("SANDBOX_KERNEL_STATE_DIR", "").strip()
    if env:
        return os.path.abspath(os.path.expanduser(env))
    if os.geteuid() == 0:
        return ROOTS_STATE_DIR
    return users_own_state_dir()


def system_state_dir() -> str:
    """Where a host's system server (root's ``serve --multi-user``) keeps its state: root's
    default, or ``SANDBOX_KERNEL_SYSTEM_STATE_DIR`` where the administrator put it elsewhere.
    Users' commands and kernels look for it there (sandbox/service/endpoint.py)."""
    env = os.environ.get("SANDBOX_KERNEL_SYSTEM_STATE_DIR", "").strip()
    return os.path.abspath(os.path.expanduser(env)) if env else ROOTS_STATE_DIR


def accepts(path: str) -> bool:
    """Whether something listens on the unix socket ``path`` (a connect, no request)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def system_server_socket() -> str | None:
    """The host's system server's socket when one runs: in ``system_state_dir()``, root's and
    open to every user (what ``serve --multi-user`` makes; a root server for root alone is
    0600, and is nobody else's), accepting a connection."""
    path = os.path.join(system_state_dir(), SOCKET_NAME)
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o006 != 0o006:
        return None
    return path if accepts(path) else None


def reached_state_dir() -> str:
    """The state directory whose server a client reaches with nothing explicit (no URL, no
    state directory given): the default, or for an ordinary user whose own server is not
    running, the host's system server's when one runs (sandbox/service/endpoint.py's rule
    3). Standard library only: ``logs`` runs where httpx may not be."""
    own = default_state_dir()
    if os.geteuid() != 0 and not os.environ.get("SANDBOX_KERNEL_STATE_DIR", "").strip() \
            and not accepts(os.path.join(own, SOCKET_NAME)):
        found = system_server_socket()
        if found:
            return os.path.dirname(found)
    return own


def users_own_state_dir() -> str:
    """An ordinary user's own state directory, whatever server they use: where the embedded
    default's server keeps its state, and where a client of a shared system server keeps
    what is the user's alone (a notebook's binding to its sandbox)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(base, "sandbox-kernel")


@dataclass(frozen=True)
class StateDir:
    root: str

    @classmethod
    def default(cls) -> "StateDir":
        return cls(default_state_dir())

    @property
    def token_file(self) -> str:
        return os.path.join(self.root, "token")

    @property
    def server_file(self) -> str:
        return os.path.join(self.root, "server.json")

    @property
    def socket_file(self) -> str:
        """Where this state directory's server listens: every client on this machine finds
        the server of a state directory here, and only that one (see sandbox/service/endpoint.py)."""
        return os.path.join(self.root, SOCKET_NAME)

    @property
    def images(self) -> str:
        return os.path.join(self.root, "images")

    @property
    def runtimes(self) -> str:
        return os.path.join(self.root, "runtime")

    @property
    def sandboxes(self) -> str:
        return os.path.join(self.root, "sandboxes")

    @property
    def saves(self) -> str:
        """Namespaces saved by value, per owner (sandbox/core/saves.py)."""
        return os.path.join(self.root, "saves")

    def sandbox(self, sandbox_id: str) -> str:
        return os.path.join(self.sandboxes, sandbox_id)

    def ensure(self) -> None:
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        os.chmod(self.root, 0o711)
        for d, mode in ((self.images, 0o755), (self.runtimes, 0o755), (self.sandboxes, 0o711)):
            os.makedirs(d, mode=mode, exist_ok=True)
            os.chmod(d, mode)


def world_reachable(path: str) -> str | None:
    """The first ancestor of ``path`` another uid cannot search, or None if all can."""
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        ancestor = os.sep.join(parts[:i]) or "/"
        try:
            if not os.stat(ancestor).st_mode & 0o001:
                return ancestor
        except FileNotFoundError:
            return None
    return None


# The sandbox directory reaches its supervisor in the environment, not on its command line:
# any local user reads every process's argv (ps), only the same uid reads its environment.
SUPERVISOR_DIR_ENV = "SANDBOX_SUPERVISOR_DIR"
SUPERVISOR_MODULE = "sandbox.supervisor"
SUPERVISOR_TEMPLATE_MODULE = "sandbox.supervisor.template"  # a forked supervisor's command line is the template's
SUPERVISOR_LOG = "supervisor.log"  # in the sandbox's directory: the supervisor's stdout and stderr
SUPERVISOR_TEMPLATE_LOG = "supervisor-template.log"  # in the state directory: the template's


def is_supervisor_of(pid: int | None, sandbox_dir: str) -> bool:
    """Whether ``pid`` is this sandbox's supervisor (a pid from a state file may have been
    reused by any process since): its command line names the supervisor, and either its
    environment (which only the server's user reads) names the sandbox directory, or its
    stdout is the sandbox's ``supervisor.log`` (a supervisor forked by the template, whose
    environment block is the template's); one started by an older server named the
    directory on its command line."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    if not any(m.encode() in cmd for m in (SUPERVISOR_MODULE, SUPERVISOR_TEMPLATE_MODULE)):
        return False
    if sandbox_dir.encode() in cmd or f"{SUPERVISOR_DIR_ENV}={sandbox_dir}".encode() in env:
        return True
    log, expected = supervisor_log_of(pid), os.path.join(sandbox_dir, SUPERVISOR_LOG)
    return bool(log) and (log == expected or log == os.path.realpath(expected))


def supervisor_log_of(pid: int) -> str:
    """The file a process's stdout is (a supervisor's: its sandbox's log), or ''."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return ""


def open_private_log(path: str):
    """A log for appending, readable by the server's user only (0600, also when an older
    server left it 0644): a supervisor's and a runtime's logs name sandboxes and hold their
    diagnostics."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")
