"""Reaching a state directory's server for ``ls`` and ``rm`` when none runs there.

Sandboxes outlive their server: a notebook's kept sandbox runs on after ``lab`` exits or
the embedded server stops idle, until its TTL. "cannot reach the sandbox server" is then
a dead end for the very commands that would list or end them. So where the command works
on a state directory of the caller's own (no ``--url``, no SANDBOX_KERNEL_URL), nothing
answers on its socket and sandboxes still run there, a server is started for the call
(no warm pool; it re-adopts them) and stopped after it, as ``stop`` would: nothing of
ours keeps running that did not run before. With no sandbox running there is nothing to
reach: the command says so itself. A command pointed at a server (``--url``) starts none.
"""

from __future__ import annotations

import contextlib
import os
import sys

from ..common.paths import SOCKET_NAME, StateDir
from .common import error

START_TIMEOUT = 120.0  # seconds: imports and re-adoption on a loaded host; the image is built already
# A server started for one call stops by itself if this process dies before stopping it.
IDLE_STOP_SECONDS = 120


def own_state_dir(config) -> StateDir | None:
    """The state directory whose socket ``config`` names, when it is the caller's own (a
    server we may start there); None for a URL, a system server's, another user's."""
    if not config.socket or os.path.basename(config.socket) != SOCKET_NAME:
        return None
    root = os.path.dirname(config.socket)
    try:
        if os.stat(root).st_uid != os.geteuid():
            return None
    except FileNotFoundError:
        return StateDir(root)  # nothing was ever kept there: nothing runs
    except OSError:
        return None
    return StateDir(root)


def live_here(state: StateDir) -> dict[str, int]:
    from ..service import housekeeping

    return housekeeping.live_sandboxes(state)


def url_given(args) -> bool:
    """Whether the command was pointed at a server (``--url``, SANDBOX_KERNEL_URL): then it
    talks to that server or fails naming it, and starts none."""
    return bool(getattr(args, "url", None) or (not getattr(args, "state_dir", None)
                                               and os.environ.get("SANDBOX_KERNEL_URL", "").strip()))


@contextlib.contextmanager
def server_for_call(args, config):
    """Yield True when a server answers at ``config`` for the call (started for it if need
    be, and stopped afterwards), False when none runs and no sandbox runs there either
    (the caller says there is nothing); raises nothing: a start that fails is said and
    yields False."""
    from ..service.server_process import ServerProcess, ServerStartError, is_healthy, serve_command

    state = None if url_given(args) else own_state_dir(config)
    if state is None or is_healthy(config.endpoint):
        yield True
        return
    live = live_here(state)
    if not live:
        yield False
        return
    print(f"no sandbox server runs on {state.root}, where {len(live)} sandbox(es) still run: starting one for "
          "this command (stopped after it)", file=sys.stderr, flush=True)
    server = ServerProcess(serve_command(state.root, "--pool-size", "0", "--set",
                                         f"idle_stop_seconds={IDLE_STOP_SECONDS}"),
                           os.path.join(state.root, "server.log"), cwd=state.root,
                           banner=f"started by sandbox-kernel pid {os.getpid()} for one command")
    try:
        server.start()
        server.wait_healthy(config.endpoint, START_TIMEOUT)
    except (OSError, ServerStartError) as exc:
        error(f"could not start a sandbox server on {state.root}: {exc}")
        server.stop()
        yield False
        return
    try:
        yield True
    finally:
        _stop(state, server)


def _stop(state: StateDir, server) -> None:
    """As ``stop`` does (the warm pool ended, image mounts detached, kept sandboxes left);
    the child's own handle if the state directory's record cannot be used."""
    from ..service import housekeeping

    try:
        if housekeeping.stop_server(state, timeout=60.0) is not None:
            server.stop(10)
            return
    except (TimeoutError, housekeeping.AdminRefused):
        pass
    server.stop(60)
