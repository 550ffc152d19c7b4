"""Starting the service: protections check, token, image, then uvicorn until SIGTERM.

The server listens on its state directory's unix socket (``STATE/server.sock``: 0600 for a
per-user server, 0666 for a ``--multi-user`` one, where each request is tied to the caller's
uid), and on TCP only when a port or host is given (the bearer token is needed there). One
server per state directory: a second one refuses to start while the first answers.

On SIGTERM (or Ctrl-C) the server stops accepting, ends running executes with a clear
``server_shutdown`` event, ends its warm pool's sandboxes (they hold nobody's state), and
leaves every other sandbox running under its supervisor for the next server to re-adopt
(unless ``--delete-on-shutdown``); it says which it kept.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import stat
import sys

import uvicorn

from ..core import descriptors
from ..isolation import doctor
from . import housekeeping
from ..common import statefile
from .api import build_app
from .auth import with_peer_credentials
from ..core.config import ServiceConfig
from .endpoint import EndpointError, unix
from .idle import Activity, stop_when_idle
from .refusal import config_refusal
from ..core.manager import SandboxManager
from ..common.paths import StateDir, world_reachable
from ..images.progress import BuildProgress

log = logging.getLogger("sandbox.service.server")


def ensure_token(state: StateDir, configured: str) -> str:
    if configured:
        return configured
    try:
        with open(state.token_file) as f:
            token = f.read().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    fd = os.open(state.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


class AlreadyServing(RuntimeError):
    """Another server answers on this state directory's socket."""


