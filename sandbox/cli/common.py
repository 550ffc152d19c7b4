"""What the commands share: which server or state directory a command works on, the
error line, and help texts that end with examples."""

from __future__ import annotations

import argparse
import contextlib
import sys
import textwrap


def error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def command(sub, name: str, help: str, examples: str = "", **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` ends with its examples (kept as written)."""
    epilog = "examples:\n" + textwrap.indent(textwrap.dedent(examples).strip("\n"), "  ") if examples else None
    return sub.add_parser(name, help=help, description=help, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def add_state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", help="the state directory (default: SANDBOX_KERNEL_STATE_DIR, else "
                                       "~/.local/share/sandbox-kernel, as root /var/lib/sandbox-kernel)")


def add_where(p: argparse.ArgumentParser, url_help: str = "") -> None:
    p.add_argument("--state-dir", help="whose server: this state directory's socket")
    p.add_argument("--url", help=url_help or "a server URL: http://HOST:PORT (token from SANDBOX_KERNEL_TOKEN or "
                                             "the state directory) or unix:/path/server.sock")


def state_of(args):
    from ..common.paths import StateDir

    return StateDir(args.state_dir) if getattr(args, "state_dir", None) else StateDir.default()


def state_of_server(args):
    """The state directory of the server a command without ``--url`` reaches (the rule of
    sandbox/service/endpoint.py): ``--state-dir``, else that server's socket's directory
    (the host's system server's, for a user with no server of their own running), else
    the default. What ``logs`` reads, so that it looks where the sandboxes are."""
    from ..common.paths import StateDir, reached_state_dir

    return StateDir(args.state_dir) if getattr(args, "state_dir", None) else StateDir(reached_state_dir())


def server(args):
    """The ServerConfig of the server this command talks to (see the package docstring);
    None after printing why there is none."""
    from ..client import SandboxError, resolve

    try:
        return resolve(getattr(args, "url", None), None, getattr(args, "state_dir", None))
    except SandboxError as exc:
        error(str(exc))
        return None


@contextlib.contextmanager
def transport(config):
    """A blocking transport to the server (the sync client's), closed afterwards."""
    from ..client import DEFAULT_TIMEOUT
    from ..client.sync_client import _SyncTransport

    tr = _SyncTransport(config, DEFAULT_TIMEOUT)
    try:
        yield tr
    finally:
        tr.close()
