"""What the server answers, as objects: a sandbox's description, a workspace listing, and
the records that `run_code` and `commands.run` fold their event streams into."""

from __future__ import annotations

import dataclasses
import typing as t
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..common import filenames
from ..runtime import vocabulary as V


def _parse_time(value: t.Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Limits:
    """Resource limits in force for a sandbox (None where the server did not say)."""

    memory_mb: int | None = None
    cpus: float | None = None
    pids: int | None = None
    disk_mb: int | None = None
    output_bytes: int | None = None
    file_bytes: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, t.Any] | None) -> Limits:
        data = data or {}
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class SandboxInfo:
    """The sandbox object as the server last described it.

    `isolation` stays a dict because its keys depend on the isolation backend; `raw` keeps
    the whole object so that fields newer than this client are not lost.
    """

    id: str
    state: str
    image: str | None = None
    created_at: datetime | None = None
    expires_at: datetime | None = None
    max_expires_at: datetime | None = None
    ttl_seconds: int | None = None
    execution_count: int = 0
    executing: bool = False
    limits: Limits = field(default_factory=Limits)
    isolation: dict[str, t.Any] = field(default_factory=dict)
    from_pool: bool | None = None
    dead_reason: str | None = None
    metadata: dict[str, t.Any] = field(default_factory=dict)
    forked_from: str | None = None  # the sandbox this one was forked from (gvisor)
    # gvisor: who paused it ("request", "ttl", or "idle": asleep), when, and when a running one
    # will be put to sleep if no call comes (None: it will not)
    paused_by: str | None = None
    paused_at: datetime | None = None
    sleeps_at: datetime | None = None
    # What it uses (docs/api.md, `usage`): cpu_seconds, memory_bytes, memory_peak_bytes, disk_bytes, ...
    usage: dict[str, t.Any] = field(default_factory=dict)
    # A create's from_save: what came back, what did not (name, type, why), the save and its age
    restored: dict[str, t.Any] | None = None
    raw: dict[str, t.Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, t.Any]) -> SandboxInfo:
        return cls(
            id=data["id"],
            state=data.get("state", "unknown"),
            image=data.get("image"),
            created_at=_parse_time(data.get("created_at")),
            expires_at=_parse_time(data.get("expires_at")),
            max_expires_at=_parse_time(data.get("max_expires_at")),
            ttl_seconds=data.get("ttl_seconds"),
            execution_count=data.get("execution_count") or 0,
            executing=bool(data.get("executing")),
            limits=Limits.from_dict(data.get("limits")),
            isolation=dict(data.get("isolation") or {}),
            from_pool=data.get("from_pool"),
            dead_reason=data.get("dead_reason"),
            metadata=dict(data.get("metadata") or {}),
            forked_from=data.get("forked_from"),
            paused_by=data.get("paused_by"),
            paused_at=_parse_time(data.get("paused_at")),
            sleeps_at=_parse_time(data.get("sleeps_at")),
            usage=dict(data.get("usage") or {}),
            restored=data.get("restored") if isinstance(data.get("restored"), dict) else None,
            raw=dict(data),
        )

    def ttl_left(self, now: datetime | None = None) -> float | None:
        """Seconds until the sandbox expires if left idle (0 once past), or None if unknown.

        Computed from `expires_at` as last seen: run code or `refresh()` for a fresh figure.
        """
        if self.expires_at is None:
            return None
        now = now or datetime.now(timezone.utc)
        return max(0.0, (self.expires_at - now).total_seconds())


@dataclass(frozen=True)
class FileInfo:
    """One entry of a workspace listing. `path` is the escaped spelling the files calls
    take back (see sandbox/common/filenames.py); `raw_path` is the name's bytes."""

    path: str
    size: int | None = None
    type: str = "file"
    modified: datetime | None = None

    @property
    def raw_path(self) -> bytes:
        return filenames.unescape(self.path)

    @classmethod
    def from_dict(cls, data: dict[str, t.Any]) -> FileInfo:
        return cls(
            path=data["path"],
            size=data.get("size"),
            type=data.get("type", "file"),
            modified=_parse_time(data.get("modified")),
        )


class FileList(list):
    """A workspace listing: a list of FileInfo that also says whether the server cut it
    short (`truncated`, at `limit` entries)."""

    def __init__(self, files: t.Iterable[FileInfo] = (), truncated: bool = False, limit: int | None = None) -> None:
        super().__init__(files)
        self.truncated = truncated
        self.limit = limit

    @classmethod
    def from_body(cls, body: dict[str, t.Any]) -> FileList:
        return cls((FileInfo.from_dict(f) for f in body.get("files", [])), bool(body.get("truncated")), body.get("limit"))


@dataclass
class ExecutionError:
    """The exception a cell raised, as IPython formatted it."""

    ename: str
    evalue: str
    traceback: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.ename}: {self.evalue}"


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)")


