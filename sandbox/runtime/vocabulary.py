"""The protocol's one vocabulary: every name the runtime, supervisor, manager, client and kernel speak.

Each idea is defined here once and imported everywhere else (a second list of states or
reasons drifts: it already had, a tuple without ``lost``, a reason table without
``protocol``). The module is copied into every sandbox with the runtime, so it uses the
standard library only; the host imports it as ``sandbox.runtime.vocabulary``.

What it holds, and how to extend it:

- **Event types** (``STREAM`` ... ``DONE``) and ``EVENT_FIELDS``, the fields each one carries
  and their kinds (``Kind``). An execute's events go runtime -> supervisor -> server ->
  client/kernel; ``OUTPUT_EVENTS`` are the ones that carry a cell's output. A new endpoint
  with events of its own adds its types to ``EVENT_FIELDS`` (and to ``OUTPUT_EVENTS`` when
  they are output that counts against the output cap) and the fields its ``done`` adds to
  ``DONE_EXTRA_FIELDS``; the supervisor's edge check then accepts them and nothing else.
- **Runtime frames**: ``READY`` and ``REPLY`` (the runtime's answers to requests), and the
  requests the host sends the runtime (``OPS``).
- **Done statuses** (``OK``, ``ERROR``, ``ABORTED``) and **end reasons** (``REASONS``: why a
  cell did not end by itself, or why a sandbox ended), each with the exception name and
  words a user reads.
- **Sandbox states** and ``TRANSITIONS``, the table of allowed moves (as containerd's
  process states): ``advance(record, state)`` moves a record or raises ``IllegalTransition``,
  never a silent assignment.
- **Constructors** for the events several layers make up (``done_event``, ``error_event``,
  ``stream_event``), so a ``done`` looks the same whoever sends it.
"""

from __future__ import annotations

# ------------------------------------------------------------------ event types
STREAM = "stream"
DISPLAY_DATA = "display_data"
UPDATE_DISPLAY_DATA = "update_display_data"
EXECUTE_RESULT = "execute_result"
CLEAR_OUTPUT = "clear_output"
ERROR = "error"
DONE = "done"
# What code in the sandbox asks of the frontend during an execute: an answer to input()
# or getpass() (the execute waits for it, see OP_INPUT_REPLY), and the messages of comms
# (ipywidgets), as Jupyter names them. Comm messages also go the other way (OP_COMM).
INPUT_REQUEST = "input_request"
COMM_OPEN = "comm_open"
COMM_MSG = "comm_msg"
COMM_CLOSE = "comm_close"
COMM_MESSAGES = frozenset({COMM_OPEN, COMM_MSG, COMM_CLOSE})

# Frames only the runtime sends (never forwarded to a client as they are).
READY = "ready"
REPLY = "reply"

#: Events that carry a cell's output (everything an execute streams before its ``done``).
OUTPUT_EVENTS = frozenset({STREAM, DISPLAY_DATA, UPDATE_DISPLAY_DATA, EXECUTE_RESULT, CLEAR_OUTPUT, ERROR,
                           INPUT_REQUEST}) | COMM_MESSAGES
#: Events whose content is a MIME bundle (``data``) with ``metadata``.
BUNDLE_EVENTS = frozenset({DISPLAY_DATA, UPDATE_DISPLAY_DATA, EXECUTE_RESULT})
#: Every event of an execute, in the order a client sees them: outputs, then one ``done``.
EXECUTE_EVENTS = OUTPUT_EVENTS | {DONE}

STDOUT = "stdout"
STDERR = "stderr"
STREAM_NAMES = frozenset({STDOUT, STDERR})

# Commands (POST /v1/sandboxes/{id}/commands): the runtime sends a command's output as
# ``stream`` frames and its end as one ``command_done``; the host turns that into the
# client's ``done``, after a ``start`` of its own that names the command.
START = "start"
COMMAND_DONE = "command_done"
#: Frames the runtime sends about a command.
COMMAND_EVENTS = frozenset({STREAM, COMMAND_DONE})
#: Every event of a command, as a client sees them: ``start``, output, then one ``done``.
COMMAND_CLIENT_EVENTS = frozenset({START, STREAM, DONE})
#: What the host may ask the runtime to do to a running command (SIGINT, SIGTERM, SIGKILL
#: to its process group).
SIGNAL_INTERRUPT = "interrupt"
SIGNAL_TERMINATE = "terminate"
SIGNAL_KILL = "kill"
COMMAND_SIGNALS = frozenset({SIGNAL_INTERRUPT, SIGNAL_TERMINATE, SIGNAL_KILL})

