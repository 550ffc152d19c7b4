"""A gVisor sandbox's supervisors come from the supervisor template too: at its create, at
its resume from a checkpoint (``--restore``) and for a fork of it (tests/service/
test_svc_supervisor_template.py holds the template's own tests). Looked at in the process
table: each supervisor's parent is the template, not the server; the state the restored one
brings back is the sandbox's.
"""

from __future__ import annotations

import support
from support import parent_of, template_of

SETUP = "x = 41\ng = (i * i for i in range(10))\nfirst = [next(g), next(g)]"


def test_a_gvisor_sandbox_is_paused_resumed_and_forked_through_the_template(spawn_server):
    server = spawn_server()
    with server.client(timeout=300) as c:
        sid = support.create(c, isolation="gvisor")["id"]
        support.ok(support.execute(c, sid, SETUP))
        template = template_of(server)
        booted = support.supervisor_pid(server, sid)
        assert parent_of(booted) == template

        r = c.post(f"/v1/sandboxes/{sid}/pause")
        assert r.status_code == 200 and r.json()["state"] == "paused", r.text
        assert support.wait_for(lambda: not support.pid_alive(booted), 60)
        r = c.post(f"/v1/sandboxes/{sid}/resume")
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        steps = dict(r.json()["timeline"]["steps"])
        assert "supervisor_process_start" in steps, steps
        restored = support.supervisor_pid(server, sid)
        assert restored != booted and parent_of(restored) == template
        assert support.result_text(support.ok(support.execute(c, sid, "x + 1, next(g)"))) == "(42, 4)"

        r = c.post(f"/v1/sandboxes/{sid}/fork", json={})
        assert r.status_code == 201, r.text
        fid = r.json()["id"]
        assert parent_of(support.supervisor_pid(server, fid)) == template
        assert support.result_text(support.ok(support.execute(c, fid, "x + 1, next(g)"))) == "(42, 9)"
        for gone in (fid, sid):
            c.delete(f"/v1/sandboxes/{gone}")