def bind_unix(path: str, mode: int) -> socket.socket:
    """Bind the state directory's socket with ``mode`` from the start (umask, not a chmod
    after the fact: no moment when others could connect). A stale socket left by a killed
    server is replaced; a live one means a server already serves this state directory."""
    unix(path)  # too long a path: a clear error rather than bind's "AF_UNIX path too long"
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        existing = None
    if existing is not None:
        if not stat.S_ISSOCK(existing.st_mode):
            raise AlreadyServing(f"{path} exists and is not a socket; remove it if it is stale")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)
        else:
            raise AlreadyServing(f"a sandbox server already listens on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o777 & ~mode)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, mode)
    # Listening at once: while the image builds, connections wait in the backlog, so a
    # second server's probe above sees this one instead of taking the socket over.
    sock.listen(2048)
    return sock


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def _http_protocol() -> type:
    """uvicorn's protocol class (httptools if installed, as its "auto"), wrapped to record
    each unix-socket connection's peer credentials."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as protocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as protocol
    return with_peer_credentials(protocol)


class _Server(uvicorn.Server):
    manager: SandboxManager

    def handle_exit(self, sig, frame):
        # Tell streaming executes first, so uvicorn's graceful wait is not spent on them.
        self.manager.shutting_down.set()
        super().handle_exit(sig, frame)

    def stop_now(self) -> None:
        """Stop as SIGTERM would, without a signal (the idle stop)."""
        self.manager.shutting_down.set()
        self.should_exit = True


def _protections(config: ServiceConfig, out) -> list[dict] | None:
    """The doctor's report, or None (after saying why) when a missing protection stops us."""
    items = doctor.report(config)
    missing = doctor.missing(items)
    if missing:
        out("protections missing on this host:\n" + doctor.format_report(missing))
        if not config.allow_missing_protections:
            out("refusing to start; run `sandbox-kernel doctor` for details, or pass "
                "--allow-missing-protections to run with weaker isolation anyway")
            return None
        out("WARNING: starting WITHOUT these protections (--allow-missing-protections)")
    return items


def _what_to_do_instead(config: ServiceConfig, state: StateDir) -> str:
    """The next step when this state directory's server runs already (``lab``'s embedded one,
    say): use it, or, when TCP was asked and it has none, stop it or serve another directory."""
    running = housekeeping.running_server(state)
    if running is None:
        return ""
    where = "" if state.root == StateDir.default().root else f" --state-dir {state.root}"
    if config.tcp is None or running.get("url"):
        also = f" and {running['url']}" if running.get("url") else ""
        return (f"{also} (pid {running['pid']}): use that one (sandbox-kernel ls{where}), "
                f"or stop it first (sandbox-kernel stop{where})")
    return (f" (pid {running['pid']}), on its socket only: for one on TCP too, stop it (sandbox-kernel "
            f"stop{where}) and run this again (kernels, `lab`'s too, then use this one), or serve another "
            "state directory (--state-dir DIR)")


def _listen_and_prepare(config: ServiceConfig, state: StateDir, items: list[dict], out):
    """Bind the sockets (before the image build: a second server for this state directory
    learns at once that there is one, and a kernel's socket is there to wait on), then
    prepare the manager. (listeners, TCP URL or None, manager), or None after saying why."""
    tcp = config.tcp
    try:
        listeners = [bind_unix(state.socket_file, 0o666 if config.multi_user else 0o600)]
    except AlreadyServing as exc:
        out(f"not starting: {exc}{_what_to_do_instead(config, state)}")
        return None
    except (EndpointError, OSError) as exc:
        out(f"not starting: {exc}")
        return None
    socket_inode = os.stat(state.socket_file).st_ino
    url = None
    try:
        if tcp is not None:
            listeners.append(bind_tcp(*tcp))
            url = f"http://{tcp[0]}:{tcp[1]}" if ":" not in tcp[0] else f"http://[{tcp[0]}]:{tcp[1]}"
        if config.metrics_port:  # /metrics alone, without the token, for a Prometheus on this host
            listeners.append(bind_tcp("127.0.0.1", config.metrics_port))
        manager = SandboxManager(config)
        manager.protections = items  # probed once: /v1/info must not spawn a bwrap per request
        with BuildProgress(sys.stderr) as progress:  # steps only in a log: the kernel shows its last line
            manager.prepare(progress=progress)
    except BaseException as exc:
        for sock in listeners:
            sock.close()
        _unlink_if_ours(state.socket_file, socket_inode)
        if isinstance(exc, OSError):
            out(f"not starting: cannot listen on {url or tcp}: {exc.strerror or exc}")
            return None
        raise
    return listeners, url, manager


def serve(config: ServiceConfig, log_level: str = "info") -> int:
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    refusal = config_refusal(config)
    if refusal:
        out(refusal)
        return 2
    items = _protections(config, out)
    if items is None:
        return 2
    descriptors.raise_soft_limit()  # before anything opens: the reserve is counted from this limit
    state = StateDir(config.state_dir)
    state.ensure()
    if os.geteuid() == 0:
        blocked = world_reachable(state.root)
        if blocked:
            out(f"the state directory {state.root} is inside {blocked}, which sandbox uids cannot enter; "
                "choose another with --state-dir (e.g. /var/lib/sandbox-kernel)")
            return 2
    token = ensure_token(state, config.token)
    ready = _listen_and_prepare(config, state, items, out)
    if ready is None:
        return 2
    listeners, url, manager = ready
    where = f"unix:{state.socket_file}" + (f" and {url}" if url else "")
    weaker = ", ".join(i["name"] + " " + i["status"] for i in items if i["status"] != "in force")
    out(f"sandbox server on {where} (state: {state.root}{'; multi-user' if config.multi_user else ''}; "
        f"isolation: {weaker or 'all protections in force'})"
        + (f"; stops after {config.idle_stop_seconds} s unused" if config.idle_stop_seconds else ""))
    app = build_app(manager, token, multi_user=config.multi_user, scrape_port=config.metrics_port)
    _run(config, state, manager, app, listeners, url, log_level)
    detached = housekeeping.unmount_images(state)
    if manager.kept:
        out(f"stopped; kept {len(manager.kept)} sandbox(es) running for the next server to re-adopt "
            f"(they end at their TTL; `sandbox-kernel rm ID` ends one): {', '.join(manager.kept)}")
    else:
        out("stopped; no sandbox left running")
    if detached:
        out(f"detached {len(detached)} image mount(s)")
    return 0


def _run(config: ServiceConfig, state: StateDir, manager: SandboxManager, app, listeners, url, log_level) -> None:
    """uvicorn until SIGTERM (or idle), then the state directory's files of this run removed."""
    activity = Activity(app)
    server = _Server(uvicorn.Config(activity, log_level=log_level, http=_http_protocol(),
                                    timeout_graceful_shutdown=10, access_log=log_level == "debug"))
    server.manager = manager
    if config.idle_stop_seconds:
        manager.on_start.append(lambda: stop_when_idle(activity, lambda: manager.tenancy.watched,
                                                       config.idle_stop_seconds, server.stop_now))
    socket_inode = os.stat(state.socket_file).st_ino
    statefile.write_json(state.server_file, {"pid": os.getpid(), "socket": state.socket_file, "url": url,
                                             "multi_user": config.multi_user,
                                             "idle_stop_seconds": config.idle_stop_seconds}, mode=0o644)
    pid_file = _write_pid_file(config.pid_file)
    # uvicorn re-raises the SIGTERM it handled once shutdown is complete, which would kill
    # this process before the clean-up below (exit status -15, stale server.json): a no-op
    # handler turns that into a normal return and exit status 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run(sockets=listeners)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _unlink_if_ours(state.socket_file, socket_inode)
        try:
            cur = statefile.read_json(state.server_file) or {}
            if cur.get("pid") == os.getpid():
                os.unlink(state.server_file)
        except OSError:
            pass
        _remove_pid_file(pid_file)


def _write_pid_file(path: str) -> str | None:
    """The pid, one line, where an init system without systemd reads it (``pid_file``)."""
    if not path:
        return None
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.chmod(partial, 0o644)
    os.replace(partial, path)  # whole or not at all: a reader never sees half a pid
    return path


def _remove_pid_file(path: str | None) -> None:
    """Ours only: a newer server may have written its own since."""
    if not path:
        return
    try:
        with open(path) as f:
            ours = f.read().strip() == str(os.getpid())
        if ours:
            os.unlink(path)
    except OSError:
        pass


def _unlink_if_ours(path: str, inode: int) -> None:
    """Remove our socket, not one a newer server has bound since."""
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass
