"""``python -m sandbox.supervisor.template``: one process, started by the server, that has
imported everything a supervisor runs and forks each sandbox's supervisor from there.

Why: a supervisor started as ``python -m sandbox.supervisor`` spends its first 0.2-0.9 s
starting an interpreter and importing asyncio and our code, on every create the warm pool
does not serve, every gVisor resume and every by-value wake; and it holds those modules in
memory of its own (about 13.7 MiB PSS per idle sandbox). A fork from a process that already
holds them starts at once and shares their pages copy-on-write; ``gc.freeze()`` keeps the
children's collector from walking (and so copying) them.

The template runs as the server's user, with the environment and working directory a
supervisor gets (``core.launcher.supervisor_env``), in a session of its own. Its stdin is
its end of a socket pair whose other end only the server holds (no path another user could
connect to). Each request is one datagram: the sandbox directory and the supervisor's
extra arguments as JSON, with the ready pipe and the log passed as file descriptors
(SCM_RIGHTS). The template forks, the child makes itself what a freshly started supervisor
is (``_become_supervisor``), and the template answers with the child's pid once the child
holds only its own descriptors. It starts no thread and no event loop: only the children
do, after the fork. It ends when the server's end closes (the server stopped or died); the
supervisors it forked run on, each in its own session, and the kernel reaps them (SIGCHLD
ignored), so none is left a zombie.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
from typing import Callable, NoReturn

from ..common.paths import SUPERVISOR_DIR_ENV, SUPERVISOR_TEMPLATE_MODULE

MODULE = SUPERVISOR_TEMPLATE_MODULE
REQUEST_BYTES = 64 * 1024  # a sandbox directory and a few flags
# The ready pipe and the supervisor's log; anything else a request carries is refused.
FDS_PER_REQUEST = 2


class TemplateError(RuntimeError):
    """The template could not fork a supervisor (it said why, or it is gone)."""


# ------------------------------------------------------------------ the server's side
def ask_fork(sock: socket.socket, sandbox_dir: str, ready_fd: int, log_fd: int, args: list[str]) -> int:
    """Ask the template on ``sock`` for a supervisor of ``sandbox_dir``; its pid.

    Blocking (the server calls it off its event loop, one request at a time). Raises
    TemplateError, or OSError (the template is gone, or the socket timed out)."""
    request = json.dumps({"dir": sandbox_dir, "args": list(args)}).encode()
    socket.send_fds(sock, [request], [ready_fd, log_fd])
    reply = sock.recv(REQUEST_BYTES)
    if not reply:
        raise TemplateError("the supervisor template exited")
    try:
        answer = json.loads(reply)
    except ValueError:
        raise TemplateError(f"the supervisor template said: {reply[:200]!r}") from None
    if not isinstance(answer.get("pid"), int):
        raise TemplateError(f"the supervisor template could not fork: {answer.get('error') or answer}")
    return answer["pid"]


# ------------------------------------------------------------- the template's side
def serve(sock: socket.socket, run: Callable[[list[str]], None]) -> None:
    """Fork a supervisor for each request on ``sock`` until the server's end closes;
    ``run`` is the supervisor's ``main(argv)``."""
    while True:
        try:
            request, fds, _, _ = socket.recv_fds(sock, REQUEST_BYTES, FDS_PER_REQUEST + 1)
        except InterruptedError:
            continue
        except OSError:  # the server's end is gone (reset): as an orderly close
            return
        if not request:
            for fd in fds:
                os.close(fd)
            return
        try:
            reply = {"pid": _fork_one(sock, request, fds, run)}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:  # the child has its own copies; the next child must not get these
                os.close(fd)
        sock.send(json.dumps(reply).encode())


