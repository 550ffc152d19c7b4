"""`python -m sandbox` and the `sandbox-kernel` command (pyproject.toml's script): the CLI,
after leaving out what none of its commands uses (`lean_imports`), before anything imports it.

The server is one of these processes for as long as it runs (`serve`, and the server a
kernel starts for itself): httpx's own command line, which httpx imports when click is
installed (uvicorn's command line brings click), would hold rich and pygments in it, about
3 MiB."""

from .common.lean_imports import HTTPX_COMMAND_LINE, leave_out


def main() -> None:
    leave_out(HTTPX_COMMAND_LINE)  # before the CLI's modules import httpx
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
