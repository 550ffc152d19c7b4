"""The usage store's rules (one row per sandbox, totals only move forward, an end is kept)
and the report's sums, on a real SQLite file."""

from __future__ import annotations

import csv
import io
import json

import pytest

from sandbox.usage import report, store


def _row(sandbox_id: str, **fields) -> dict:
    row = {name: 0 for name in store.TOTALS} | {"sandbox_id": sandbox_id, "owner": "ana", "image": "default",
                                                "tier": "bwrap", "created_at": "2026-12-01T10:00:00.000Z",
                                                "updated_at": "2026-12-01T10:00:00.000Z"}
    return row | fields


def test_a_row_is_upserted_never_doubled_and_never_goes_back(tmp_path):
    db = store.UsageStore(str(tmp_path / "usage.sqlite3"))
    db.upsert(_row("a", cpu_seconds=5, executes=2))
    db.upsert(_row("a", cpu_seconds=5, executes=2))  # the same write again, after a crash
    db.upsert(_row("a", cpu_seconds=3, executes=1))  # a stale one (an older state.json)
    [only] = db.records()
    assert (only["cpu_seconds"], only["executes"]) == (5, 2)
    db.upsert(_row("a", cpu_seconds=7, executes=3, ended_at="2026-12-01T11:00:00.000Z", end_reason="deleted"))
    db.upsert(_row("a", cpu_seconds=7, executes=3, ended_at="2026-12-01T12:00:00.000Z", end_reason="lost"))
    [only] = db.records()
    assert (only["ended_at"], only["end_reason"], only["executes"]) == ("2026-12-01T11:00:00.000Z", "deleted", 3)
    assert db.totals()["records"] == 1 and db.totals()["cpu_seconds"] == 7
    assert (tmp_path / "usage.sqlite3").stat().st_mode & 0o777 == 0o600


def test_since_keeps_live_records_and_those_ended_after(tmp_path):
    db = store.UsageStore(str(tmp_path / "usage.sqlite3"))
    db.upsert(_row("old", ended_at="2026-11-01T00:00:00.000Z"))
    db.upsert(_row("recent", ended_at="2026-12-02T00:00:00.000Z"))
    db.upsert(_row("live"))
    assert {r["sandbox_id"] for r in db.records(since="2026-12-01")} == {"recent", "live"}
    assert len(db.records()) == 3


RECORDS = [
    _row("a", owner="ana", cpu_seconds=1.5, memory_gib_hours=0.25, executes=3, memory_peak_bytes=100),
    _row("b", owner="ana", cpu_seconds=2.0, memory_gib_hours=0.5, executes=1, memory_peak_bytes=300),
    _row("c", owner="ana", created_at="2026-12-02T01:00:00Z", cpu_seconds=4.0),
    _row("d", owner="bo", image="datascience", cpu_seconds=8.0, egress_bytes_in=2048),
]


def test_the_report_sums_per_user_image_and_day():
    rows = report.summarise(RECORDS)
    keys = [(r["owner"], r["image"], r["day"]) for r in rows]
    assert keys == [("ana", "default", "2026-12-01"), ("ana", "default", "2026-12-02"),
                    ("bo", "datascience", "2026-12-01")]
    first = rows[0]
    assert first["sandboxes"] == 2 and first["cpu_seconds"] == 3.5 and first["executes"] == 4
    assert first["memory_gib_hours"] == 0.75 and first["memory_peak_bytes"] == 300
    assert rows[2]["egress_bytes_in"] == 2048
    assert sum(r["cpu_seconds"] for r in rows) == sum(r["cpu_seconds"] for r in RECORDS)
    by_user = report.summarise(RECORDS, by=("owner",))
    assert [(r["owner"], r["sandboxes"], r["cpu_seconds"]) for r in by_user] == [("ana", 3, 7.5), ("bo", 1, 8.0)]


def test_the_report_as_csv_and_json():
    rows = report.summarise(RECORDS)
    parsed = list(csv.DictReader(io.StringIO(report.render(rows, "csv"))))
    assert [float(r["cpu_seconds"]) for r in parsed] == [3.5, 4.0, 8.0] and parsed[0]["owner"] == "ana"
    assert list(parsed[0])[:4] == ["owner", "image", "day", "sandboxes"]
    assert json.loads(report.render(rows, "json")) == rows
    records = list(csv.DictReader(io.StringIO(report.render(RECORDS, "csv", report.RECORD_COLUMNS))))
    assert [r["sandbox_id"] for r in records] == ["a", "b", "c", "d"] and "node" not in records[0]


def test_the_report_counts_in_integers_and_rounds_times():
    """The store keeps totals as REAL: a report shows counts as integers and times without
    the float sums' noise, in CSV and JSON alike."""
    noisy = [_row("a", executes=90.0, commands=0.0, alive_seconds=2723.822000000001, cpu_seconds=0.1 + 0.2,
                  memory_gib_hours=1 / 3, memory_peak_bytes=1.0e6)]
    [row] = list(csv.DictReader(io.StringIO(report.render(report.summarise(noisy), "csv"))))
    assert (row["executes"], row["commands"], row["sandboxes"]) == ("90", "0", "1")
    assert (row["alive_seconds"], row["cpu_seconds"], row["memory_gib_hours"]) == ("2723.82", "0.3", "0.333333")
    assert row["memory_peak_bytes"] == "1000000"
    [record] = json.loads(report.render(noisy, "json", report.RECORD_COLUMNS))
    assert record["executes"] == 90 and isinstance(record["executes"], int)
    assert report.tidy({"owner": "ana", "executes": 3}) == {"owner": "ana", "executes": 3}  # nothing else changes


def test_the_report_says_how_old_live_figures_can_be():
    from datetime import datetime, timezone

    now = datetime(2026, 12, 1, 10, 0, 45, tzinfo=timezone.utc)
    line = report.staleness([_row("live"), _row("ended", ended_at="2026-12-01T10:00:30Z")], now)
    assert "usage_record_seconds" in line and "written 45 s ago" in line and "final" in line
    assert "ago" not in report.staleness([_row("ended", ended_at="2026-12-01T10:00:30Z")], now)


def test_since_is_checked():
    assert report.parse_since("2026-12-01") == "2026-12-01"
    assert report.parse_since("2026-12-01T08:00:00Z") == "2026-12-01T08:00:00Z"
    with pytest.raises(ValueError, match="give a date"):
        report.parse_since("last week")
