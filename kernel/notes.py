"""The kernel's notes to the reader: ordinary output, never stderr.

What the kernel tells the person at the notebook about its sandbox (a kept sandbox taken
back, a sandbox replaced, memory near the limit, output cut at the cap, a cell's time
limit, a part of an output that was withheld) is information, not an error. On stderr
JupyterLab draws it on the error background, as if the cell had failed, and tools that
read stderr as trouble count it as one. So every note is a `display_data` message, as
ipykernel sends for `display()`: `text/plain` for consoles, nbval and saved notebooks, and
a quiet styled `text/html` for the page. The HTML is shown in an isolated frame, like every
other HTML the kernel sends: a note can quote things the sandbox or the server said (a
reason, an id), and quoting must never give them the page.

One function makes the message (`note_message`); everything that shows a note calls it, so
there is one look and one rule for all of them.
"""

from __future__ import annotations

import html
import typing as t

from .frames import framed_html

# A note's look in the page: dark grey on a light grey block with a blue rule at the left,
# an aside rather than an alarm. The block brings its own background, so the note reads the
# same on JupyterLab's light and dark themes (the frame's page is transparent).
STYLE = (
    "margin: 0; padding: 2px 8px; border-left: 3px solid #2196f3; color: #212121; background: #eef2f6; "
    "font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; font-size: 12px; white-space: pre-wrap;"
)


NOTE_CLASS = "sandbox-kernel-note"


def note_html(text: str) -> str:
    """The note's HTML (escaped text in a styled block), framed as all HTML is."""
    body = f'<div class="{NOTE_CLASS}" style="{STYLE}">{html.escape(text.rstrip())}</div>'
    return framed_html("text/html", body)


def note_message(text: str) -> tuple[str, dict[str, t.Any]]:
    """The IOPub message that shows `text` as a note: (msg_type, content)."""
    plain = text if text.endswith("\n") else text + "\n"
    return "display_data", {
        "data": {"text/plain": plain, "text/html": note_html(plain)},
        "metadata": {},
        "transient": {},
    }


class _Sends(t.Protocol):
    def send(self, msg_type: str, content: dict[str, t.Any]) -> None: ...


def show_note(out: _Sends, text: str) -> None:
    """Publish `text` as a note in the cell that `out` belongs to."""
    out.send(*note_message(text))


def is_note(content: dict[str, t.Any]) -> bool:
    """Whether a display_data content is one of the kernel's notes (for tools and tests that
    tell notes from the cell's own output)."""
    data = content.get("data") or {}
    return isinstance(data.get("text/html"), str) and f"{NOTE_CLASS}&quot;" in data["text/html"]
