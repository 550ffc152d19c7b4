"""Executing cells through the HTTP API of a real server (real bwrap, real IPython inside).

What a notebook user relies on: state between cells, rich outputs, one error per failing
cell, output streamed while the cell runs, and interrupts and timeouts that stop a cell
without losing the sandbox (unless the cell ignores the interrupt).
"""

from __future__ import annotations

import base64
import threading
import time

import pytest

from support import done_of, of_type, ok, result_text, stream_text
from svc_support import api_error, sandbox_for_module, timed_execute

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sid(sandbox_server):
    """Every test here but the one that kills its sandbox leaves it usable: share one."""
    yield from sandbox_for_module(sandbox_server)


def test_state_persists_across_executes(sid, run):
    ok(run(sid, "x = 41"))
    assert result_text(ok(run(sid, "x + 1"))) == "42"

    # fractions is not preloaded: the import itself must survive into the next cell
    ok(run(sid, "import fractions as fr"))
    assert result_text(ok(run(sid, "fr.Fraction(2, 6)"))) == "Fraction(1, 3)"

    ok(run(sid, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})"))
    ok(run(sid, "df['b'] = df['a'] * 10"))
    assert result_text(ok(run(sid, "(int(df['b'].sum()), list(df.columns))"))) == "(60, ['a', 'b'])"

    # control: a name no cell defined is not there, so the checks above are not vacuous
    events = run(sid, "never_defined")
    errors = of_type(events, "error")
    assert [e["ename"] for e in errors] == ["NameError"]