# --------------------------------------------------------- requests to the runtime
OP_EXECUTE = "execute"
OP_INTERRUPT = "interrupt"
OP_PING = "ping"
OP_COMPLETE = "complete"
OP_INSPECT = "inspect"
OP_IS_COMPLETE = "is_complete"
OP_COMMAND = "command"
OP_COMMAND_SIGNAL = "command_signal"
# A comm message from the frontend, run like an execute (queued behind cells, with the same
# events, timeout and output cap): the handlers it calls (a slider moved) make output too.
OP_COMM = "comm"
# The answer to an input_request, handed at once to the execute that waits for it.
OP_INPUT_REPLY = "input_reply"
# Before a checkpoint: write every file's data the sandbox's kernel still caches to the
# host's disk (under gVisor the Sentry caches file data; a checkpoint keeps that cache in
# the image, not on disk, and a restore that finds the disk older drops it).
OP_SYNC = "sync"
# State by value (runtime/saving.py): write the user namespace to a file in /workspace, or
# load one; queued behind cells, so a save sees the namespace between two of them.
OP_SAVE = "save"
OP_RESTORE = "restore"
OPS = frozenset({OP_EXECUTE, OP_INTERRUPT, OP_PING, OP_COMPLETE, OP_INSPECT, OP_IS_COMPLETE,
                 OP_COMMAND, OP_COMMAND_SIGNAL, OP_COMM, OP_INPUT_REPLY, OP_SYNC, OP_SAVE, OP_RESTORE})

# Bounds of what the frontend sends in (checked by the API) and the sandbox sends out.
PROMPT_MAX_CHARS = 4096        # an input_request's prompt (longer ones are cut)
INPUT_MAX_CHARS = 1024 * 1024  # an answer to input()
USER_EXPRESSIONS_MAX = 64      # user_expressions in one execute request
COMM_BUFFERS_MAX = 16          # binary buffers of one comm message (base64 strings)
NAME_MAX_CHARS = 256           # a comm's id, target name and target module

# ------------------------------------------------------------------ done statuses
OK = "ok"
ABORTED = "aborted"
DONE_STATUSES = frozenset({OK, ERROR, ABORTED})  # ERROR is both an event type and a status


# ------------------------------------------------------------------- end reasons
class Reason:
    """Why a cell did not end by itself, or why a sandbox ended.

    ``ename`` is the exception name a notebook shows when no error event said more,
    ``text`` the words a user reads, ``fatal`` whether the sandbox (and its variables) is gone.
    """

    __slots__ = ("name", "ename", "text", "fatal")

    def __init__(self, name: str, ename: str, text: str, fatal: bool):
        self.name, self.ename, self.text, self.fatal = name, ename, text, fatal

    def __repr__(self) -> str:
        return f"Reason({self.name!r})"


INTERRUPTED = "interrupted"
TIMEOUT_INTERRUPTED = "timeout_interrupted"
TIMEOUT_KILLED = "timeout_killed"
OOM = "oom"
PIDS = "pids"
CRASHED = "crashed"
PROTOCOL = "protocol"
SERVER_SHUTDOWN = "server_shutdown"
FAILED_TO_START = "failed_to_start"
KILLED = "killed"
# A gateway's words for a sandbox whose node does not answer: for now (it may be restarting;
# the sandbox may still be there), or for good (the node is gone, and its sandboxes with it).
NODE_UNAVAILABLE = "node_unavailable"
NODE_GONE = "node_gone"
TIMEOUT = "timeout"  # a command ran past its timeout and was stopped (SIGTERM, then SIGKILL)
CLIENT_DISCONNECTED = "client_disconnected"  # a command's caller went away, so it was stopped
# EXPIRED, DELETED and LOST are reasons as well as states (defined below with the states).

