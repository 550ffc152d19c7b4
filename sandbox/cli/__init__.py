"""``sandbox-kernel``: serve | stop | purge | gateway | doctor | image build/ls/rm | install |
lab | ls | rm | exec | logs | usage | drain | mcp. ``sandbox-kernel COMMAND --help`` shows examples.

Every command that talks to a server finds it as the kernel does (sandbox/service/endpoint.py):
``--url``, else ``--state-dir``'s socket, else SANDBOX_KERNEL_URL, else the state
directory's socket from SANDBOX_KERNEL_STATE_DIR or the default. None falls back to another
server; every connection error names the URL or socket it tried.

Written with argparse, not Click/Typer with Rich: the commands are a flat list of
subcommands whose options map one to one onto settings, the help texts with examples and
the tables (human.py) take a few lines each, and the package is installed into every
Jupyter environment that uses the kernel, where three more dependencies (and Rich's import
time on every invocation) buy nothing argparse lacks here. Progress bars use tqdm, already
a dependency. One module per group of commands, each with a ``register(subparsers)``.
"""

from __future__ import annotations

import argparse
import sys

from . import frontends, images, sandboxes, service


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox-kernel", description=__doc__.split("\n\n")[0],
                                     epilog="examples:\n  sandbox-kernel lab\n  sandbox-kernel ls\n"
                                            "  sandbox-kernel exec ID -- python -V\n  sandbox-kernel stop",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (service, images, frontends, sandboxes):
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        sys.exit(args.func(args) or 0)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `sandbox-kernel ls | head`: the reader left; not an error of ours
        sys.stderr.close()
        sys.exit(141)