def test_rich_outputs(sid, run):
    events = ok(run(sid, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"))
    results = of_type(events, "execute_result")
    assert len(results) == 1, events
    data = results[0]["data"]
    assert data["text/plain"].split() == ["a", "b", "0", "1", "x", "1", "2", "y"]
    assert "<table" in data["text/html"] and "<td>x</td>" in data["text/html"]
    count = done_of(events)["execution_count"]
    assert results[0]["execution_count"] == count

    events = ok(run(sid, "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n_ = ax.plot([1, 2, 3], [1, 4, 9])"))
    displays = of_type(events, "display_data")
    assert len(displays) == 1, events
    assert not of_type(events, "execute_result")
    bundle = displays[0]["data"]
    png = base64.b64decode(bundle["image/png"], validate=True)
    assert png.startswith(PNG_SIGNATURE)
    assert len(png) > 1000
    assert bundle["text/plain"].startswith("<Figure size ")
    assert done_of(events)["execution_count"] == count + 1

    events = ok(run(sid, "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))"))
    displays = of_type(events, "display_data")
    assert len(displays) == 1, events
    assert displays[0]["data"]["text/html"] == "<b>hi</b>"
    assert "metadata" in displays[0]
    assert done_of(events)["execution_count"] == count + 2

    events = ok(run(sid, "6 * 7"))
    assert done_of(events)["execution_count"] == count + 3
    assert of_type(events, "execute_result")[0]["execution_count"] == count + 3


def test_errors_are_one_error_event(sid, run):
    events = run(sid, "1/0")
    errors = of_type(events, "error")
    assert len(errors) == 1, events
    assert errors[0]["ename"] == "ZeroDivisionError"
    assert errors[0]["evalue"] == "division by zero"
    tb = errors[0]["traceback"]
    assert isinstance(tb, list) and tb and all(isinstance(line, str) for line in tb)
    assert any("ZeroDivisionError" in line for line in tb)
    assert done_of(events)["status"] == "error"
    assert not of_type(events, "execute_result")

    events = run(sid, "def f(:\n    pass")
    errors = of_type(events, "error")
    assert len(errors) == 1, events
    assert errors[0]["ename"] == "SyntaxError"
    assert errors[0]["traceback"]
    assert done_of(events)["status"] == "error"

    # the failures cost nothing: the next cell runs normally
    assert result_text(ok(run(sid, "1 + 1"))) == "2"


def test_output_streams_while_the_cell_runs(sandbox_server, sid):
    stamped = timed_execute(sandbox_server.url, sandbox_server.token, sid,
                            'print("early", flush=True)\nimport time\ntime.sleep(2)\nprint("late")')
    events = [e for _, e in stamped]
    ok(events)
    early = [ts for ts, e in stamped if e["type"] == "stream" and "early" in e["text"]]
    late = [ts for ts, e in stamped if e["type"] == "stream" and "late" in e["text"]]
    done_at = stamped[-1][0]
    assert early and late, events
    assert done_at - early[0] >= 1.0, f"'early' arrived only {done_at - early[0]:.2f} s before done: buffered"
    assert late[0] >= early[0]
    assert stream_text(events) == "early\nlate\n"


def test_stdout_of_subprocesses_and_shell_escapes(sid, run):
    events = ok(run(sid, 'import os\nos.system("echo from-shell")\n!echo bang'))
    out = stream_text(events)
    # `!cmd` runs under a pty (pexpect), as in ipykernel, so its lines end in \r\n
    assert "from-shell\n" in out and "bang\r\n" in out, events
    assert out.index("from-shell") < out.index("bang")


def test_interrupt_stops_the_cell_and_keeps_state(sandbox_server, api, sid, run):
    ok(run(sid, "x = 1"))

    started = threading.Event()
    stamped: list = []

    def on_event(ts, event):
        if event["type"] == "stream" and "sleeping" in event["text"]:
            started.set()

    def worker():
        stamped.extend(timed_execute(sandbox_server.url, sandbox_server.token, sid,
                                     'print("sleeping", flush=True)\nimport time\ntime.sleep(60)', on_event=on_event))

    t0 = time.monotonic()
    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert started.wait(30), "the cell never started"
    time.sleep(1)
    assert api.get(f"/v1/sandboxes/{sid}").json()["executing"] is True
    r = api.post(f"/v1/sandboxes/{sid}/interrupt")
    assert r.status_code == 200 and r.json() == {"interrupted": True}
    thread.join(45)
    assert not thread.is_alive(), "the interrupted cell did not end"
    elapsed = time.monotonic() - t0
    assert elapsed < 30, f"the interrupt took effect only after {elapsed:.1f} s"

    events = [e for _, e in stamped]
    errors = of_type(events, "error")
    assert [e["ename"] for e in errors] == ["KeyboardInterrupt"], events
    done = done_of(events)
    assert done["reason"] == "interrupted"
    assert done["status"] == "error"
    assert done["sandbox_state"] == "running"

    assert result_text(ok(run(sid, "x"))) == "1"
    r = api.post(f"/v1/sandboxes/{sid}/interrupt")
    assert r.status_code == 200 and r.json() == {"interrupted": False}


def test_timeout_interrupts_and_keeps_state(api, sid, run):
    ok(run(sid, "x = 7"))
    t0 = time.monotonic()
    events = run(sid, "import time; time.sleep(30)", timeout_seconds=1)
    assert time.monotonic() - t0 < 20
    errors = of_type(events, "error")
    assert [e["ename"] for e in errors] == ["TimeoutError"], events
    done = done_of(events)
    assert done["status"] == "error"
    assert done["reason"] == "timeout_interrupted"
    assert done["sandbox_state"] == "running"

    r = api.get(f"/v1/sandboxes/{sid}")
    assert r.status_code == 200 and r.json()["state"] == "running"
    assert result_text(ok(run(sid, "x"))) == "7"


def test_timeout_kills_a_cell_that_ignores_the_interrupt(api, new_sandbox, run):
    sid = new_sandbox()["id"]
    ok(run(sid, "x = 7"))
    t0 = time.monotonic()
    events = run(sid, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)",
                 timeout_seconds=1)
    assert time.monotonic() - t0 < 25
    done = done_of(events)
    assert done["status"] == "error"
    assert done["reason"] == "timeout_killed"
    assert done["sandbox_state"] == "dead"
    errors = of_type(events, "error")
    assert [e["ename"] for e in errors] == ["SandboxDied"], events
    assert "timeout" in errors[0]["evalue"]

    error = api_error(api.get(f"/v1/sandboxes/{sid}"), 410)
    assert error["code"] == "gone"
    assert "died" in error["message"] and "timeout" in error["message"], error
    assert error.get("reason") == "timeout_killed"
    # an execute on it is refused the same way, before any streaming
    assert api_error(api.post(f"/v1/sandboxes/{sid}/execute", json={"code": "x"}), 410)["code"] == "gone"
