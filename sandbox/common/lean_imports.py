"""Modules a long-lived process of ours does not load, though a library it imports would.

Every kernel has a process on the host for as long as it lives (the kernel process Jupyter
starts), and so does every sandbox (its supervisor). Python keeps the code of each module
it imports in that process's private memory, so a module imported for a feature the
process never uses is paid for in every kernel or sandbox on the host, for its whole life.

`leave_out` marks such a module absent (None in `sys.modules`, so that importing it raises
ImportError), which the libraries that import it already treat as "not installed". It is
called first thing in a process's entry point, never by a library module: what one
process can do without, another (the server, a test) may need.
"""

from __future__ import annotations

import sys

# httpx imports its command-line client when click is installed, and with it click, rich
# and pygments: about 5 MiB of a kernel process. Without it, `httpx.main` only says that
# the command line needs those packages.
HTTPX_COMMAND_LINE = "httpx._main"
# asyncio imports ssl for TLS on its sockets (OpenSSL's tables: about 1 MiB of a process).
# A supervisor speaks only over unix sockets and pipes, never TLS.
SSL = "ssl"


def leave_out(*names: str) -> list[str]:
    """Mark `names` absent unless already imported; the names marked."""
    marked = []
    for name in names:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]
            marked.append(name)
    return marked
