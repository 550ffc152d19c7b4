"""Live usage per sandbox (GET /v1/sandboxes/{id} ``usage``) against a cell that burns a
known amount of CPU and memory, and the usage records that outlive a kill -9."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from tests import support

MiB = 1024 * 1024

# Holds 200 MiB, every page touched.
HOLD = """
held = bytearray(200 * 1024 * 1024)
for i in range(0, len(held), 4096):
    held[i] = 1
"""
# Burns 1.5 s of CPU, as the process itself counts it (user + system), and says how much.
BURN = """
import time
start = time.process_time()
while time.process_time() - start < 1.5:
    pass
print(time.process_time() - start)
"""


def _usage(api, sandbox_id: str) -> dict:
    response = api.get(f"/v1/sandboxes/{sandbox_id}")
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def _done(events: list[dict]) -> dict:
    assert events[-1]["type"] == "done", events
    assert events[-1]["status"] == "ok", events
    return events[-1]


def test_usage_matches_a_cell_that_burns_known_cpu_and_memory(api, new_sandbox, run):
    sandbox = new_sandbox(memory_mb=1024, cpus=1)
    before = _usage(api, sandbox["id"])
    done = _done(run(sandbox["id"], HOLD))
    held = _usage(api, sandbox["id"])
    grown = held["memory_bytes"] - before["memory_bytes"]
    assert 200 * MiB * 0.9 <= grown <= 200 * MiB * 1.1, (before, held)
    assert held["memory_peak_bytes"] >= held["memory_bytes"]
    # The cell's done carries the memory the kernel warns from.
    assert abs(done["usage"]["memory_bytes"] - held["memory_bytes"]) < 10 * MiB, (done, held)
    events = run(sandbox["id"], BURN)
    _done(events)
    burned = float("".join(e["text"] for e in events if e["type"] == "stream"))
    after = _usage(api, sandbox["id"])
    cpu = after["cpu_seconds"] - held["cpu_seconds"]
    assert burned * 0.9 <= cpu <= burned * 1.1, (burned, held, after)
    assert after["executes"] == before["executes"] + 2 and after["processes"] >= 1
    assert after["alive_seconds"] > 0 and after["sampled_at"]


def test_the_list_shows_the_usage_a_cell_left(api, new_sandbox, run):
    """`ls` reads the list, which the server answers without asking each supervisor: it
    shows the figures the supervisor wrote after the cell (state.json), not those it heard
    at the create. The control: the usage the server heard at the create, before the cell."""
    sandbox = new_sandbox(memory_mb=1024)
    heard = sandbox.get("usage") or {}
    _done(run(sandbox["id"], HOLD))

    def listed() -> dict:
        return next(s for s in api.get("/v1/sandboxes").json()["sandboxes"] if s["id"] == sandbox["id"])["usage"]

    assert support.wait_for(lambda: listed()["memory_bytes"] >= 200 * MiB * 0.9, 30), (heard, listed())
    assert (heard.get("memory_bytes") or 0) < 200 * MiB * 0.5 and listed()["executes"] == heard.get("executes", 0) + 1


def test_disk_and_commands_are_counted(api, new_sandbox, run):
    sandbox = new_sandbox()
    before = _usage(api, sandbox["id"])
    _done(run(sandbox["id"], "open('/workspace/blob', 'wb').write(b'x' * (30 * 1024 * 1024))"))
    response = api.post(f"/v1/sandboxes/{sandbox['id']}/commands", json={"argv": ["true"]})
    assert response.status_code == 200, response.text
    after = _usage(api, sandbox["id"])
    assert 30 * MiB <= after["disk_bytes"] - before["disk_bytes"] <= 33 * MiB, (before, after)
    assert after["commands"] == before["commands"] + 1


def _rows(state_dir, sandbox_id: str) -> list[dict]:
    path = state_dir / "usage.sqlite3"
    if not path.exists():
        return []  # (read-only below: never create the server's database before it does)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute("SELECT * FROM usage_records WHERE sandbox_id = ?", (sandbox_id,))]
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):  # the server has not made its table yet
            return []
        raise
    finally:
        db.close()


@pytest.mark.slow
def test_records_are_never_lost_nor_counted_twice_across_kill9(spawn_server):
    server = spawn_server("--set", "usage_record_seconds=1")
    with server.client() as api:
        kept = support.create(api)["id"]
        lost = support.create(api)["id"]
        for sandbox_id in (kept, lost):
            _done(support.execute(api, sandbox_id, "x = sum(range(10**6))"))
        support.wait_for(lambda: all(_rows(server.state_dir, i) and _rows(server.state_dir, i)[0]["executes"] == 1
                                     for i in (kept, lost)), 15)
        server.kill9()
        # A supervisor killed too: its last periodic row is all that is left of it.
        lost_pid = json.loads((server.state_dir / "sandboxes" / lost / "state.json").read_text())["supervisor_pid"]
        support.signal_all([lost_pid], 9)
        support.wait_for(lambda: not support.pid_alive(lost_pid), 10)
        server.start()
    with server.client() as api:
        _done(support.execute(api, kept, "y = 2"))
        assert api.delete(f"/v1/sandboxes/{kept}").status_code == 200
        assert api.get(f"/v1/sandboxes/{lost}").status_code == 410
    kept_rows, lost_rows = _rows(server.state_dir, kept), _rows(server.state_dir, lost)
    assert len(kept_rows) == 1 and len(lost_rows) == 1
    assert kept_rows[0]["executes"] == 2 and kept_rows[0]["end_reason"] == "deleted" and kept_rows[0]["ended_at"]
    assert kept_rows[0]["cpu_seconds"] > 0 and kept_rows[0]["alive_seconds"] > 0
    assert lost_rows[0]["executes"] == 1 and lost_rows[0]["end_reason"] == "lost" and lost_rows[0]["ended_at"]
    # A restart more counts nothing again.
    server.terminate()
    server.start()
    time.sleep(0.5)
    assert _rows(server.state_dir, kept) == kept_rows and _rows(server.state_dir, lost) == lost_rows


def _cli(server, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **server.env}
    return subprocess.run([sys.executable, "-m", "sandbox", *args], capture_output=True, text=True, env=env,
                          cwd=str(support.REPO), timeout=120)


@pytest.mark.slow
def test_usage_route_and_report(sandbox_server, api, run):
    sandbox_id = support.create(api)["id"]
    for _ in range(2):
        _done(run(sandbox_id, "1"))
    assert api.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 200
    [record] = api.get("/v1/usage", params={"sandbox_id": sandbox_id}).json()["records"]
    assert record["executes"] == 2 and record["end_reason"] == "deleted" and record["ended_at"]
    assert record["memory_mb"] == sandbox_server_limits(api)["memory_mb"] and record["tier"] == "bwrap"
    bad = api.get("/v1/usage", params={"since": "yesterday"})
    assert bad.status_code == 422 and "give a date" in bad.json()["error"]["message"]
    listed = _cli(sandbox_server, "usage", "--records", "--format", "json", "--since", record["created_at"][:10])
    assert listed.returncode == 0, listed.stderr
    assert [r["executes"] for r in json.loads(listed.stdout) if r["sandbox_id"] == sandbox_id] == [2]
    live = support.create(api)["id"]  # a live sandbox's figures lag its use: the report says by how much
    summed = _cli(sandbox_server, "usage", "--format", "csv")
    assert summed.returncode == 0, summed.stderr
    rows = list(csv.DictReader(io.StringIO(summed.stdout)))
    everything = api.get("/v1/usage").json()["records"]
    # The control: the store keeps every total as REAL, so the API's counts are floats (2.0).
    assert any(isinstance(r["executes"], float) for r in everything)
    # The report counts in integers and rounds times (no "90.0", no "2723.822000000001").
    assert all(r[c].isdigit() for r in rows for c in ("sandboxes", "executes", "commands")), rows
    assert all(len(r["alive_seconds"].partition(".")[2]) <= 2 for r in rows), rows
    assert sum(int(r["executes"]) for r in rows) == sum(r["executes"] for r in everything)
    assert sum(int(r["sandboxes"]) for r in rows) == len(everything)
    assert "usage_record_seconds" in summed.stderr and "lag by up to" in summed.stderr, summed.stderr
    table = _cli(sandbox_server, "usage")
    header, *lines = table.stdout.splitlines()
    end = header.index("EXECUTES") + len("EXECUTES")  # numbers are aligned right under their header
    assert all(line[:end].split()[-1].isdigit() for line in lines), table.stdout
    api.delete(f"/v1/sandboxes/{live}")
    refused = _cli(sandbox_server, "usage", "--since", "yesterday")
    assert refused.returncode == 2 and "give a date" in refused.stderr


def sandbox_server_limits(api) -> dict:
    return api.get("/v1/info").json()["defaults"]
