"""Usage records: one row per sandbox in an SQLite file in the state directory.

Who writes: each sandbox's supervisor, the one process that lives as long as its sandbox
and outlives server restarts. It upserts its row every ``interval`` seconds while the
sandbox lives and once more when it ends; the server writes a row only for a sandbox
whose supervisor died before its last write (found on re-adoption: state.json is then
the last word). A row holds running totals, never increments, so a write repeated after a
crash counts nothing twice; the totals only move forward (``MAX``), and an ended row keeps
its end, so a late or stale write cannot take anything back. A committed row survives a
kill -9 of any process (SQLite's journal); WAL lets the server read while supervisors write.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import sqlite3

from .meter import FIELDS, NOT_MEASURED, PROCESS_FIGURES

FILE_NAME = "usage.sqlite3"
BUSY_TIMEOUT = 10.0  # seconds a writer waits for another's transaction

# Columns of a record (docs/api.md, GET /v1/usage): who and what, then the totals.
IDENTITY = ("sandbox_id", "owner", "image", "tier", "memory_mb", "cpus", "disk_mb", "pids",
            "created_at", "ended_at", "end_reason")
TOTALS = ("cpu_seconds", "memory_peak_bytes", "memory_gib_hours", "disk_gib_hours", "egress_bytes_in",
          "egress_bytes_out", "executes", "commands", "alive_seconds", "paused_seconds")
COLUMNS = IDENTITY + TOTALS + ("updated_at", "measured_by")
assert set(TOTALS) - {"egress_bytes_in", "egress_bytes_out"} <= set(FIELDS)

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS usage_records (
    sandbox_id TEXT PRIMARY KEY, owner TEXT, image TEXT, tier TEXT,
    memory_mb INTEGER, cpus REAL, disk_mb INTEGER, pids INTEGER,
    created_at TEXT, ended_at TEXT, end_reason TEXT,
    {", ".join(f"{name} REAL NOT NULL DEFAULT 0" for name in TOTALS)},
    updated_at TEXT, measured_by TEXT
)"""
# A store made before measured_by was recorded gets the column (its rows: NULL, as measured).
ADD_MEASURED_BY = "ALTER TABLE usage_records ADD COLUMN measured_by TEXT"

UPSERT = f"""
INSERT INTO usage_records ({", ".join(COLUMNS)}) VALUES ({", ".join("?" for _ in COLUMNS)})
ON CONFLICT(sandbox_id) DO UPDATE SET
    owner = excluded.owner, image = excluded.image, tier = excluded.tier,
    memory_mb = excluded.memory_mb, cpus = excluded.cpus, disk_mb = excluded.disk_mb, pids = excluded.pids,
    created_at = COALESCE(usage_records.created_at, excluded.created_at),
    ended_at = COALESCE(usage_records.ended_at, excluded.ended_at),
    end_reason = COALESCE(usage_records.end_reason, excluded.end_reason),
    {", ".join(f"{name} = MAX(usage_records.{name}, excluded.{name})" for name in TOTALS)},
    updated_at = MAX(usage_records.updated_at, excluded.updated_at),
    measured_by = COALESCE(excluded.measured_by, usage_records.measured_by)
"""


def path_in(state_root: str) -> str:
    return os.path.join(state_root, FILE_NAME)


def owner_name(uid: int | None) -> str:
    """A sandbox's owner as a report shows it: the tenant's user name on a shared server,
    else the server's own user (whose sandboxes they all are)."""
    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def record_row(record: dict, owner: str, ended_at: str | None = None) -> dict:
    """A usage row from a sandbox's state record (its ``usage`` totals)."""
    usage = record.get("usage") or {}
    limits = record.get("limits") or {}
    row = {
        "sandbox_id": record["id"], "owner": owner, "image": record.get("image"),
        "tier": (record.get("isolation") or {}).get("backend") or record.get("isolation_backend"),
        "memory_mb": limits.get("memory_mb"), "cpus": limits.get("cpus"), "disk_mb": limits.get("disk_mb"),
        "pids": limits.get("pids"), "created_at": record.get("created_at"), "ended_at": ended_at,
        "end_reason": None, "updated_at": usage.get("sampled_at") or record.get("updated_at"),
        "measured_by": usage.get("measured_by"),
    }
    for name in TOTALS:
        row[name] = usage.get(name) or 0
    return row


