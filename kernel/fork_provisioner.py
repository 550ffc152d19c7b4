"""The kernel provisioner that forks kernels from one pre-imported process (jupyter_client's extension point).

kernel.json names it (`metadata.kernel_provisioner.provisioner_name`: "sandbox-fork",
registered in pyproject.toml's `jupyter_client.kernel_provisioners`). On a launch whose
command is `PYTHON [FLAGS] -m kernel ARGS`, it asks the fork server of that interpreter,
flags and Python environment (kernel/forkserver.py) for a kernel, starting the server on
first use; the kernel is then a fork of a process that has already imported everything,
and shares those pages with every other kernel of the server. Everything else
(connection file, ports, interrupt, restart, shutdown) is LocalProvisioner's, working on a
Popen-like handle (kernel/forked_kernel.py).

A kernel always starts: when the fork server cannot start or answer, the launch is
LocalProvisioner's plain one, with one warning in the log. `SANDBOX_KERNEL_FORK=0` in the
kernel's environment (the server's, or the kernelspec's `env`) turns the fork server off.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import time
import typing as t

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Float

from .fork_wire import WireError
from .forked_kernel import ForkedKernel

NAME = "sandbox-fork"
OFF = "SANDBOX_KERNEL_FORK"
_FOLDER = "sandbox-kernel-fork"
#: What a launch may carry for a fork: anything else (a Popen argument of a caller's
#: own) is for a plain launch.
_FORKABLE = {"env", "cwd", "stdin", "stdout", "stderr", "independent", "kernel_id", "extra_arguments"}


class ForkUnavailable(Exception):
    """The fork server cannot give this launch a kernel (the reason says why)."""


def split_command(cmd: t.Sequence[str]) -> tuple[list[str], list[str]] | None:
    """`PYTHON [FLAGS] -m kernel ARGS` -> ([PYTHON, FLAGS...], ARGS); None for any other command."""
    for i in range(1, len(cmd) - 1):
        if cmd[i] == "-m" and cmd[i + 1] == "kernel":
            flags = cmd[1:i]
            if all(f.startswith("-") and f != "-c" for f in flags):
                return list(cmd[:i]), list(cmd[i + 2:])
            return None
    return None


def safe_path(flags: t.Sequence[str], env: dict[str, str]) -> bool:
    """Whether the interpreter keeps the working directory off `sys.path` (`-P`, or `-I`,
    which implies it, or PYTHONSAFEPATH). Without it `python -m kernel` imports from the
    notebook's folder first (and kernel/safe_path.py refuses to run): a fork of a server
    that imported from elsewhere would not be that process, so such a launch is a plain one.
    So is one with a relative entry on PYTHONPATH ('.'): the plain kernel refuses it, saying why."""
    clustered = [f[1:] for f in flags if f.startswith("-") and not f.startswith("--")]
    pythonpath = env.get("PYTHONPATH", "")
    relative = [e for e in pythonpath.split(os.pathsep) if not os.path.isabs(e)] if pythonpath else []
    return (any("P" in f or "I" in f for f in clustered) or bool(env.get("PYTHONSAFEPATH"))) and not relative


def server_folder() -> pathlib.Path:
    """This user's folder of fork-server sockets, 0700 ($XDG_RUNTIME_DIR, else Jupyter's runtime dir)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base:
        from jupyter_core.paths import jupyter_runtime_dir

        base = jupyter_runtime_dir()
    folder = pathlib.Path(base) / _FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ForkUnavailable(f"{folder} is not a folder of this user's alone (mode {oct(st.st_mode)}, uid {st.st_uid})")
    return folder


#: Variables read when a module is imported (so in the fork server, not in each kernel):
#: a launch with other values gets a fork server of its own.
_IMPORT_TIME_PREFIXES = ("PYTHON", "LD_")
_IMPORT_TIME = ("JUPYTER_ALLOW_INSECURE_WRITES", "PYZMQ_BACKEND", "TORNADO_EXTENSION", "TORNADO_NO_EXTENSION",
                "IPYTHON_SUPPRESS_CONFIG_ERRORS", "TRAITLETS_APPLICATION_RAISE_CONFIG_FILE_ERROR")


def placement() -> list[str]:
    """Where this process runs: its namespaces, its cgroups and its root. A forked kernel
    runs where its fork server does, not where its launcher does; so a launch from another
    mount or network namespace or cgroup (`unshare -m` with a state directory bound over
    the default one, `ip netns exec`, a spawner's cgroup) gets a fork server of its own,
    started there. (A kernel forked from a server in another mount namespace ran in that
    one, saw another state directory and started a second sandbox server.)"""
    found = []
    for ns in ("mnt", "net", "pid", "user", "ipc", "uts", "cgroup"):
        try:
            found.append(os.readlink(f"/proc/self/ns/{ns}"))
        except OSError:
            found.append("")
    try:
        found.append(pathlib.Path("/proc/self/cgroup").read_text())
    except OSError:
        found.append("")
    root = os.stat("/")
    found.append(f"{root.st_dev}:{root.st_ino}")
    return found