_LOST_VARS = "its variables are lost"
REASONS: dict[str, Reason] = {r.name: r for r in (
    Reason(INTERRUPTED, "KeyboardInterrupt", "the cell was interrupted", False),
    Reason(TIMEOUT_INTERRUPTED, "TimeoutError", "the cell hit its time limit and was interrupted; variables are kept", False),
    Reason(TIMEOUT_KILLED, "SandboxDied",
           f"the cell hit its time limit and ignored the interrupt, so the sandbox was killed; {_LOST_VARS}", True),
    Reason(OOM, "SandboxDied", f"the sandbox ran out of memory and was killed; {_LOST_VARS}", True),
    Reason(PIDS, "SandboxDied", f"the sandbox hit its process limit and was killed; {_LOST_VARS}", True),
    Reason(CRASHED, "SandboxDied", f"the sandbox's Python process crashed; {_LOST_VARS}", True),
    Reason(PROTOCOL, "SandboxDied",
           f"the sandbox broke the protocol of its control channel and was stopped; {_LOST_VARS}", True),
    Reason(SERVER_SHUTDOWN, "SandboxAborted", "the sandbox server shut down during the cell", False),
    Reason(FAILED_TO_START, "SandboxDied", "the sandbox could not start", True),
    Reason(KILLED, "SandboxDied", f"the sandbox was killed; {_LOST_VARS}", True),
    Reason(NODE_UNAVAILABLE, "NodeUnavailable", "the node that holds the sandbox stopped answering during the cell; "
           "the cell's outcome is unknown", False),
    Reason(NODE_GONE, "NodeGone", f"the node that held the sandbox is gone; {_LOST_VARS}", True),
    Reason(TIMEOUT, "TimeoutError", "the command ran past its timeout and was stopped; the sandbox is kept", False),
    Reason(CLIENT_DISCONNECTED, "ConnectionError",
           "the command's caller went away, so the command was stopped; the sandbox is kept", False),
    Reason("expired", "SandboxExpired", f"the sandbox expired; {_LOST_VARS}", True),
    Reason("deleted", "SandboxDeleted", f"the sandbox was deleted; {_LOST_VARS}", True),
    Reason("lost", "SandboxLost", f"the sandbox's processes ended while the server was not running; {_LOST_VARS}", True),
)}

# ------------------------------------------------- node conditions (503 reasons)
# Why a node refuses a new sandbox (a gateway then places elsewhere); a full node says so
# with 409 capacity_exceeded.
NODE_DRAINING = "draining"

# ---------------------------------------------------------------- sandbox states
BOOTING = "booting"
POOLED = "pooled"
RUNNING = "running"
DEAD = "dead"
EXPIRED = "expired"
DELETED = "deleted"
LOST = "lost"
# A sandbox with no process whose next call brings it back under the same id, even after a
# host reboot: a gVisor one checkpointed to its state directory (its memory on disk; `runsc
# restore`), or a bwrap one put to sleep by value (its namespace in its owner's saves, its
# workspace on disk; a new runtime loads the save). The second carries ``BY_VALUE``.
PAUSED = "paused"
#: The field of a paused record that says it sleeps by value (sandbox/core/value_sleep.py):
#: the save it comes back from (id, bytes, saved and lost names); absent for a checkpoint.
BY_VALUE = "by_value"

#: Not ended: a paused sandbox is among them (it comes back), though nothing of it runs.
LIVE_STATES = frozenset({BOOTING, POOLED, RUNNING, PAUSED})
ENDED_STATES = frozenset({DEAD, EXPIRED, DELETED, LOST})
STATES = LIVE_STATES | ENDED_STATES

#: The allowed moves. An ended state is final; ``lost`` is what the server records for a
#: sandbox whose supervisor ended while no server was watching.
TRANSITIONS: dict[str, frozenset] = {
    BOOTING: frozenset({POOLED, RUNNING, DEAD, EXPIRED, DELETED, LOST}),
    POOLED: frozenset({RUNNING, DEAD, EXPIRED, DELETED, LOST}),
    RUNNING: frozenset({PAUSED, DEAD, EXPIRED, DELETED, LOST}),
    PAUSED: frozenset({RUNNING, DEAD, EXPIRED, DELETED, LOST}),
    DEAD: frozenset(),
    EXPIRED: frozenset(),
    DELETED: frozenset(),
    LOST: frozenset(),
}


class IllegalTransition(ValueError):
    """A state move the table does not allow (a bug in the caller, never silently applied)."""

    def __init__(self, old, new):
        super().__init__(f"illegal sandbox state move {old!r} -> {new!r}")
        self.old, self.new = old, new


