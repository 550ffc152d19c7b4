"""Whether a kernel's outputs go through the output policy, and how `%sandbox` says so."""

from __future__ import annotations

from .config import SandboxSettings
from .host import host_cells_enabled


def passthrough(settings: SandboxSettings) -> bool:
    """Outputs skip the output policy only if the user asked for it and host cells are on
    (off means cells may be written by something other than the user)."""
    return bool(settings.unsafe_trust_sandbox_outputs) and host_cells_enabled()


def describe(settings: SandboxSettings) -> str:
    """What `%sandbox` says about outputs."""
    if passthrough(settings):
        return "UNFILTERED: HTML and JavaScript run in this page with your rights (unsafe_trust_sandbox_outputs)"
    mode = "isolated: HTML/JS/SVG/Markdown in sandboxed frames, images checked, metadata filtered"
    if settings.unsafe_trust_sandbox_outputs:
        mode += " (pass-through ignored: host cells are off)"
    return mode
