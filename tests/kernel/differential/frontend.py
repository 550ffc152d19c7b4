"""What a frontend observes of a kernel, reduced to what it can act on.

`Frontend` sends requests through jupyter_client exactly as JupyterLab or nbclient would
(several at once when a scenario says so, as Run All does) and reads every channel until
each request has its reply and its idle status. `Observed` keeps, per request and in the
order the kernel sent them, the messages a frontend acts on: their types, reply statuses,
execution counts, `execute_input`, MIME keys, `transient` and `metadata` keys, stream text,
error names. Bytes a frontend only shows (a traceback's lines, an HTML body) are left out:
the comparison is about behaviour, not rendering.

Both kernels run under the same driver, so whatever differs is the kernels'.
"""

from __future__ import annotations

import time
import typing as t
from dataclasses import dataclass, field
from queue import Empty

Shape = t.Tuple[t.Any, ...]

# The display id of the sandbox kernel's progress while a slow claim keeps the first cell
# waiting (kernel/claim.py), cleared when the sandbox is there.
STARTUP_PROGRESS = "sandbox-startup-"

# Messages without a reply of their own (comm messages from the page): done at their idle.
NO_REPLY = {"comm_open", "comm_msg", "comm_close"}
# A shutdown's IOPub messages (its statuses, and the copy of its reply that both kernels
# broadcast there) race the kernel's exit (its IOPub socket closes with the process, for
# ipykernel as for this kernel): done at its reply, compared without what IOPub carried.
LAST_WORDS = {"shutdown_request"}
LAST_WORDS_IOPUB = {"status", "shutdown_reply"}


def bundle_keys(content: dict[str, t.Any]) -> tuple[str, ...]:
    return tuple(sorted((content.get("data") or {}).keys()))


def keys_of(content: dict[str, t.Any], name: str) -> tuple[str, ...]:
    return tuple(sorted((content.get(name) or {}).keys()))


def iopub_shape(msg: dict[str, t.Any]) -> Shape:
    """One IOPub message as a frontend acts on it."""
    kind, content = msg["msg_type"], msg["content"]
    if kind == "status":
        return (kind, content["execution_state"])
    if kind == "execute_input":
        return (kind, content.get("execution_count"))
    if kind == "stream":
        return (kind, content["name"], content["text"])
    if kind in ("display_data", "update_display_data"):
        if str((content.get("transient") or {}).get("display_id", "")).startswith(STARTUP_PROGRESS):
            return (kind, "startup progress")
        return (kind, bundle_keys(content), keys_of(content, "transient"), keys_of(content, "metadata"))
    if kind == "execute_result":
        return (kind, content.get("execution_count"), bundle_keys(content), keys_of(content, "metadata"))
    if kind == "error":
        return (kind, content.get("ename"), content.get("evalue"))
    if kind == "clear_output":
        return (kind, bool(content.get("wait")))
    if kind in NO_REPLY:
        return (kind, content.get("target_name"), tuple(sorted((content.get("data") or {}).keys())))
    return (kind,)


def reply_shape(msg: dict[str, t.Any]) -> Shape:
    """A shell or control reply as a frontend acts on it."""
    kind, content = msg["msg_type"], msg["content"]
    shape: list[t.Any] = [kind, content.get("status")]
    if kind == "execute_reply":
        shape += [content.get("execution_count"), content.get("ename"),
                  tuple(p.get("source") for p in content.get("payload") or [])]
    elif kind == "is_complete_reply":
        shape += [content.get("indent")]
    elif kind == "inspect_reply":
        shape += [content.get("found"), bundle_keys(content)]
    elif kind == "complete_reply":
        shape += [content.get("cursor_start"), content.get("cursor_end")]
    elif kind == "history_reply":
        shape += [tuple(tuple(entry[2:]) if len(entry) > 2 else tuple(entry) for entry in content.get("history") or [])]
    elif kind == "shutdown_reply":
        shape += [content.get("restart")]
    return tuple(shape)


def merge_streams(shapes: list[Shape]) -> list[Shape]:
    """Consecutive stream messages of one stream as one: how text is cut into messages
    depends on flush timing, and a frontend appends them anyway."""
    merged: list[Shape] = []
    for shape in shapes:
        if shape[0] == "stream" and merged and merged[-1][0] == "stream" and merged[-1][1] == shape[1]:
            merged[-1] = ("stream", shape[1], merged[-1][2] + shape[2])
        else:
            merged.append(shape)
    return merged


@dataclass
class Observed:
    """One request as the frontend saw it."""

    label: str
    msg_type: str
    reply: Shape | None = None
    reply_content: dict[str, t.Any] = field(default_factory=dict)
    iopub: list[Shape] = field(default_factory=list)
    idle: bool = False
    input_prompts: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        if self.msg_type in LAST_WORDS:
            return self.reply is not None
        return self.idle and (self.reply is not None or self.msg_type in NO_REPLY)

    def shape(self) -> tuple[Shape | None, tuple[Shape, ...], tuple[str, ...]]:
        iopub = [s for s in self.iopub if not (self.msg_type in LAST_WORDS and s[0] in LAST_WORDS_IOPUB)]
        return self.reply, tuple(merge_streams(iopub)), tuple(self.input_prompts)