def can_move(old: str, new: str) -> bool:
    return new in TRANSITIONS.get(old, ())


def advance(record: dict, new: str, **fields) -> dict:
    """Move ``record["state"]`` to ``new`` (and set ``fields``), or raise IllegalTransition."""
    old = record.get("state")
    if not can_move(old, new):
        raise IllegalTransition(old, new)
    record["state"] = new
    record.update(fields)
    return record


# ------------------------------------------------------------- isolation backends
BWRAP = "bwrap"    # bubblewrap: namespaces, seccomp and cgroups around a process on the host kernel
GVISOR = "gvisor"  # gVisor (runsc): a kernel of its own between the code and the host's; pausable
BACKENDS = (BWRAP, GVISOR)

#: What a sandbox's idle TTL does when it runs out (``on_idle`` at create): end it, or
#: pause it (gVisor only; a paused sandbox then lives on until its maximum lifetime).
ON_IDLE_DELETE = "delete"
ON_IDLE_PAUSE = "pause"
ON_IDLE = (ON_IDLE_DELETE, ON_IDLE_PAUSE)

#: Who paused a gVisor sandbox (``paused_by`` of its object): a caller (``POST .../pause``, a
#: fork taking its checkpoint, a kernel keeping its notebook's sandbox), its idle TTL running
#: out with ``on_idle: "pause"``, or idleness: the server's sleep-after (no call for
#: ``gvisor_sleep_after_seconds``; sandbox/core/sleeper.py). A sandbox paused by ``idle`` is
#: *asleep*: its TTL and maximum lifetime run on as if it were up.
PAUSED_BY_REQUEST = "request"
PAUSED_BY_TTL = "ttl"
PAUSED_BY_IDLE = "idle"
PAUSED_BY = (PAUSED_BY_REQUEST, PAUSED_BY_TTL, PAUSED_BY_IDLE)

#: Why a pause was refused (``reason`` of the 409): the sandbox is not a gVisor one, it is
#: busy (a cell or command running: a checkpoint mid-call could not be answered), it is not
#: running, or the checkpoint itself failed (the sandbox keeps running if it still can).
#: A fork (a checkpoint restored as a second sandbox) is refused with the same reasons.
PAUSE_NOT_SUPPORTED = "not_supported"
PAUSE_BUSY = "busy"
PAUSE_NOT_RUNNING = "not_running"
PAUSE_FAILED = "checkpoint_failed"
#: A pause asked only if the sandbox had no call for a while (the sleeper's), refused: one came since.
PAUSE_USED_SINCE = "used_since"
#: A paused sandbox whose checkpoint cannot be restored here (another runsc or image).
RESTORE_VERSION_MISMATCH = "version_mismatch"
PAUSE_REFUSALS = (PAUSE_NOT_SUPPORTED, PAUSE_BUSY, PAUSE_NOT_RUNNING, PAUSE_FAILED, PAUSE_USED_SINCE,
                  RESTORE_VERSION_MISMATCH)


# ----------------------------------------------------------------- event fields
class Kind:
    """What a field may hold. Kinds are names, not types, so that the edge check can
    tell a MIME bundle (``str`` keys, values any JSON) from a plain object."""

    STR = "str"
    INT = "int"            # an integer, never a bool
    NUMBER = "number"      # an int or a finite float
    BOOL = "bool"
    OBJECT = "object"      # a JSON object (any values)
    BUNDLE = "bundle"      # a MIME bundle: mime type -> str, or JSON for +json types
    STR_LIST = "str_list"  # a list of strings
    OBJECT_LIST = "object_list"  # a list of JSON objects


class FieldSpec:
    """One field of an event: its kind, whether it must be present, whether null is allowed,
    for strings the set of allowed values (``choices``), and ``max_len``: the most
    characters a string, or items a list, may hold (None: only the frame's size bounds it)."""

    __slots__ = ("kind", "required", "nullable", "choices", "max_len")

    def __init__(self, kind: str, required: bool = True, nullable: bool = False, choices=None,
                 max_len: int | None = None):
        self.kind, self.required, self.nullable = kind, required, nullable
        self.choices = frozenset(choices) if choices is not None else None
        self.max_len = max_len

    def __repr__(self) -> str:
        return f"FieldSpec({self.kind!r}, required={self.required}, nullable={self.nullable})"


