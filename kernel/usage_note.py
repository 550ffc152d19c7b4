"""What the notebook is told of its sandbox's resource use: the note after a cell whose
memory is near the limit (before the out-of-memory kill wipes the state, not after), the
peak an out-of-memory end reached, the usage lines of ``%sandbox``, and ``%sandbox
packages`` (the image's package list).

The figures come from the server: a cell's ``done`` carries its sandbox's memory after the
cell (``usage``: ``memory_bytes``, ``memory_peak_bytes``, ``cpu_seconds``), the sandbox
object the rest (docs/api.md, ``usage``).
"""

from __future__ import annotations

import typing as t

from sandbox.runtime import vocabulary as V
from sandbox.usage.meter import NOT_MEASURED

from .outputs import format_bytes, format_duration

# A cell that ends with more than this share of memory_mb in use gets the note.
MEMORY_WARNING_SHARE = 0.8
ADVICE = ("free what you no longer need (del big_frame; import gc; gc.collect()), or restart the kernel with a "
          "larger memory limit (SANDBOX_KERNEL_MEMORY_MB=2048, or c.SandboxSettings.memory_mb) and run the "
          "notebook again")


def after_cell(done: dict[str, t.Any] | None, memory_mb: int | None,
               share: float = MEMORY_WARNING_SHARE) -> str | None:
    """The note a cell gets for its memory, or None: near the limit, or killed by it."""
    usage = (done or {}).get("usage") or {}
    if not memory_mb or not usage:
        return None
    limit = memory_mb * 1024 * 1024
    if (done or {}).get("reason") == V.OOM:
        peak = usage.get("memory_peak_bytes") or limit
        return (f"[sandbox: out of memory: the sandbox reached {format_bytes(peak)} of its "
                f"{format_bytes(limit)} limit and was killed; its variables are gone. Next time, {ADVICE}]\n")
    used = usage.get("memory_bytes")
    if used is None or used <= share * limit:  # None: not measured (%sandbox says so)
        return None
    return (f"[sandbox: memory at {format_bytes(used)} of {format_bytes(limit)} ({used * 100 // limit} %) after "
            f"this cell; past the limit the sandbox is killed and its variables lost. {ADVICE.capitalize()}]\n")


def usage_rows(usage: dict[str, t.Any] | None, memory_mb: int | None, disk_mb: int | None) -> list[tuple[str, str]]:
    """The ``%sandbox`` lines of what the sandbox uses (none when the server reports none)."""
    if not usage:
        return []
    disk = format_bytes(usage.get("disk_bytes")) + (f" of {format_bytes(disk_mb * 1024 * 1024)}" if disk_mb else "")
    if usage.get("memory_bytes") is None or usage.get("cpu_seconds") is None:
        # nothing could read them (no cgroup, no readable process tree): said, never a 0
        first = ("usage", f"memory and CPU {NOT_MEASURED} (neither a cgroup nor the sandbox's processes could be "
                          "read), so no note comes near the memory limit")
        second = ("", f"disk {disk}")
    else:
        memory = (f"{format_bytes(usage['memory_bytes'])} now, "
                  f"{format_bytes(usage.get('memory_peak_bytes') or usage['memory_bytes'])} at most")
        if memory_mb:
            memory += f", of {format_bytes(memory_mb * 1024 * 1024)}"
        first = ("usage", f"memory {memory}")
        second = ("", f"CPU {usage['cpu_seconds']:.1f} s, disk {disk}, {usage.get('processes') or 0} processes")
    return [
        first,
        second,
        ("", f"{usage.get('executes', 0)} cells and {usage.get('commands', 0)} commands in "
             f"{format_duration(usage.get('alive_seconds') or 0)} alive"
             + (f", {format_duration(usage['paused_seconds'])} paused" if usage.get("paused_seconds") else "")),
    ]


def packages_text(image: dict[str, t.Any]) -> str:
    """``%sandbox packages``: the image's packages, one a line (name, version, layer)."""
    packages = image.get("package_list") or []
    rows = [("NAME", "VERSION", "LAYER")] + [(p["name"], p["version"], p.get("layer") or "-") for p in packages]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    head = f"image {image.get('name')}: {len(packages)} packages (sandbox-kernel image inspect {image.get('name')} " \
           "--sbom FILE: its CycloneDX SBOM)\n"
    return head + "".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}\n" for r in rows)


def memory_limit(sbx: t.Any) -> int | None:
    """The sandbox's memory_mb as last seen (None before the client has seen it)."""
    try:
        return sbx.info.limits.memory_mb
    except RuntimeError:
        return None
