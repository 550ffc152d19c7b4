"""What the fast execute path must not change.

Cells reuse the server's connection to the supervisor, the supervisor records a cell's
count in state.json a moment after the cell instead of on its way, and the runtime
forwards a cell's output itself before it reports anything else. Each shortcut has a
case where it could lose something: an abandoned cell on a kept connection, a state file
that never catches up, output that arrives after ``done``, a writer that never stops.
"""

from __future__ import annotations

import time

import httpx
import pytest

import support


@pytest.mark.slow
def test_abandoned_silent_cell_on_a_kept_connection_is_interrupted(sandbox_server, new_sandbox, run):
    sid = new_sandbox()["id"]
    support.ok(run(sid, "x = 1"))  # the server now keeps a connection to this supervisor
    support.ok(run(sid, "x = 2"))  # ... and this cell went over it
    with sandbox_server.client(timeout=httpx.Timeout(10, read=60)) as c:
        with c.stream("POST", f"/v1/sandboxes/{sid}/execute",
                      json={"code": "import time\nstarted = True\ntime.sleep(30)\nfinished = True"}) as r:
            assert r.status_code == 200
            time.sleep(1.5)  # a silent cell: no event tells when it runs
    began = time.monotonic()
    events = support.ok(run(sid, "started, 'finished' in globals(), x"))
    waited = time.monotonic() - began
    assert support.result_text(events) == "(True, False, 2)"
    assert waited < 20, f"the next cell waited {waited:.1f} s: the abandoned one was not interrupted"


def test_state_file_catches_up_with_the_cells(sandbox_server, new_sandbox, run):
    sid = new_sandbox()["id"]
    for i in range(3):
        count = support.done_of(support.ok(run(sid, f"y = {i}")))["execution_count"]
    deadline = time.monotonic() + 10
    recorded = None
    while time.monotonic() < deadline:
        recorded = support.read_state(sandbox_server, sid)
        if recorded.get("execution_count") == count:
            break
        time.sleep(0.1)
    assert recorded is not None and recorded["execution_count"] == count, recorded


def test_output_written_every_way_comes_before_the_result_in_order(new_sandbox, run):
    sid = new_sandbox()["id"]
    events = support.ok(run(sid, "\n".join([
        "import os, sys",
        "print('a')",
        "os.write(1, b'b\\n')",
        "os.system('echo c; echo e1 >&2')",
        "sys.stdout.write('d\\n')",
        "display('shown')",
        "print('f', flush=False)",
        "os.write(2, b'e2\\n')",
        "sys.stdout.buffer.write(b'\\xc3')  # half a character at the very end",
        "sys.stdout.flush()",
        "42",
    ])))
    kinds = [e["type"] for e in events]
    shown = kinds.index("display_data")
    before = "".join(e["text"] for e in events[:shown] if e["type"] == "stream" and e["name"] == "stdout")
    after = "".join(e["text"] for e in events[shown:] if e["type"] == "stream" and e["name"] == "stdout")
    assert before == "a\nb\nc\nd\n", events
    assert after == "f\n\ufffd", events
    assert support.stream_text(events, "stderr") == "e1\ne2\n"
    assert kinds[-2:] == ["execute_result", "done"], kinds
    assert support.result_text(events) == "42"


def test_a_thread_that_never_stops_writing_does_not_hold_the_cell(new_sandbox, run):
    sid = new_sandbox()["id"]
    events = run(sid, "\n".join([
        "import os, threading",
        "stop = False",
        "def spew():",
        "    while not stop:",
        "        os.write(1, b'.' * 4096)",
        "threading.Thread(target=spew, daemon=True).start()",
        "import time; time.sleep(0.3)",
        "'cell over'",
    ]), timeout_seconds=60)
    done = support.done_of(events)
    assert done["status"] == "ok", events[-3:]
    assert support.result_text(events) == "'cell over'"
    after = support.ok(run(sid, "stop = True; import time; time.sleep(0.2); print('next')"))
    assert support.stream_text(after).endswith("next\n")
    assert support.done_of(after)["execution_count"] == done["execution_count"] + 1