_EXEC = {"exec": FieldSpec(Kind.STR, required=False, nullable=True)}  # the runtime's execution id
_BUNDLE = {"data": FieldSpec(Kind.BUNDLE), "metadata": FieldSpec(Kind.OBJECT, required=False)}

# Set on an output event whose content was cut to fit the output cap or the frame limit.
_CUT = {"truncated": FieldSpec(Kind.BOOL, required=False)}

#: The fields of each event as the runtime sends it. Unknown fields are a violation.
EVENT_FIELDS: dict[str, dict[str, FieldSpec]] = {
    STREAM: {**_EXEC, **_CUT, "name": FieldSpec(Kind.STR, choices=STREAM_NAMES), "text": FieldSpec(Kind.STR),
             # the runtime's own word about the cell (its output truncated), not the cell's
             # output: a notebook's kernel shows it as a note rather than as stderr
             "note": FieldSpec(Kind.BOOL, required=False)},
    DISPLAY_DATA: {**_EXEC, **_CUT, **_BUNDLE, "transient": FieldSpec(Kind.OBJECT, required=False)},
    UPDATE_DISPLAY_DATA: {**_EXEC, **_CUT, **_BUNDLE, "transient": FieldSpec(Kind.OBJECT, required=False)},
    EXECUTE_RESULT: {**_EXEC, **_CUT, **_BUNDLE, "execution_count": FieldSpec(Kind.INT, nullable=True)},
    CLEAR_OUTPUT: {**_EXEC, "wait": FieldSpec(Kind.BOOL, required=False)},
    ERROR: {**_EXEC, **_CUT, "ename": FieldSpec(Kind.STR), "evalue": FieldSpec(Kind.STR),
            "traceback": FieldSpec(Kind.STR_LIST)},
    DONE: {**_EXEC, "status": FieldSpec(Kind.STR, choices=DONE_STATUSES),
           "execution_count": FieldSpec(Kind.INT, nullable=True),
           "duration": FieldSpec(Kind.NUMBER, required=False),
           "truncated": FieldSpec(Kind.BOOL, required=False),
           "reason": FieldSpec(Kind.STR, required=False, nullable=True, choices=REASONS),
           # what ipykernel puts in the execute reply: pager text (`len?`), the next cell's
           # text (`%load`), and the values of the request's user_expressions
           "payload": FieldSpec(Kind.OBJECT_LIST, required=False),
           "user_expressions": FieldSpec(Kind.OBJECT, required=False)},
    INPUT_REQUEST: {**_EXEC, "prompt": FieldSpec(Kind.STR, max_len=PROMPT_MAX_CHARS),
                    "password": FieldSpec(Kind.BOOL)},
    **{kind: {**_EXEC, "comm_id": FieldSpec(Kind.STR, max_len=NAME_MAX_CHARS), "data": FieldSpec(Kind.OBJECT),
              "metadata": FieldSpec(Kind.OBJECT, required=False),
              "buffers": FieldSpec(Kind.STR_LIST, required=False, max_len=COMM_BUFFERS_MAX),
              "target_name": FieldSpec(Kind.STR, required=False, max_len=NAME_MAX_CHARS),
              "target_module": FieldSpec(Kind.STR, required=False, nullable=True, max_len=NAME_MAX_CHARS)}
       for kind in COMM_MESSAGES},
    COMMAND_DONE: {"exec": FieldSpec(Kind.STR), "exit_code": FieldSpec(Kind.INT, nullable=True),
                   "signal": FieldSpec(Kind.INT, nullable=True), "duration": FieldSpec(Kind.NUMBER),
                   "truncated": FieldSpec(Kind.BOOL), "error": FieldSpec(Kind.STR, nullable=True)},
    READY: {"pid": FieldSpec(Kind.INT), "python": FieldSpec(Kind.STR),
            "preloaded": FieldSpec(Kind.STR_LIST), "preload_failed": FieldSpec(Kind.STR_LIST)},
}

