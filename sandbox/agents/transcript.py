"""What an agent is shown of one run: its text in order, its real error, its figures.

Agent frameworks judge a run by its streams: ADK counts any ``stderr`` as a failed run and
gives up after two, a function-calling loop hands ``stderr`` to the model as the error. So a
warning printed on stderr (pandas' FutureWarning, a progress bar) goes with the text here,
in the order it was produced, and ``stderr`` holds only what made the run fail: the
exception, a timeout, or the sandbox ending.

Everything here came out of a sandbox and is untrusted: the text is capped (head and tail
kept, the cut said), ANSI colour codes are removed, and a figure is kept only if its base64
decodes and it is within the size and count caps.
"""

from __future__ import annotations

import base64
import binascii
import re
import typing as t
from dataclasses import dataclass, field

from ..client import Execution, SandboxError
from ..runtime import vocabulary as V

# What a model can use of one run: the head says what happened, the tail how it ended.
MAX_TEXT_CHARS = 20_000
MAX_FIGURES = 10
MAX_FIGURE_BYTES = 5 * 1024 * 1024
FIGURE_TYPES = {"image/png": "png", "image/jpeg": "jpg"}
# The most a read_file tool brings into the agent's process, by the file's apparent size (a
# sparse file that uses nothing in the sandbox still streams whole): the server's
# file_max_bytes bounds every download, this bounds what an agent holds in memory at once.
READ_MAX_BYTES = 4 * 1024 * 1024
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def clean(text: str) -> str:
    return ANSI_RE.sub("", text)


def read_refusal(exc: "SandboxError") -> str | None:
    """The words for a read refused as too large (the model can act on them), else None."""
    if getattr(exc, "code", None) != "too_large":
        return None
    return (f"{exc.message}; read_file returns files of up to {READ_MAX_BYTES} bytes: look at a part of it "
            "with run_code (e.g. open(path).read(10000))")


def agent_usage(info: t.Any) -> dict[str, t.Any]:
    """What an agent is told of a sandbox's resource use (MCP's ``list_sandboxes``, ADK's
    ``sandbox_usage``): enough for a model to see memory running out before the
    out-of-memory end wipes its variables. A figure the server has not sampled, or could not
    measure, is None, and ``measured_by`` says which ("not measured": no cgroup nor process
    tree could be read), never a 0 the model would trust."""
    usage = info.usage or {}
    return {k: usage.get(k) for k in ("cpu_seconds", "memory_bytes", "memory_peak_bytes", "disk_bytes",
                                      "measured_by")} | {
        "memory_limit_bytes": info.limits.memory_mb * 1024 * 1024 if info.limits.memory_mb else None}


def cap(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """At most ``limit`` characters: the head and the tail, with the cut said in between."""
    if len(text) <= limit:
        return text
    keep = max(limit // 2 - 40, 0)
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters cut ...]\n{text[len(text) - keep:]}"


@dataclass(frozen=True)
class Figure:
    name: str
    mime_type: str
    data: bytes


@dataclass
class Transcript:
    """Collects a run's events in arrival order (pass ``on_event=transcript.add`` to
    ``run_code``); ``finish`` turns them, with the finished Execution, into what the agent sees."""

    max_chars: int = MAX_TEXT_CHARS
    max_figures: int = MAX_FIGURES
    max_figure_bytes: int = MAX_FIGURE_BYTES
    figure_prefix: str = "figure"
    parts: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    dropped_figures: int = 0

    def add(self, event: dict[str, t.Any]) -> None:
        kind = event.get("type")
        if kind == V.STREAM:
            self.parts.append(str(event.get("text", "")))
        elif kind in (V.EXECUTE_RESULT, V.DISPLAY_DATA):
            data = event.get("data") if isinstance(event.get("data"), dict) else {}
            figure = self._figure(data)
            if figure is not None:
                self.parts.append(f"[figure: {figure.name}]\n")
            elif isinstance(data.get("text/plain"), str):
                self.parts.append(data["text/plain"] + "\n")

    def _figure(self, data: dict[str, t.Any]) -> Figure | None:
        for mime, ext in FIGURE_TYPES.items():
            encoded = data.get(mime)
            if not isinstance(encoded, str):
                continue
            if len(self.figures) >= self.max_figures or len(encoded) > self.max_figure_bytes * 4 // 3 + 4:
                self.dropped_figures += 1
                return None
            try:
                raw = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                return None
            figure = Figure(f"{self.figure_prefix}_{len(self.figures) + 1}.{ext}", mime, raw)
            self.figures.append(figure)
            return figure
        return None

    def finish(self, execution: Execution) -> tuple[int, str, str]:
        """(exit_code, text, error) of the run: exit code 0 only for a cell that ended by
        itself without an exception."""
        text = clean("".join(self.parts))
        if self.dropped_figures:
            text += f"[{self.dropped_figures} more figure(s) not returned: over the cap]\n"
        if execution.truncated:
            text += "[output truncated by the sandbox server's output cap]\n"
        error = ""
        if execution.error is not None:
            lines = [clean(line) for line in execution.error.traceback] or [str(execution.error)]
            error = "\n".join(lines)
            if str(execution.error) not in error:
                error += f"\n{execution.error}"
        elif not execution.ok:
            error = f"execution ended: {execution.reason or execution.status or 'no result'}"
        if execution.sandbox_state == V.DEAD:
            error += ("\nthe sandbox did not survive this run"
                      f" ({execution.reason or 'ended'}): variables and files are gone")
        exit_code = 0 if execution.ok and not error else 1
        return exit_code, cap(text, self.max_chars), cap(error.strip() + "\n" if error else "", self.max_chars)
