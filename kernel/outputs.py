"""Sandbox execute events → Jupyter messages, and the kernel's own notices.

Pure functions and one small state machine (`CellMapper`), no I/O, so that every rule
here is testable without a server or a kernel. The rules that matter to notebook tools:

- display bundles go through the output policy (`output_policy`): passive types pass,
  active ones are shown in isolated frames, the rest and all unknown metadata are dropped;
  `metadata` is always present (nbformat and jupyter_kernel_test require it);
- a failing cell yields exactly one `error` message, and its reply says `status: error`
  even when the server sent no error event (a killed sandbox, an aborted cell), because
  nbclient and papermill stop on the reply, not on stderr text;
- the execution count is the sandbox's.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from sandbox.runtime import vocabulary as V

from .notes import note_message
from .output_policy import filter_bundle, filter_transient

Message = t.Tuple[str, t.Dict[str, t.Any]]


def event_to_messages(
    event: dict[str, t.Any], execution_count: int | None = None, passthrough: bool = False
) -> list[Message]:
    """The Jupyter IOPub messages for one sandbox event: none for events with no Jupyter
    counterpart (`done`, and types newer than this kernel); for a display, the filtered
    bundle and a note (`notes`) for each part that was refused."""
    kind = event.get("type")
    if kind == V.STREAM:
        if event.get("note") is True:  # the runtime's or the server's word about the cell
            return [note_message(str(event.get("text", "")).strip("\n"))]
        name = event.get("name") if event.get("name") in V.STREAM_NAMES else V.STDOUT
        return [("stream", {"name": name, "text": str(event.get("text", ""))})]
    if kind in (V.DISPLAY_DATA, V.UPDATE_DISPLAY_DATA, V.EXECUTE_RESULT):
        bundle = filter_bundle(event.get("data"), event.get("metadata"), passthrough)
        content: dict[str, t.Any] = {"data": bundle.data, "metadata": bundle.metadata}
        if kind == V.EXECUTE_RESULT:
            content = {"execution_count": event.get("execution_count", execution_count), **content}
        else:
            content["transient"] = (
                dict(event.get("transient") or {}) if passthrough else filter_transient(event.get("transient"))
            )
            if kind == V.UPDATE_DISPLAY_DATA and not content["transient"].get("display_id"):
                # An update with nothing to update is shown rather than dropped.
                kind = V.DISPLAY_DATA
        notes = [note_message(note) for note in bundle.notes]
        return [(kind, content), *notes]
    if kind == V.CLEAR_OUTPUT:
        return [("clear_output", {"wait": bool(event.get("wait", False))})]
    if kind == V.ERROR:
        return [("error", error_content(event.get("ename", "Error"), event.get("evalue", ""), event.get("traceback")))]
    return []


def event_to_message(event: dict[str, t.Any], execution_count: int | None = None) -> Message | None:
    """The main IOPub message for one sandbox event (see `event_to_messages`), or None."""
    messages = event_to_messages(event, execution_count)
    return messages[0] if messages else None


def error_content(ename: str, evalue: str, traceback: t.Iterable[str] | None = None) -> dict[str, t.Any]:
    """An `error` message's content; with no traceback, a one-line one, so that frontends
    that show only the traceback still show the message (and never a trace of our code)."""
    tb = [str(line) for line in traceback] if traceback else [f"\x1b[0;31m{ename}\x1b[0m: {evalue}"]
    return {"ename": str(ename), "evalue": str(evalue), "traceback": tb}


def ok_reply(execution_count: int | None) -> dict[str, t.Any]:
    return {"status": "ok", "execution_count": execution_count, "payload": [], "user_expressions": {}}


def error_reply(execution_count: int | None, error: dict[str, t.Any]) -> dict[str, t.Any]:
    return {
        "status": "error",
        "execution_count": execution_count,
        "ename": error["ename"],
        "evalue": error["evalue"],
        "traceback": error["traceback"],
        "payload": [],
        "user_expressions": {},
    }


@dataclass
class CellMapper:
    """Maps the events of one cell to messages and, at the end, to the execute reply."""

    execution_count: int | None = None
    # True only when the user opted into unfiltered outputs (see output_policy).
    passthrough: bool = False
    error: dict[str, t.Any] | None = None
    done: dict[str, t.Any] | None = None
    text_result: str | None = field(default=None, repr=False)

    def feed(self, event: dict[str, t.Any]) -> list[Message]:
        kind = event.get("type")
        if kind == V.DONE:
            self.done = event
            if event.get("execution_count") is not None:
                self.execution_count = event["execution_count"]
            return []
        if kind == V.EXECUTE_RESULT:
            if event.get("execution_count") is not None:
                self.execution_count = event["execution_count"]
            data = event.get("data") or {}
            if "text/plain" in data:
                self.text_result = str(data["text/plain"])
        messages = event_to_messages(event, self.execution_count, self.passthrough)
        if messages and messages[0][0] == "error":
            if self.error is not None:
                # One error per cell: a second one is shown as text, not lost.
                content = messages[0][1]
                return [("stream", {"name": "stderr", "text": f"{content['ename']}: {content['evalue']}\n"})]
            self.error = messages[0][1]
        return messages

    def finish(self) -> tuple[list[Message], dict[str, t.Any]]:
        """Messages still owed (a synthesized error) and the execute reply content."""
        done = self.done or {}
        status = done.get("status", V.OK)
        if status == V.OK and self.error is None:
            return [], ok_reply(self.execution_count)
        owed: list[Message] = []
        if self.error is None:
            reason = done.get("reason")
            known = V.REASONS.get(reason or "")
            if known is not None:
                ename, evalue = known.ename, known.text
            else:
                ename, evalue = "SandboxError", f"the cell ended with status {status!r}"
                if reason:
                    evalue = f"{evalue} ({reason})"
            self.error = error_content(ename, evalue)
            owed.append(("error", self.error))
        return owed, error_reply(self.execution_count, self.error)

    @property
    def sandbox_gone(self) -> bool:
        return (self.done or {}).get("sandbox_state") in V.ENDED_STATES


# --------------------------------------------------------------------------- notices


def gone_notice(old_id: str, why: str, pushed: t.Sequence[str], new_id: str | None = None) -> str:
    """What the user reads when the next cell runs in a new sandbox: what happened, what
    was lost, and what to do about the files."""
    lines = [f"The sandbox {old_id} is gone: {why.rstrip('.')}.", "Its variables and imports are gone with it."]
    if pushed:
        shown = ", ".join(pushed[:10]) + (f" and {len(pushed) - 10} more" if len(pushed) > 10 else "")
        lines.append(f"Files pushed with %push are gone too ({shown}): push them again if this cell needs them.")
    lines.append(f"Running this cell in a new sandbox{' ' + new_id if new_id else ''}.")
    return "\n".join(lines) + "\n"


def timeout_notice(done: dict[str, t.Any] | None) -> str | None:
    """After a cell its time limit stopped: which setting raises that limit."""
    if (done or {}).get("reason") not in (V.TIMEOUT_INTERRUPTED, V.TIMEOUT_KILLED):
        return None
    return ("[sandbox: a cell may run for as long as the kernel's execute_timeout allows (unset: the "
            "server's default, 600 s unless configured otherwise). %sandbox timeout SECONDS raises it for the "
            "cells that follow; SANDBOX_KERNEL_TIMEOUT=SECONDS in the kernel's environment, or "
            "--SandboxKernel.execute_timeout, for kernels started afterwards]\n")


def died_reason(done: dict[str, t.Any]) -> str:
    """Why a sandbox did not survive a cell, from the cell's `done` event."""
    reason = done.get("reason")
    state = done.get("sandbox_state") or V.DEAD
    verb = "died" if state == V.DEAD else f"was {state}"
    if reason in V.REASONS:
        return f"it {verb} during the previous cell ({reason}: {V.REASONS[reason].text.split(';')[0]})"
    if reason:
        return f"it {verb} during the previous cell ({reason})"
    return f"it {verb} during the previous cell"


def format_bytes(n: int | float | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"