@dataclass(repr=False)
class Execution:
    """Everything one `run_code` call produced, gathered from the event stream.

    `results` holds the MIME bundles of `execute_result` events (the cell's value),
    `display` those of `display_data` and `update_display_data`. `status` is the server's
    `ok`, `error` or `aborted`; `reason` says why a cell did not end by itself
    (`interrupted`, `timeout_killed`, `oom`, ...); `sandbox_state` is `dead` when the
    sandbox did not survive the cell.
    """

    stdout: str = ""
    stderr: str = ""
    results: list[dict[str, t.Any]] = field(default_factory=list)
    display: list[dict[str, t.Any]] = field(default_factory=list)
    error: ExecutionError | None = None
    status: str | None = None
    execution_count: int | None = None
    duration: float | None = None
    reason: str | None = None
    truncated: bool = False
    sandbox_state: str | None = None
    expires_at: datetime | None = None
    # As ipykernel's execute reply: pager text (`len?`), `%load`'s next input...
    payload: list[dict[str, t.Any]] = field(default_factory=list)
    # ... and the values of the request's user_expressions (MIME bundles, or errors).
    user_expressions: dict[str, t.Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == V.OK and self.error is None

    def __repr__(self) -> str:
        """A summary, not the outputs: a figure's base64 PNG would fill the screen. The
        fields themselves hold everything."""
        parts = [f"status={self.status!r}", f"execution_count={self.execution_count}"]
        if self.text is not None:
            parts.append(f"text={_short(self.text)}")
        parts += [f"{name}={_short(value)}" for name, value in (("stdout", self.stdout), ("stderr", self.stderr))
                  if value]
        if self.display:
            parts.append("display=[" + ", ".join("|".join(sorted(b)) for b in self.display) + "]")
        if self.error is not None:
            parts.append(f"error={_short(str(self.error))}")
        if self.reason:
            parts.append(f"reason={self.reason!r}")
        if self.duration is not None:
            parts.append(f"duration={self.duration:.2f}s")
        return f"Execution({', '.join(parts)})"

    @property
    def text(self) -> str | None:
        """The `text/plain` form of the cell's value, the way a REPL would echo it."""
        for bundle in reversed(self.results):
            if "text/plain" in bundle:
                return bundle["text/plain"]
        return None

    def _apply(self, event: dict[str, t.Any]) -> None:
        kind = event.get("type")
        if kind == V.STREAM:
            if event.get("name") == V.STDERR:
                self.stderr += event.get("text", "")
            else:
                self.stdout += event.get("text", "")
        elif kind == V.EXECUTE_RESULT:
            self.results.append(event.get("data") or {})
        elif kind in (V.DISPLAY_DATA, V.UPDATE_DISPLAY_DATA):
            self.display.append(event.get("data") or {})
        elif kind == V.ERROR:
            # The first error is the cell's: later ones (if any) are consequences.
            if self.error is None:
                self.error = ExecutionError(
                    event.get("ename", "Error"), event.get("evalue", ""), list(event.get("traceback") or [])
                )
        elif kind == V.DONE:
            self.status = event.get("status")
            self.execution_count = event.get("execution_count")
            self.duration = event.get("duration")
            self.reason = event.get("reason")
            self.truncated = bool(event.get("truncated"))
            self.sandbox_state = event.get("sandbox_state")
            self.expires_at = _parse_time(event.get("expires_at"))
            self.payload = list(event.get("payload") or [])
            self.user_expressions = dict(event.get("user_expressions") or {})


@dataclass
class CommandResult:
    """What one `commands.run` call produced: the program's exit and its output.

    `exit_code` is the program's exit status, or None when it did not exit by itself: it
    was killed by a signal (`signal` says which; a timeout or an interrupt ends that way
    unless the program catches the signal) or the sandbox ended under it. `timed_out` is
    True when the command ran past its timeout; `reason` says why a command was stopped
    (`timeout`, `interrupted`, `client_disconnected`, `server_shutdown`, or the sandbox's
    end reason such as `deleted` or `oom`), and `message` explains in words. stdout and
    stderr are text (UTF-8, undecodable bytes replaced).
    """

    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration: float = 0.0
    signal: int | None = None
    reason: str | None = None
    message: str | None = None
    truncated: bool = False
    command_id: str | None = None
    sandbox_state: str | None = None
    expires_at: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def _apply(self, event: dict[str, t.Any]) -> None:
        kind = event.get("type")
        if kind == V.START:
            self.command_id = event.get("command_id")
        elif kind == V.STREAM:
            if event.get("name") == V.STDERR:
                self.stderr += event.get("text", "")
            else:
                self.stdout += event.get("text", "")
        elif kind == V.DONE:
            self.exit_code = event.get("exit_code")
            self.signal = event.get("signal")
            self.timed_out = bool(event.get("timed_out"))
            self.duration = float(event.get("duration") or 0.0)
            self.reason = event.get("reason")
            self.message = event.get("message")
            self.truncated = bool(event.get("truncated"))
            self.sandbox_state = event.get("sandbox_state")
            self.expires_at = _parse_time(event.get("expires_at"))



def info_after(info: SandboxInfo | None, execution: Execution) -> SandboxInfo | None:
    """Fold what a `done` event says about the sandbox into its last-seen info, so that
    `info.ttl_left()` stays right without another request."""
    if info is None:
        return None
    changes: dict[str, t.Any] = {}
    if execution.expires_at is not None:
        changes["expires_at"] = execution.expires_at
    if execution.execution_count is not None:
        changes["execution_count"] = execution.execution_count
    if execution.sandbox_state:
        changes["state"] = execution.sandbox_state
    return dataclasses.replace(info, **changes) if changes else info

