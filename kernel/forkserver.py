"""`python -P -m kernel.forkserver SOCKET`: one process that has imported a kernel, and forks one per launch.

Every kernel has a process on the host, and about 25 MiB of each is the same imported code
(the Jupyter protocol stack, IPython's package, httpx, our client). Here that code is
imported once, `gc.freeze()` moves the imported objects out of the collector's reach (a
collection would otherwise write to every object's header and unshare its page), and each
kernel is a `fork()` of this clean template: the pages stay shared copy-on-write, and PSS
splits them over all kernels. The provisioner (kernel/fork_provisioner.py) starts one per
user and interpreter, and talks to it over kernel/fork_wire.py.

Nothing here may start a thread, a zmq context or an event loop before a fork: a child
would inherit a lock held by a thread that does not exist in it. The server checks that it
is alone before each fork, and refuses to fork otherwise (the provisioner then launches
the kernel the plain way). It never runs a kernel's code itself, so no child inherits
anything of another kernel.

The child becomes what `python -P -m kernel ARGS` would be: a new session, the default
signal handlers, the launch's stdio, environment and working directory, then
`kernel/__main__.py` run as `__main__` (its working-directory check first), and the
interpreter's normal exit. The server reaps it and writes its exit status back on the
launch's connection. It ends when the process that started it is gone and it has no
children, or after `--idle` seconds without children.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import os
import select
import signal
import socket
import sys
import threading
import time
import typing as t
from dataclasses import dataclass

from .fork_wire import STDIO_FDS, Channel, WireError, peer_uid

#: How long a new connection may take to send its launch request.
REQUEST_TIMEOUT = 10.0
#: How often the loop looks at its parent and its idle time when nothing happens.
TICK = 1.0


def peer_allowed(conn: socket.socket) -> bool:
    """Only this user may ask for a kernel: a fork runs as us, with the argv and the
    environment the request names (a launch is code execution)."""
    return peer_uid(conn) == os.getuid()


#: What a kernel imports only once it runs (its first HTTP request, ipykernel's start-up),
#: found by listing a running kernel's modules against this server's: imported here too,
#: so that they are shared as well. None of them starts a thread or a loop on import.
LATER = ("httpcore", "httpcore._async", "httpcore._sync", "httpcore._backends.anyio", "h11", "anyio",
         "anyio._backends._asyncio", "anyio.streams.memory", "anyio.streams.stapled", "anyio.streams.tls",
         "anyio.to_thread", "sniffio", "certifi", "psutil", "IPython.core.debugger", "tornado.gen",
         "tornado.platform.asyncio", "concurrent.futures.thread", "faulthandler", "kernel.safe_path", "runpy",
         "resource")


def preload() -> None:
    """Import what every kernel process imports, as `python -P -m kernel` would."""
    import importlib

    from sandbox.common.lean_imports import HTTPX_COMMAND_LINE, leave_out

    leave_out(HTTPX_COMMAND_LINE)  # before the first import of httpx, as kernel/__main__.py does
    import kernel.app  # noqa: F401  (ipykernel, jupyter_client, zmq, tornado, traitlets, our kernel)
    import sandbox.client  # noqa: F401  (httpx: what the kernel opens at start)
    from sandbox.service.endpoint import plain_http_context

    # The SSL context every kernel's HTTP client is given (none speaks TLS to its server):
    # made in a kernel, the first context set up OpenSSL's tables there, about 4 MiB of it.
    plain_http_context()

    for name in LATER:
        try:
            importlib.import_module(name)
        except ImportError:  # another version's layout: the kernel imports what it needs itself
            pass


@dataclass
class Launch:
    """What a child runs: the kernel's arguments after `-m kernel`, its environment and folder."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


def _launch_of(request: dict[str, t.Any]) -> Launch:
    argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        raise WireError("argv: a list of strings expected")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise WireError("env: an object of strings expected")
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        raise WireError(f"cwd: no such directory: {cwd!r}")
    return Launch(argv, env, cwd)


