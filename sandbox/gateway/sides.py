"""The two ends a relayed call joins, as each module sees the other.

``relay.ClientConnection`` (the client's connection) and ``exchange.Exchange`` (one call)
are defined above ``pool`` (the upstream connections) and use it; the upstream side talks
back to them only through these protocols, so the imports point one way:
relay ─▶ exchange ─▶ nodes ─▶ pool ─▶ sides.
"""

from __future__ import annotations

import typing as t


class ClientSide(t.Protocol):
    """The client connection a call answers on (``relay.ClientConnection``)."""

    corked: bool  # what one batch of upstream data makes goes out in one write
    parsing: bool  # the client's bytes at hand are being parsed
    write_paused: bool  # the client reads slower than the answer comes

    def write(self, data: bytes) -> None: ...

    def uncork(self) -> None: ...

    def cut(self) -> None:
        """End the connection now (an answer that cannot be finished)."""

    def hold_reading(self, holder: object) -> None: ...

    def release_reading(self, holder: object) -> None: ...

    def exchange_ended(self, exchange: t.Any) -> None: ...


class AnswerSink(t.Protocol):
    """The call an upstream connection's answer goes to (``exchange.Exchange``)."""

    client: ClientSide
    progress_at: float  # monotonic time the answer last moved (the read timeout's clock)

    def answer_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    def answer_body(self, data: bytes) -> None: ...

    def answer_end(self, reusable: bool) -> None: ...

    def upstream_broke(self, exc: BaseException) -> None: ...
