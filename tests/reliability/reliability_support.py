"""Cells and streams of the reliability tests: the ones whose timing a test must control
(a cell that says when it really started, an execute that runs in a thread while the
server is killed under it). Servers, sandboxes and events come from tests/support.py.
"""

from __future__ import annotations

import json
import threading
import time

import httpx

import support


def long_cell(seconds: int) -> str:
    """A cell that says when it has really started (the runtime runs it), then sleeps."""
    return f"import time\nstarted = True\nprint('started', flush=True)\ntime.sleep({seconds})\nfinished = True"


def stream_in_thread(server: support.Server, sandbox_id: str, code: str) -> tuple[threading.Thread, dict]:
    """Execute in a thread. The dict gets the events, ``started`` (an Event set once the cell
    printed 'started': an interrupt sent before that can race the cell's start), when the
    stream ended and any exception (a torn stream)."""
    out: dict = {"events": [], "error": None, "ended": None, "status": None, "started": threading.Event()}

    def go() -> None:
        try:
            with server.client(timeout=httpx.Timeout(10, read=60)) as c:
                with c.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code}) as r:
                    out["status"] = r.status_code
                    for line in r.iter_lines():
                        if line:
                            event = json.loads(line)
                            out["events"].append(event)
                            if event["type"] == "stream" and "started" in event.get("text", ""):
                                out["started"].set()
        except Exception as exc:
            out["error"] = exc
        out["ended"] = time.monotonic()

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, out