class ForkServer:
    """The accept-fork-reap loop. `serve()` returns None in the server when it ends, and a
    `Launch` in each child, which has already dropped everything of the server's."""

    def __init__(self, path: str, idle_seconds: float) -> None:
        self.path = path
        self.idle_seconds = idle_seconds
        self.parent = os.getppid()
        self.children: dict[int, Channel | None] = {}  # None: its launcher went away
        self.lock = open(path + ".lock", "a")  # noqa: SIM115 (held for the server's life)
        self.listener: socket.socket | None = None
        self.wake_r, self.wake_w = os.pipe()

    def claim(self) -> bool:
        """Whether this process is the one server of its socket (another may be starting)."""
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def listen(self) -> None:
        try:
            os.unlink(self.path)  # a socket left by a server that died: the lock says none serves it
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.listener.bind(self.path)
        finally:
            os.umask(old)
        self.listener.listen(64)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears it

    def serve(self) -> Launch | None:
        assert self.listener is not None
        idle_since = time.monotonic()
        while True:
            conns = [ch for ch in self.children.values() if ch is not None]
            try:
                readable, _, _ = select.select([self.listener, self.wake_r, *conns], [], [], TICK)
            except InterruptedError:
                readable = []
            if self.wake_r in readable:
                os.read(self.wake_r, 4096)
            self.reap()
            for pid, ch in list(self.children.items()):
                if ch is not None and ch in readable and self._closed(ch):
                    self.children[pid] = None
            if self.listener in readable:
                launch = self.accept()
                if launch is not None:
                    return launch
            if self.children:
                idle_since = time.monotonic()
            elif os.getppid() != self.parent or time.monotonic() - idle_since > self.idle_seconds:
                self.close()
                return None

    def accept(self) -> Launch | None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return None
        if not peer_allowed(conn):
            print(f"sandbox kernel fork server: refused a connection from uid {peer_uid(conn)}", file=sys.stderr,
                  flush=True)
            conn.close()
            return None
        ch = Channel(conn)
        try:
            request = ch.receive(timeout=REQUEST_TIMEOUT)
            if request is None:
                raise WireError("no launch request")
            launch = _launch_of(request)
            if len(ch.fds) != STDIO_FDS:
                raise WireError(f"{STDIO_FDS} file descriptors expected (stdin, stdout, stderr), got {len(ch.fds)}")
            if threading.active_count() != 1:
                raise WireError("the fork server has a thread: it cannot fork safely")
        except (WireError, EOFError, OSError) as exc:
            try:
                ch.send({"error": str(exc)})
            except OSError:
                pass
            ch.close()
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_child(ch)
            return launch
        ch.close_fds()
        try:
            ch.send({"pid": pid})
        except OSError:
            pass  # the launcher is gone; the child is still reaped
        self.children[pid] = ch
        return None

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ch = self.children.pop(pid, None)
            if ch is not None:
                try:
                    ch.send({"exit": os.waitstatus_to_exitcode(status)})
                except OSError:
                    pass
                ch.close()

    @staticmethod
    def _closed(ch: Channel) -> bool:
        """Whether the launcher closed its end (it ended, or let the kernel go): the child
        lives on, watched by its own parent watch (kernel/app.py); only its status has
        nobody to go to. A launcher says nothing more after its request."""
        try:
            ch.receive(timeout=0)
            return False
        except (EOFError, WireError, OSError):
            ch.close()
            return True

    def _become_child(self, ch: Channel) -> None:
        """Drop everything of the server's: its socket, lock, pipes and connections, the
        handlers it set; take the launch's stdio, in a session of its own."""
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for other in self.children.values():
            if other is not None:
                other.close()
        self.children.clear()
        assert self.listener is not None
        self.listener.close()
        self.lock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        for target, fd in enumerate(ch.fds):
            os.dup2(fd, target)
        ch.close()

    def close(self) -> None:
        """Stop listening, and remove the socket if it is still ours."""
        if self.listener is None:
            return
        try:
            ours = os.stat(self.path).st_ino == os.fstat(self.listener.fileno()).st_ino
        except OSError:
            ours = False
        self.listener.close()
        self.listener = None
        if ours:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def take_environment(env: dict[str, str]) -> None:
    """Make this process's environment `env`, touching only what differs from the fork
    server's. A launch's environment is mostly the server's own (the server started with
    the first launch's), and clearing it all to set it again made about 0.45 MiB of each
    kernel its own memory (every entry of os.environ and of the C environment rewritten)."""
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def run_kernel(launch: Launch) -> None:
    """Be `python -P -m kernel ARGV` in `launch.cwd` with `launch.env`."""
    import runpy

    take_environment(launch.env)
    try:
        os.chdir(launch.cwd)
    except OSError as exc:
        print(f"sandbox kernel: cannot enter {launch.cwd}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    import kernel

    sys.argv = [os.path.join(os.path.dirname(kernel.__file__), "__main__.py"), *launch.argv]
    runpy.run_module("kernel", run_name="__main__", alter_sys=True)


def main(argv: t.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel.forkserver",
                                     description="Fork pre-imported sandbox kernels (started by the kernel provisioner).")
    parser.add_argument("socket", help="the Unix socket to listen on (its folder must be the user's own)")
    parser.add_argument("--idle", type=float, default=600.0, help="end after this many seconds without a kernel")
    args = parser.parse_args(argv)
    try:
        server = ForkServer(args.socket, args.idle)
        if not server.claim():
            return 0  # another server of this socket is starting or running: the launcher connects to it
    except OSError as exc:
        print(f"sandbox kernel fork server: cannot use {args.socket}: {exc}", file=sys.stderr, flush=True)
        return 1
    # As the gc module's documentation advises for a forking server: no collection while
    # importing (it would free objects and leave holes in pages, which the children's first
    # allocations then fill, unsharing the page), everything frozen before the first fork,
    # and the collector on again in each child.
    gc.disable()
    preload()
    gc.freeze()
    try:
        server.listen()
    except OSError as exc:  # a path too long for a Unix socket, a full disk
        print(f"sandbox kernel fork server: cannot listen on {args.socket}: {exc}", file=sys.stderr, flush=True)
        return 1
    launch = server.serve()
    if launch is None:
        return 0
    gc.enable()
    run_kernel(launch)  # in a child only
    return 0


if __name__ == "__main__":
    sys.exit(main())