def _fork_one(sock: socket.socket, request: bytes, fds: list[int], run: Callable[[list[str]], None]) -> int:
    message = json.loads(request)
    sandbox_dir, args = message["dir"], [str(a) for a in message["args"]]
    if not isinstance(sandbox_dir, str) or len(fds) != FDS_PER_REQUEST:
        raise ValueError(f"a request carries a sandbox directory and {FDS_PER_REQUEST} descriptors")
    ready_fd, log_fd = fds
    # The child says when its descriptors are its own: until then its pid would not yet
    # look like this sandbox's supervisor (paths.is_supervisor_of reads its log on fd 1).
    settled_r, settled_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(settled_r)
        _become_supervisor(sock, sandbox_dir, ready_fd, log_fd, settled_w, ["--ready-fd", str(ready_fd), *args], run)
    os.close(settled_w)
    try:
        os.read(settled_r, 1)  # b"." once settled; b"" if it died first (its ready pipe then says so)
    finally:
        os.close(settled_r)
    return pid


def _become_supervisor(sock: socket.socket, sandbox_dir: str, ready_fd: int, log_fd: int, settled_fd: int,
                       argv: list[str], run: Callable[[list[str]], None]) -> NoReturn:
    """In the forked child: what ``subprocess.Popen(..., start_new_session=True)`` and a new
    interpreter would have given a supervisor (its own session, default signal handling,
    stdin /dev/null, the log on stdout and stderr, no descriptor but the ready pipe and the
    settle pipe, ``SUPERVISOR_DIR_ENV`` set), then the supervisor's main. Never returns."""
    code = 1
    try:
        sock.close()  # the object's own close: a bare os.close would leave it to close the number again
        os.setsid()
        gc.enable()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        keep = sorted({0, 1, 2, ready_fd, settled_fd})
        for low, high in zip(keep, keep[1:] + [os.sysconf("SC_OPEN_MAX")]):
            os.closerange(low + 1, high)
        os.set_inheritable(ready_fd, True)  # as Popen's pass_fds left it
        os.environ[SUPERVISOR_DIR_ENV] = sandbox_dir
        sys.argv = [sys.argv[0], *argv]
        os.write(settled_fd, b".")
        os.close(settled_fd)
        run(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def prepare_children() -> None:
    """Do here, once, what every supervisor would otherwise do for itself after the fork.

    A page of the template's that a child only reads stays shared; what a child imports or
    builds itself is its own, for its whole life. Measured in a child that builds a filter
    and runs one ``asyncio.to_thread`` (its private dirty pages): 5.1 MiB; 4.0 with the
    seccomp filter a bubblewrap sandbox gets (libseccomp, through ctypes) built here; 3.4
    with the modules of the thread pool its blocking calls run on imported here too. And
    making its command line's parser in the child was 1.3 MiB (0.4 to parse with one made
    here). Both filters are built here (`seccomp.build_filter` keeps them; a child only
    copies the bytes into its memfd); where libseccomp cannot be used, each supervisor finds
    that out and says so, as before."""
    import concurrent.futures.thread  # noqa: F401  (asyncio.to_thread's pool)
    import queue  # noqa: F401

    from ..isolation import seccomp
    from . import __main__ as entry

    entry.command_line().parse_args(["--ready-fd", "0"])  # the parser, and what parsing compiles
    for inet in (False, True):
        try:
            seccomp.build_filter(inet)
        except (ImportError, RuntimeError, OSError, ValueError, AttributeError):
            break
    from ..isolation import gvisor

    gvisor.discover()  # runsc's version, which a gVisor spawn or restore asks for (kept per binary)


def main() -> None:
    """Import what a supervisor runs, freeze it, and serve the server's requests on stdin."""
    # No collection while importing: one frees objects between the modules' own, and the
    # children's new objects would fill those holes, copying the pages (gc.freeze's advice).
    gc.disable()
    sock = socket.socket(fileno=0)
    # After the socket is fd 0's owner, /dev/null takes fd 0 in every child (_become_supervisor).
    from . import __main__ as entry  # leaves out ssl before asyncio, as a supervisor does

    # Both backends' modules, which a supervisor imports when it reads its spec: in the
    # template they are paid for once, shared by every child.
    from ..isolation.backends import bubblewrap, gvisor  # noqa: F401

    prepare_children()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it ends with the server's end of the socket, not a terminal's keys
    gc.freeze()  # the collector in the children never walks (so never writes to) what is here
    serve(sock, entry.main)


if __name__ == "__main__":
    main()
