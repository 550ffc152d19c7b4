"""Driving a running kernel from outside, as a notebook server does: one cell through a
jupyter_client `BlockingKernelClient`, waited for until its reply and its idle status.

Not used by the kernel itself; the tests and the benchmarks share it, so that both see a
cell end the same way.
"""

from __future__ import annotations

import time
import typing as t
from queue import Empty


def run_cell(kc, code: str, timeout: float = 60.0, **execute_kwargs: t.Any) -> tuple[dict, list[dict]]:
    """Execute and wait for the reply and the idle status.

    Returns the reply and the cell's IOPub messages other than status and execute_input.
    The benchmarks time their cells with this and the kernel tests collect theirs with
    it, so what is timed is what is checked.
    """
    msg_id = kc.execute(code, **execute_kwargs)
    deadline = time.monotonic() + timeout
    # ZMQ queues whatever arrives meanwhile, so waiting for one socket after the other
    # ends at the later of the two arrivals: no polling granularity in the figure.
    reply = wait_reply(kc, msg_id, deadline, code[:40])
    return reply, iopub_until_idle(kc, msg_id, deadline, code[:40])


def _next_of(get: t.Callable[..., dict], msg_id: str, deadline: float, waiting_for: str) -> dict:
    """The next message of request `msg_id` from one channel (shell or IOPub)."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no {waiting_for} by the deadline")
        try:
            msg = get(timeout=remaining)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


def wait_reply(kc, msg_id: str, deadline: float, what: str = "") -> dict:
    """The shell reply to request `msg_id` (a cell's, or any other request's)."""
    return _next_of(kc.get_shell_msg, msg_id, deadline, f"reply for {what or msg_id!r}")


def iopub_until_idle(kc, msg_id: str, deadline: float, what: str = "") -> list[dict]:
    """The IOPub messages of request `msg_id` up to its idle status, but for status and
    execute_input."""
    outputs: list[dict] = []
    while True:
        msg = _next_of(kc.get_iopub_msg, msg_id, deadline, f"idle status for {what or msg_id!r}")
        if msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "idle":
                return outputs
        elif msg["msg_type"] != "execute_input":
            outputs.append(msg)
