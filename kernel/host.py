"""``%%host`` cells: code that runs in the kernel's own process, on the host, not sandboxed.

Some checks belong outside the sandbox: recomputing the sandbox's answer from the same rows
(a check the sandbox cannot fake), or driving other sandboxes through the client as an
agent would. A ``%%host`` cell runs such code in a namespace of its own that persists
across ``%%host`` cells. It is code *you* wrote, with your own rights: never put model- or
data-generated code in one. Operators who let models write notebook cells switch host cells
off with ``SANDBOX_KERNEL_HOST_CELLS=0``.
"""

from __future__ import annotations

import ast
import asyncio
import os
import traceback
import typing as t

MARKER = "%%host"


def is_host_cell(code: str) -> bool:
    first = next((line.strip() for line in code.splitlines() if line.strip()), "")
    return first == MARKER or first.startswith(MARKER + " ")


def host_cells_enabled() -> bool:
    return os.environ.get("SANDBOX_KERNEL_HOST_CELLS", "1").strip().lower() not in ("0", "false", "no", "off")


def strip_marker(code: str) -> str:
    lines = code.splitlines()
    for index, line in enumerate(lines):
        if line.strip():
            # Keep the line count so tracebacks point at the lines the user sees.
            lines[index] = ""
            break
    return "\n".join(lines)


class HostNamespace:
    """The persistent namespace of a kernel's ``%%host`` cells."""

    def __init__(self) -> None:
        self.namespace: dict[str, t.Any] = {"__name__": "__host__"}
        self.count = 0

    def _run(self, source: str) -> t.Any:
        """Execute; return the value of a trailing expression (None if there is none)."""
        self.count += 1
        filename = f"<host cell {self.count}>"
        tree = ast.parse(source, filename=filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), self.namespace)
        if last is not None:
            return eval(compile(last, filename, "eval"), self.namespace)
        return None

    async def run(self, code: str) -> tuple[t.Any, dict[str, t.Any] | None]:
        """Run a cell in a worker thread: (value of its last expression, error content or None)."""
        source = strip_marker(code)
        try:
            value = await asyncio.to_thread(self._run, source)
        except BaseException as exc:  # the cell's own error, shown to its author
            frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
            # Drop our own frames: the user's code starts at its "<host cell N>" frame.
            start = next((i for i, line in enumerate(frames) if "<host cell" in line), 1)
            tb = [frames[0]] + frames[start:] if start > 1 else frames
            return None, {"ename": type(exc).__name__, "evalue": str(exc), "traceback": [line.rstrip("\n") for line in tb]}
        return value, None
