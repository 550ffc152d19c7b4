"""``python -m sandbox.supervisor SANDBOX_DIR --ready-fd N [--restore]``: how the server starts a
supervisor (``--restore``: for a paused sandbox, from its checkpoint)."""

from __future__ import annotations

from ..common.lean_imports import SSL, leave_out

leave_out(SSL)  # before asyncio, which would import it: one MiB in every supervisor

import argparse  # noqa: E402
import asyncio  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

from ..common.background import spawn  # noqa: E402
from ..common.paths import SUPERVISOR_DIR_ENV  # noqa: E402
from ..runtime import vocabulary as V  # noqa: E402
from .lifecycle import Supervisor  # noqa: E402


async def amain(sandbox_dir: str, ready_fd: int | None, restore: bool = False) -> int:
    supervisor = Supervisor(sandbox_dir, restoring=restore)
    loop = asyncio.get_running_loop()
    # SIGTERM to a supervisor means "end this sandbox" (the server's SIGTERM never reaches
    # us: we are in our own session). SIGHUP/SIGINT are ignored for the same reason.
    loop.add_signal_handler(signal.SIGTERM, lambda: spawn(supervisor.end(V.DELETED, "its supervisor was terminated")))
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    try:
        await supervisor.start()
    except Exception as exc:
        message = str(exc) or type(exc).__name__
        if supervisor.restoring:  # it stays paused: its checkpoint is kept for another try
            supervisor.record["restore_error"] = message
        elif V.can_move(supervisor.record["state"], V.DEAD):
            V.advance(supervisor.record, V.DEAD, dead_reason=V.FAILED_TO_START, dead_message=message)
        await supervisor.teardown()
        if ready_fd is not None:
            reply = {"ok": False, "error": message, "reason": getattr(exc, "reason", None)}
            os.write(ready_fd, (json.dumps(reply) + "\n").encode())
            os.close(ready_fd)
        traceback.print_exc()
        return 1
    await supervisor.serve(ready_fd)
    return 0


@functools.cache
def command_line() -> argparse.ArgumentParser:
    """The supervisor's command line. Made once per process: the supervisor template makes
    it (and parses a sample) before it forks, so that a forked supervisor only parses its
    own arguments; building an argparse parser in each made about 0.9 MiB of it its own."""
    parser = argparse.ArgumentParser(prog="python -m sandbox.supervisor")
    parser.add_argument("sandbox_dir", nargs="?",
                        help=f"default: ${SUPERVISOR_DIR_ENV} (how the server passes it: argv is world-readable)")
    parser.add_argument("--ready-fd", type=int)
    parser.add_argument("--restore", action="store_true", help="restore the paused sandbox from its checkpoint")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    if args.sandbox_dir is None:  # read now, not when the parser was made (in the template)
        args.sandbox_dir = os.environ.get(SUPERVISOR_DIR_ENV)
    # The default loop, not uvloop: uvloop's subprocess_exec sets bwrap's argv[0] to its host
    # path, and bwrap (the sandbox's pid 1) would show the host's layout in /proc/1/cmdline.
    sys.exit(asyncio.run(amain(args.sandbox_dir, args.ready_fd, args.restore)))


if __name__ == "__main__":
    main()
