"""The ``sandbox-kernel`` command: one subcommand per job (``sandbox-kernel --help`` lists
them, ``sandbox-kernel COMMAND --help`` shows examples).

Every command that talks to a server finds it as the kernel does (sandbox/service/endpoint.py):
``--url``, else ``--state-dir``'s socket, else SANDBOX_KERNEL_URL, else the state
directory's socket from SANDBOX_KERNEL_STATE_DIR or the default (or, for a user with no
server of their own running, the host's system server). None falls back to another server
once it has chosen; every connection error names the URL or socket it tried. ``ls`` and
``rm`` start their state directory's server for the call where kept sandboxes outlived it
(reach.py).

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
import textwrap

from . import frontends, images, sandboxes, service

DESCRIPTION = "Stateful, isolated Python sandboxes, and the Jupyter kernel that runs cells in them."


def command_summary(sub: argparse._SubParsersAction) -> str:
    """``serve | gateway | ... | image build/ls/inspect/rm | ...``, read from the registered
    subcommands, so that the summary names every command there is and no other."""
    names = []
    for name, parser in sub.choices.items():
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        names.append(f"{name} {'/'.join(nested[0].choices)}" if nested else name)
    return " | ".join(names)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox-kernel",
                                     epilog="examples:\n  sandbox-kernel lab\n  sandbox-kernel ls\n"
                                            "  sandbox-kernel exec ID -- python -V\n  sandbox-kernel stop",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (service, images, frontends, sandboxes):
        group.register(sub)
    summary = textwrap.fill(f"commands: {command_summary(sub)}", 90, subsequent_indent="  ", break_on_hyphens=False)
    parser.description = f"{DESCRIPTION}\n\n{summary}\nsandbox-kernel COMMAND --help shows a command's options and examples."
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.raw_argv = list(sys.argv[1:] if argv is None else argv)  # what `serve --daemon` passes on
    try:
        sys.exit(args.func(args) or 0)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `sandbox-kernel ls | head`: the reader left; not an error of ours
        sys.stderr.close()
        sys.exit(141)