def server_key(interpreter: list[str], env: dict[str, str]) -> str:
    """One fork server per interpreter, flags and what decides the imports a server holds:
    the variables read at import (`_IMPORT_TIME`), and the version of this code (a server
    started before an upgrade or an edit must not fork the old code); and per placement
    (`placement`: the namespaces, cgroups and root its kernels run in)."""
    python = [[k, v] for k, v in sorted(env.items()) if k.startswith(_IMPORT_TIME_PREFIXES) or k in _IMPORT_TIME]
    here = pathlib.Path(__file__).parent
    newest = max((p.stat().st_mtime_ns for p in here.glob("*.py")), default=0)
    text = json.dumps([interpreter, python, str(here), newest, placement()])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class ForkProvisioner(LocalProvisioner):  # type: ignore[misc]
    """LocalProvisioner whose kernels are forks of a pre-imported fork server."""

    idle_timeout = Float(600.0, help="Seconds a fork server with no kernel lives on (kernelspec "
                                     "metadata.kernel_provisioner.config.idle_timeout)").tag(config=True)
    start_timeout = Float(60.0, help="Seconds to wait for a new fork server to listen before a plain "
                                     "launch").tag(config=True)

    async def launch_kernel(self, cmd: list[str], **kwargs: t.Any) -> KernelConnectionInfo:
        try:
            self.process = await self._fork(cmd, kwargs)
        except ForkUnavailable as exc:
            self.log.warning("sandbox kernel: launching without the fork server: %s", exc)
            return await super().launch_kernel(cmd, **kwargs)
        self.pid = self.process.pid
        self.pgid = self.process.pid  # the child's first act is setsid()
        self.cwd = kwargs.get("cwd", pathlib.Path.cwd())
        return self.connection_info

    async def _fork(self, cmd: list[str], kwargs: dict[str, t.Any]) -> ForkedKernel:
        env = dict(kwargs.get("env") if kwargs.get("env") is not None else os.environ)
        if env.get(OFF, "1") == "0":
            raise ForkUnavailable(f"{OFF}=0")
        split = split_command(cmd)
        if split is None:
            raise ForkUnavailable(f"not a `python -m kernel` command: {cmd!r}")
        if set(kwargs) - _FORKABLE:
            raise ForkUnavailable(f"launch options a fork cannot honour: {sorted(set(kwargs) - _FORKABLE)}")
        interpreter, args = split
        if not safe_path(interpreter[1:], env):
            raise ForkUnavailable(f"the interpreter runs without -P: {cmd!r}")
        found = shutil.which(os.path.expanduser(interpreter[0]), path=env.get("PATH", os.defpath))
        if not found:
            raise ForkUnavailable(f"no interpreter {interpreter[0]!r}")
        interpreter = [os.path.abspath(found), *interpreter[1:]]
        if not kwargs.get("independent"):
            env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client's launcher sets it
        cwd = str(kwargs.get("cwd") or os.getcwd())
        with _Stdio(kwargs) as stdio:
            try:
                path = str(server_folder() / f"{server_key(interpreter, env)}.sock")
            except OSError as exc:
                raise ForkUnavailable(f"no folder for its socket: {exc}") from None
            return await self._launch_on(path, interpreter, env, [os.path.expanduser(a) for a in args], cwd, stdio)

    async def _launch_on(self, path: str, interpreter: list[str], env: dict[str, str], args: list[str], cwd: str,
                         stdio: list[int]) -> ForkedKernel:
        """Launch on the live server at `path`, or start one and launch there (twice: a
        server that was ending as we connected gets one successor)."""
        why = ""
        for _attempt in range(2):
            try:
                return ForkedKernel.launch(path, args, env, cwd, stdio, timeout=self.start_timeout)
            except (OSError, WireError) as exc:
                why = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, WireError) and "refused the launch" in str(exc):
                    break
            await self._start_server(path, interpreter, env)
        raise ForkUnavailable(f"the fork server at {path} did not give a kernel ({why})")

    async def _start_server(self, path: str, interpreter: list[str], env: dict[str, str]) -> None:
        """Start a fork server for `path` and wait until it listens (or says it cannot)."""
        server_env = {k: v for k, v in env.items() if not k.startswith("JPY_")}
        try:
            proc = subprocess.Popen(
                [*interpreter, "-m", "kernel.forkserver", path, "--idle", str(self.idle_timeout)],
                env=server_env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            raise ForkUnavailable(f"cannot start the fork server: {exc}") from None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if os.path.exists(path) and _answers(path):
                _reap_later(proc)
                return
            code = proc.poll()
            if code not in (None, 0):
                raise ForkUnavailable(f"the fork server exited with status {code} (its reason is in this log)")
            await asyncio.sleep(0.05)
        _reap_later(proc)
        raise ForkUnavailable(f"the fork server did not listen within {self.start_timeout:g} s")


def _answers(path: str) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


_STARTED: list[subprocess.Popen] = []


def _reap_later(proc: subprocess.Popen) -> None:
    """Keep the fork server's Popen, so that its exit is reaped (no zombie) at the next start."""
    _STARTED[:] = [p for p in _STARTED if p.poll() is None]
    _STARTED.append(proc)


class _Stdio:
    """The kernel's stdin, stdout and stderr as descriptors to send: what the launch names
    (a file, a descriptor, DEVNULL), else this process's own, as a Popen child inherits
    them; stdin /dev/null (jupyter_client gives a plain kernel a closed pipe)."""

    def __init__(self, kwargs: dict[str, t.Any]) -> None:
        self.kwargs = kwargs
        self.opened: list[int] = []

    def __enter__(self) -> list[int]:
        fds = []
        for name, default in (("stdin", None), ("stdout", 1), ("stderr", 2)):
            value = self.kwargs.get(name)
            if value is None and default is not None:
                fds.append(default)
            elif value is None or value == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                self.opened.append(fd)
                fds.append(fd)
            elif isinstance(value, int) and value >= 0:
                fds.append(value)
            elif hasattr(value, "fileno"):
                fds.append(value.fileno())
            else:
                self.__exit__()
                raise ForkUnavailable(f"{name}={value!r} (a pipe) needs a plain launch")
        return fds

    def __exit__(self, *_: t.Any) -> None:
        for fd in self.opened:
            os.close(fd)
        self.opened = []
