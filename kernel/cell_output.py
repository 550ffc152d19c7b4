"""Where one cell's output goes: the kernel publishes it on IOPub (kernel.py's `_Out`); the
claim and the cells write to it. A protocol of its own so that neither needs the other."""

from __future__ import annotations

import typing as t

from .widgets import CommMessage


class Output(t.Protocol):
    """Where one cell's output goes (the kernel publishes it on IOPub)."""

    silent: bool
    text_result: str | None
    allow_stdin: bool  # the request's: whether input() may ask the frontend
    user_expressions: dict[str, str] | None
    msg_id: str | None  # the frontend's id of the request (ipywidgets' Output captures by it)

    def send(self, msg_type: str, content: dict[str, t.Any]) -> None: ...

    def comm(self, message: CommMessage) -> None: ...

    async def ask_input(self, prompt: str, password: bool) -> str: ...

    def stream(self, name: str, text: str) -> None: ...

    def display(self, data: dict[str, t.Any], *, display_id: str, update: bool = False) -> None: ...