class Frontend:
    """One kernel's client, driven as a frontend drives it."""

    def __init__(self, km: t.Any, kc: t.Any, answers: t.Sequence[str] = ()) -> None:
        self.km, self.kc = km, kc
        self.requests: dict[str, Observed] = {}
        self.order: list[str] = []
        self.answers = list(answers)  # what the "user" types into input(), in order
        self.stray: list[dict[str, t.Any]] = []  # messages of no request of ours

    # ---------------------------------------------------------------- sending

    def _track(self, label: str, msg_type: str, msg_id: str) -> str:
        self.requests[msg_id] = Observed(label, msg_type)
        self.order.append(msg_id)
        return msg_id

    def execute(self, code: str, label: str | None = None, **kwargs: t.Any) -> str:
        kwargs.setdefault("allow_stdin", True)
        return self._track(label or code, "execute_request", self.kc.execute(code, **kwargs))

    def shell(self, msg_type: str, content: dict[str, t.Any], label: str | None = None) -> str:
        msg = self.kc.session.msg(msg_type, content)
        self.kc.shell_channel.send(msg)
        return self._track(label or msg_type, msg_type, msg["header"]["msg_id"])

    def complete(self, code: str, cursor_pos: int | None = None) -> str:
        return self._track(f"complete {code!r}", "complete_request", self.kc.complete(code, cursor_pos))

    def inspect(self, code: str, cursor_pos: int | None = None) -> str:
        return self._track(f"inspect {code!r}", "inspect_request", self.kc.inspect(code, cursor_pos))

    def is_complete(self, code: str) -> str:
        return self._track(f"is_complete {code!r}", "is_complete_request", self.kc.is_complete(code))

    def history(self, **kwargs: t.Any) -> str:
        return self._track(f"history {kwargs}", "history_request", self.kc.history(**kwargs))

    def interrupt(self) -> None:
        """As JupyterLab's stop button: the kernelspec's interrupt mode (a signal for
        ipykernel, an interrupt_request for the sandbox kernel)."""
        self.km.interrupt_kernel()

    # ---------------------------------------------------------------- reading

    def _take(self, msg: dict[str, t.Any], channel: str) -> None:
        parent = (msg.get("parent_header") or {}).get("msg_id")
        observed = self.requests.get(parent) if parent else None
        if observed is None:
            self.stray.append(msg)
            return
        if channel == "iopub":
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                observed.idle = True
            observed.iopub.append(iopub_shape(msg))
        elif channel == "stdin":
            observed.input_prompts.append(msg["content"]["prompt"])
            self.kc.input(self.answers.pop(0) if self.answers else "")
        else:
            observed.reply = reply_shape(msg)
            observed.reply_content = msg["content"]

    def wait(self, until: t.Callable[[], bool], timeout: float = 90.0) -> None:
        """Read every channel until `until()` holds."""
        deadline = time.monotonic() + timeout
        channels = (("shell", self.kc.get_shell_msg), ("iopub", self.kc.get_iopub_msg),
                    ("stdin", self.kc.get_stdin_msg), ("control", self.kc.get_control_msg))
        while not until():
            if time.monotonic() > deadline:
                pending = [f"{o.label} (reply: {o.reply is not None}, idle: {o.idle})"
                           for o in (self.requests[m] for m in self.order) if not o.done]
                raise TimeoutError(f"still waiting for {pending}; {len(self.stray)} messages of no request")
            got = False
            for name, get in channels:
                try:
                    msg = get(timeout=0.005)
                except Empty:
                    continue
                got = True
                self._take(msg, name)
            if not got:
                time.sleep(0.01)

    def subscribed(self, timeout: float = 120.0) -> None:
        """Until the kernel's IOPub has this client's subscription (its `iopub_welcome`), as
        Jupyter Server waits for IOPub before it forwards a page's request: a PUB socket
        drops what it publishes before a subscriber has joined, and when that is depends on
        how loaded the host is. Nothing else is waited for (no kernel_info: requests sent
        now still come before the kernel said it was ready, while its sandbox is claimed)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the kernel's IOPub never welcomed this client")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(remaining, 1.0))
            except Empty:
                continue
            if msg["msg_type"] == "iopub_welcome":
                return
            self._take(msg, "iopub")

    def settle(self, timeout: float = 90.0) -> None:
        """Until every request so far has its reply and its idle."""
        self.wait(lambda: all(self.requests[m].done for m in self.order), timeout)

    def saw(self, msg_id: str, shape_kind: str, text: str = "") -> bool:
        return any(s[0] == shape_kind and text in "".join(map(str, s[1:])) for s in self.requests[msg_id].iopub)

    def transcript(self) -> list[tuple[str, tuple[t.Any, ...]]]:
        return [(self.requests[m].label, self.requests[m].shape()) for m in self.order]
