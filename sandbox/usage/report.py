"""The usage report an operator reads: usage records summed per user, image and day
(`sandbox-kernel usage`), as a table, CSV or JSON; and the usage columns of a sandbox list.

A record is counted on the day its sandbox was created (UTC): records hold running totals,
not samples per day, so a sandbox alive across midnight is billed to the day it began.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import date, datetime, timezone

from .meter import NOT_MEASURED, PROCESS_FIGURES

GROUP_BY = ("owner", "image", "day")
SUMMED = ("cpu_seconds", "memory_gib_hours", "disk_gib_hours", "egress_bytes_in", "egress_bytes_out", "executes",
          "commands", "alive_seconds")
COLUMNS = GROUP_BY + ("sandboxes",) + SUMMED + ("memory_peak_bytes",)
# One sandbox per line (``--records``); "node" when the records came through a gateway.
RECORD_COLUMNS = ("node", "sandbox_id", "owner", "image", "tier", "created_at", "ended_at", "end_reason") + SUMMED + (
    "memory_peak_bytes",)
# Columns that count things (the store keeps every total as REAL): shown as integers.
COUNTED = ("sandboxes", "executes", "commands", "egress_bytes_in", "egress_bytes_out", "memory_peak_bytes",
           "memory_mb", "disk_mb", "pids")
# Decimals kept of a measure: the float sums' noise (2723.822000000001 s) is no figure of ours.
DECIMALS = {"_seconds": 2, "_gib_hours": 6}


def parse_since(text: str | None) -> str | None:
    """An ISO date or date-time as the store compares it; ValueError with what is wanted."""
    if not text:
        return None
    try:
        if len(text) == 10:
            return date.fromisoformat(text).isoformat()
        return datetime.fromisoformat(text.replace("Z", "+00:00")).isoformat().replace("+00:00", "Z")
    except ValueError:
        raise ValueError(f"since {text!r}: give a date (2026-12-01) or a time (2026-12-01T08:00:00Z)") from None


def summarise(records: list[dict], by: tuple[str, ...] = GROUP_BY) -> list[dict]:
    """One row per group: the number of sandboxes, the sums, and the highest peak memory. A
    figure no sandbox of the group had measured stays None ("not measured"), never 0."""
    rows: dict[tuple, dict] = {}
    for record in records:
        fields = {**record, "day": (record.get("created_at") or "")[:10] or "unknown"}
        key = tuple(fields.get(name) or "" for name in by)
        row = rows.setdefault(key, {**dict(zip(by, key)), "sandboxes": 0,
                                    **{n: None if n in PROCESS_FIGURES else 0 for n in SUMMED},
                                    "memory_peak_bytes": None})
        row["sandboxes"] += 1
        for name in SUMMED:
            if record.get(name) is not None:
                row[name] = (row[name] or 0) + record[name]
        if record.get("memory_peak_bytes") is not None:
            row["memory_peak_bytes"] = max(row["memory_peak_bytes"] or 0, record["memory_peak_bytes"])
    return [rows[key] for key in sorted(rows)]


def unmeasured(records: list[dict]) -> str | None:
    """A line naming the sandboxes whose CPU and memory nothing could read (their figures
    are not in the sums), or None when every one was measured."""
    ids = [r.get("sandbox_id") or "?" for r in records if r.get("measured_by") == NOT_MEASURED]
    if not ids:
        return None
    return (f"CPU and memory not measured for {len(ids)} sandbox(es) ({', '.join(ids[:5])}"
            f"{', …' if len(ids) > 5 else ''}): neither a cgroup nor their processes could be read; their "
            "figures are not in these sums")


def tidy(row: dict) -> dict:
    """The row as a report shows it: counts as integers, times and GiB-hours rounded."""
    out = dict(row)
    for name, value in row.items():
        if not isinstance(value, float):
            continue
        if name in COUNTED:
            out[name] = int(round(value))
        for suffix, decimals in DECIMALS.items():
            if name.endswith(suffix):
                out[name] = round(value, decimals)
    return out


def staleness(records: list[dict], now: datetime | None = None) -> str:
    """How old a report's figures can be, in a line: a live sandbox's supervisor writes its
    record every ``usage_record_seconds`` (60 by default), so its figures lag its use by up
    to that (and one younger than that has none yet); an ended sandbox's are final."""
    times = []
    for record in records:
        if record.get("ended_at") or not record.get("updated_at"):
            continue
        try:
            when = datetime.fromisoformat(record["updated_at"].replace("Z", "+00:00"))
        except ValueError:
            continue
        times.append(when if when.tzinfo else when.replace(tzinfo=timezone.utc))
    now = now or datetime.now(timezone.utc)
    oldest = f"; the oldest here was written {int((now - min(times)).total_seconds())} s ago" if times else ""
    return ("live sandboxes' figures are as of their last record, written every usage_record_seconds (60 s "
            f"unless the server sets another), so they lag by up to that{oldest}; ended sandboxes' are final")


def columns_of(rows: list[dict], columns: tuple[str, ...] = COLUMNS) -> list[str]:
    """The columns of ``columns`` that the rows have (a record through a gateway has "node")."""
    return [c for c in columns if any(c in row for row in rows)] if rows else list(columns)


def render(rows: list[dict], fmt: str, columns: tuple[str, ...] = COLUMNS) -> str:
    """``rows`` (sums, or records with RECORD_COLUMNS) as CSV or JSON; the terminal's table
    is the CLI's (sandbox/cli/sandboxes.py)."""
    rows = [tidy(row) for row in rows]
    if fmt == "json":
        return json.dumps(rows, indent=1)
    out = io.StringIO()
    writer = csv.DictWriter(out, columns_of(rows, columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
