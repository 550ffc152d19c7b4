"""Starting the service: protections check, token, image, then uvicorn until SIGTERM.

On SIGTERM (or Ctrl-C) the server stops accepting, ends running executes with a clear
``server_shutdown`` event, and leaves every sandbox running under its supervisor for the
next server to re-adopt (unless ``--delete-on-shutdown``).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import signal
import sys

import uvicorn

from . import doctor, statefile, testonly
from .api import build_app
from .config import ServiceConfig
from .manager import SandboxManager
from .paths import StateDir, world_reachable

log = logging.getLogger("sandbox.server")


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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Server(uvicorn.Server):
    manager: SandboxManager

    def handle_exit(self, sig, frame):
        # Tell streaming executes first, so uvicorn's graceful wait is not spent on them.
        self.manager.shutting_down.set()
        super().handle_exit(sig, frame)


def serve(config: ServiceConfig, log_level: str = "info") -> int:
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if not is_loopback(config.host) and not config.token:
        out(f"refusing to listen on {config.host}: a non-loopback address needs an explicit token "
            "(set SANDBOX_KERNEL_TOKEN or --token)")
        return 2
    conflicts = config.defaults_over_maxima()
    if conflicts:
        out("refusing to start: a default limit is over its maximum: " + "; ".join(conflicts))
        return 2
    refusal = testonly.refusal(config)
    if refusal:
        out(refusal)
        return 2
    items = doctor.report(config)
    missing = doctor.missing(items)
    if missing:
        out("protections missing on this host:\n" + doctor.format_report(missing))
        if not config.allow_missing_protections:
            out("refusing to start; run `sandbox-kernel doctor` for details, or pass "
                "--allow-missing-protections to run with weaker isolation anyway")
            return 2
        out("WARNING: starting WITHOUT these protections (--allow-missing-protections)")
    state = StateDir(config.state_dir)
    state.ensure()
    if os.geteuid() == 0:
        blocked = world_reachable(state.root)
        if blocked:
            out(f"the state directory {state.root} is inside {blocked}, which sandbox uids cannot enter; "
                "choose another with --state-dir (e.g. /var/lib/sandbox-kernel)")
            return 2
    token = ensure_token(state, config.token)
    manager = SandboxManager(config)
    manager.protections = items  # probed once: /v1/info must not spawn a bwrap per request
    manager.prepare(progress=out)
    app = build_app(manager, token)
    server = _Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                                    timeout_graceful_shutdown=10, access_log=log_level == "debug"))
    server.manager = manager
    statefile.write_json(state.server_file, {"pid": os.getpid(), "url": f"http://{config.host}:{config.port}"}, mode=0o644)
    out(f"sandbox server on http://{config.host}:{config.port} (state: {state.root}; "
        f"isolation: {', '.join(i['name'] + ' ' + i['status'] for i in items if i['status'] != 'in force') or 'all protections in force'})")
    # uvicorn re-raises the SIGTERM it handled once shutdown is complete, which would kill
    # this process before the clean-up below (exit status -15, stale server.json): a no-op
    # handler turns that into a normal return and exit status 0.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            cur = statefile.read_json(state.server_file) or {}
            if cur.get("pid") == os.getpid():
                os.unlink(state.server_file)
        except OSError:
            pass
    return 0
