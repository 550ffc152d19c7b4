"""A usage figure nothing could read is said to be "not measured", never shown as 0: from the
meter's record, through the usage store (a real SQLite file) and the report, to the text a
person reads (`ls`, `usage`, `%sandbox`, the memory note) and what an agent is told. Each
check has its control: the same path with the figures measured shows the numbers."""

from __future__ import annotations

import types

from kernel import usage_note
from sandbox.agents.transcript import agent_usage
from sandbox.cli.sandboxes import USAGE_COLUMNS, _usage_cell, _usage_figure
from sandbox.usage import report
from sandbox.usage.meter import UsageMeter
from sandbox.usage.store import UsageStore, record_row

MiB = 2**20


class NoCgroup:
    cgroup = None
    workspace = "/nonexistent"


def unmeasured_usage() -> dict:
    """What a supervisor keeps when neither a cgroup nor the process tree can be read."""
    return UsageMeter({"state": "running"}, NoCgroup(), root_pid=lambda: None).sample(with_disk=False)


def measured_usage() -> dict:
    return {**unmeasured_usage(), "measured_by": "processes", "cpu_seconds": 2.5, "memory_bytes": 220 * MiB,
            "memory_peak_bytes": 230 * MiB, "processes": 3, "memory_gib_hours": 0.01}


def test_the_meter_keeps_null_figures_and_says_why():
    usage = unmeasured_usage()
    assert usage["measured_by"] == "not measured"
    assert [usage[k] for k in ("cpu_seconds", "memory_bytes", "memory_peak_bytes", "processes")] == [None] * 4
    assert usage["executes"] == 0 and usage["alive_seconds"] >= 0  # counted, not measured: numbers


def test_ls_cells_say_not_measured():
    usage = unmeasured_usage()
    cells = [_usage_figure(usage, key, fmt) for key, _, fmt in USAGE_COLUMNS]
    assert cells[:2] == ["not measured", "not measured"] and cells[2] == "0 B", cells  # disk is walked: measured
    control = [_usage_figure(measured_usage(), key, fmt) for key, _, fmt in USAGE_COLUMNS]
    assert control[:2] == ["2.5 s", "220 MiB"], control


def test_usage_records_and_the_report_keep_not_measured(tmp_path):
    store = UsageStore(str(tmp_path / "usage.sqlite3"))
    for sandbox_id, usage in (("sbx-unmeasured", unmeasured_usage()), ("sbx-measured", measured_usage())):
        record = {"id": sandbox_id, "usage": usage, "created_at": "2026-12-07T01:00:00Z", "limits": {}}
        store.upsert(record_row(record, "ana"))
    records = {r["sandbox_id"]: r for r in store.records()}
    assert records["sbx-unmeasured"]["cpu_seconds"] is None and records["sbx-unmeasured"]["memory_peak_bytes"] is None
    assert records["sbx-measured"]["cpu_seconds"] == 2.5  # the control

    alone = report.summarise([records["sbx-unmeasured"]])[0]
    assert alone["cpu_seconds"] is None and alone["memory_peak_bytes"] is None, alone
    assert _usage_cell("cpu_seconds", alone["cpu_seconds"]) == "not measured"
    assert "sbx-unmeasured" in report.unmeasured(list(records.values()))
    both = report.summarise(list(records.values()))[0]
    assert both["cpu_seconds"] == 2.5 and both["sandboxes"] == 2, both  # the measured one's sum
    assert report.unmeasured([records["sbx-measured"]]) is None


def test_sandbox_magic_and_the_memory_note():
    rows = dict(usage_note.usage_rows(unmeasured_usage(), 256, None))
    assert "not measured" in rows["usage"] and "0.0 s" not in str(rows), rows
    assert "memory 220.0 MiB now" in dict(usage_note.usage_rows(measured_usage(), 256, None))["usage"]
    done = {"usage": {k: unmeasured_usage()[k] for k in ("memory_bytes", "memory_peak_bytes", "cpu_seconds")}}
    assert usage_note.after_cell(done, 256) is None
    near = {"usage": {k: measured_usage()[k] for k in ("memory_bytes", "memory_peak_bytes", "cpu_seconds")}}
    assert "memory at 220.0 MiB of 256.0 MiB (85 %)" in usage_note.after_cell(near, 256)  # the control


def test_an_agent_is_told_not_measured():
    info = types.SimpleNamespace(usage=unmeasured_usage(), limits=types.SimpleNamespace(memory_mb=256))
    told = agent_usage(info)
    assert told["measured_by"] == "not measured" and told["memory_bytes"] is None and told["cpu_seconds"] is None