def as_read(row: dict) -> dict:
    """A stored row as the API returns it: a sandbox whose CPU and memory nothing could read
    has null there (the table keeps 0, a sum's neutral), never a 0 to trust."""
    if row.get("measured_by") == NOT_MEASURED:
        row.update({name: None for name in TOTALS if name in PROCESS_FIGURES})
    return row


class UsageStore:
    """The records of one state directory. Opened per use: a supervisor writes a few times a
    minute, and a connection must not be shared across the server's threads."""

    def __init__(self, path: str):
        self.path = path

    @contextlib.contextmanager
    def _connect(self):
        new = not os.path.exists(self.path)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            if new:
                os.chmod(self.path, 0o600)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: a process crash loses nothing committed
            db.execute(SCHEMA)
            if "measured_by" not in {row[1] for row in db.execute("PRAGMA table_info(usage_records)")}:
                with contextlib.suppress(sqlite3.OperationalError):  # another writer added it first
                    db.execute(ADD_MEASURED_BY)
            yield db
        finally:
            db.close()

    def upsert(self, row: dict) -> None:
        with self._connect() as db:
            db.execute(UPSERT, [row.get(name) for name in COLUMNS])

    def records(self, since: str | None = None, sandbox_id: str | None = None) -> list[dict]:
        """Every record (of one sandbox), or those alive at or after ``since`` (an ISO date or time)."""
        query, args = "SELECT * FROM usage_records", []
        if sandbox_id is not None:
            query += " WHERE sandbox_id = ?"
            args.append(sandbox_id)
        elif since:
            query += " WHERE ended_at IS NULL OR ended_at >= ?"
            args.append(since)
        if not os.path.exists(self.path):
            return []
        with self._connect() as db:
            db.row_factory = sqlite3.Row
            return [as_read(dict(row)) for row in db.execute(query + " ORDER BY created_at, sandbox_id", args)]

    def totals(self) -> dict[str, float]:
        """Every total summed over every record, and ``records`` (the metrics' usage counters)."""
        if not os.path.exists(self.path):
            return {name: 0.0 for name in TOTALS} | {"records": 0}
        with self._connect() as db:
            row = db.execute(f"SELECT {', '.join(f'COALESCE(SUM({n}), 0)' for n in TOTALS)}, COUNT(*) "
                             "FROM usage_records").fetchone()
        return dict(zip(TOTALS + ("records",), row))


def complete(store: UsageStore, record: dict, owner: str, ended_at: str) -> None:
    """The server's part: the row of an ended sandbox whose supervisor did not write its last
    one (killed, or gone with its host), from state.json's last figures. Nothing is counted
    twice: the totals are the supervisor's own, and a row already ended keeps its end."""
    if record.get("usage_recorded") or record.get("pooled") or not record.get("id"):
        return
    row = record_row(record, owner, ended_at=record.get("ended_at") or ended_at)
    row["end_reason"] = record.get("dead_reason") or record.get("state")
    store.upsert(row)


def add_egress(store: UsageStore, sandbox_id: str, egress: dict) -> None:
    """The server's proxy counts a sandbox's egress bytes: they join its row when it ends."""
    with store._connect() as db:
        db.execute("UPDATE usage_records SET egress_bytes_in = MAX(egress_bytes_in, ?), "
                   "egress_bytes_out = MAX(egress_bytes_out, ?) WHERE sandbox_id = ?",
                   (egress.get("bytes_in", 0), egress.get("bytes_out", 0), sandbox_id))