#: The fields of the runtime's answers to requests (``type: reply``), all but ``id`` optional.
REPLY_FIELDS: dict[str, FieldSpec] = {
    "id": FieldSpec(Kind.INT, nullable=True),
    "ok": FieldSpec(Kind.BOOL, required=False),
    "error": FieldSpec(Kind.STR, required=False),
    "interrupted": FieldSpec(Kind.BOOL, required=False),
    "matches": FieldSpec(Kind.STR_LIST, required=False),
    "cursor_start": FieldSpec(Kind.INT, required=False),
    "cursor_end": FieldSpec(Kind.INT, required=False),
    "metadata": FieldSpec(Kind.OBJECT, required=False),
    "found": FieldSpec(Kind.BOOL, required=False),
    "data": FieldSpec(Kind.BUNDLE, required=False),
    "status": FieldSpec(Kind.STR, required=False, choices=("complete", "incomplete", "invalid", "unknown")),
    "indent": FieldSpec(Kind.STR, required=False),
    # a save's or restore's summary (runtime/saving.py); the host keeps only what it checked
    "saved_state": FieldSpec(Kind.OBJECT, required=False),
}


def is_json_mime(mime: str) -> bool:
    """MIME types whose value in a bundle is JSON (an object or array), not a string."""
    return mime == "application/json" or mime.endswith("+json")


#: Fields the host adds to ``done`` on its way out (the runtime never sends them).
DONE_EXTRA_FIELDS: dict[str, FieldSpec] = {
    "expires_at": FieldSpec(Kind.STR, required=False, nullable=True),
    "sandbox_state": FieldSpec(Kind.STR, required=False, choices=STATES),
    # a cell's done: its sandbox's memory now and at its peak, and CPU time, after the cell
    "usage": FieldSpec(Kind.OBJECT, required=False),
    # a command's done
    "exit_code": FieldSpec(Kind.INT, required=False, nullable=True),
    "signal": FieldSpec(Kind.INT, required=False, nullable=True),
    "timed_out": FieldSpec(Kind.BOOL, required=False),
    "message": FieldSpec(Kind.STR, required=False, nullable=True),
}


# ------------------------------------------------------------------ constructors
def stream_event(name: str, text: str, exec_id: str | None = None, note: bool = False) -> dict:
    event = {"type": STREAM, "name": name, "text": text}
    if exec_id is not None:
        event["exec"] = exec_id
    if note:
        event["note"] = True
    return event


def error_event(ename: str, evalue: str, traceback=None, exec_id: str | None = None) -> dict:
    """An ``error`` event; with no traceback, a one-line one naming the error, so that a
    front end that shows only the traceback still shows why."""
    tb = [str(line) for line in traceback] if traceback else [f"{ename}: {evalue}"]
    event = {"type": ERROR, "ename": str(ename), "evalue": str(evalue), "traceback": tb}
    if exec_id is not None:
        event["exec"] = exec_id
    return event


def reason_error_event(reason: str, message: str | None = None) -> dict:
    """The ``error`` event for a cell that ended for ``reason`` (``message`` says more)."""
    known = REASONS.get(reason)
    ename = known.ename if known else "SandboxError"
    text = message or (known.text if known else f"the cell ended ({reason})")
    return error_event(ename, text)


def done_event(status: str, *, execution_count=None, duration: float = 0.0, truncated: bool = False,
               reason: str | None = None, exec_id: str | None = None, **extra) -> dict:
    """The one ``done`` event of an execute. ``extra`` holds host-added fields
    (``expires_at``, ``sandbox_state``) and fields of endpoints that add their own
    (listed in ``DONE_EXTRA_FIELDS``)."""
    if status not in DONE_STATUSES:
        raise ValueError(f"unknown done status {status!r}")
    if reason is not None and reason not in REASONS:
        raise ValueError(f"unknown end reason {reason!r}")
    event = {"type": DONE, "status": status, "execution_count": execution_count,
             "duration": duration, "truncated": bool(truncated), "reason": reason}
    if exec_id is not None:
        event["exec"] = exec_id
    event.update(extra)
    return event


def command_done_event(*, exit_code: int | None, signal: int | None, timed_out: bool, reason: str | None,
                       message: str | None, duration: float, truncated: bool, **extra) -> dict:
    """The one ``done`` of a command: ``status`` ok for exit code 0 (and no timeout), else
    error; no ``execution_count``, since a command is not a cell."""
    status = OK if exit_code == 0 and not timed_out else ERROR
    event = done_event(status, duration=duration, truncated=truncated, reason=reason,
                       exit_code=exit_code, signal=signal, timed_out=bool(timed_out), message=message, **extra)
    del event["execution_count"]
    return event
