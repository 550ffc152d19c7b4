"""A server that crashes (kill -9) must not take its sandboxes with it.

Each sandbox's supervisor is its own session, the parent of its bwrap, and records its
state in ``state.json``; a restarted server rebuilds its registry from the state directory
and re-attaches. A supervisor that died while no server was running must be reported as
``lost`` (410), never silently forgotten (404) or shown as running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

import reliability_support as rs
import support

pytestmark = pytest.mark.slow

SETUP = """
import pandas as pd
x = 41
df = pd.DataFrame({"n": [1, 2, 3], "s": ["a", "b", "%s"]})
"""
CHECK = "import json; print(json.dumps({'shape': list(df.shape), 's': list(df['s']), 'sum': int(df['n'].sum())}))"


def runtime_alive(server: support.Server, sandbox_id: str) -> bool:
    processes = support.processes_of(support.sandbox_dir(server, sandbox_id), [sandbox_id])
    return any(support.holds_sandbox_code(cmd) for cmd in processes.values())


def test_sandboxes_survive_server_kill9_and_a_dead_supervisor_is_reported_lost(spawn_server):
    server = spawn_server()
    payloads: dict[str, bytes] = {}
    with server.client() as c:
        ids = [support.create(c)["id"] for _ in range(2)]
        for sid in ids:
            support.ok(support.execute(c, sid, SETUP % sid))
            payloads[sid] = os.urandom(256 * 1024) + sid.encode()
            r = c.put(f"/v1/sandboxes/{sid}/files/data/blob.bin", content=payloads[sid])
            assert r.status_code == 201, r.text
        before = {}
        for sid in ids:
            r = c.get(f"/v1/sandboxes/{sid}")
            assert r.status_code == 200, r.text
            before[sid] = r.json()
    supervisors = {sid: support.supervisor_pid(server, sid) for sid in ids}

    server.kill9()
    assert not server.healthy()
    for sid, pid in supervisors.items():
        assert support.is_supervisor(pid, support.sandbox_dir(server, sid)), \
            f"supervisor {pid} of {sid} died with the server"
        assert runtime_alive(server, sid), f"the runtime of {sid} died with the server"

    restart_seconds = server.start()
    print(f"\nrestart with 2 live sandboxes: healthy after {restart_seconds:.2f} s")
    with server.client() as c:
        listed = {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}
        assert set(ids) <= listed
        for sid in ids:
            r = c.get(f"/v1/sandboxes/{sid}")
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["state"] == "running"
            # The TTL kept running while the server was down: neither reset nor renewed.
            assert got["expires_at"] == before[sid]["expires_at"]
            assert got["execution_count"] == before[sid]["execution_count"] == 1
        for sid in ids:
            events = support.ok(support.execute(c, sid, "x + 1"))
            assert support.result_text(events) == "42"
            events = support.ok(support.execute(c, sid, CHECK))
            assert support.stream_text(events).strip() == '{"shape": [3, 2], "s": ["a", "b", "%s"], "sum": 6}' % sid
            r = c.get(f"/v1/sandboxes/{sid}/files/data/blob.bin")
            assert r.status_code == 200
            assert r.content == payloads[sid]

    # A supervisor that dies while no server runs: its sandbox is lost, and said to be.
    victim, survivor = ids
    server.kill9()
    os.kill(supervisors[victim], signal.SIGKILL)
    assert support.wait_for(lambda: not support.pid_alive(supervisors[victim]), 10)
    # --die-with-parent: the sandbox's processes end with their supervisor.
    assert support.wait_for(lambda: not support.processes_of(support.sandbox_dir(server, victim), [victim]), 10), \
        support.processes_of(support.sandbox_dir(server, victim), [victim])
    server.start()
    with server.client() as c:
        r = c.get(f"/v1/sandboxes/{victim}")
        assert r.status_code == 410, r.text
        err = r.json()["error"]
        assert err["code"] == "gone"
        assert err["state"] == "lost" and err["reason"] == "lost"
        assert "lost" in err["message"] and victim in err["message"]
        r = c.post(f"/v1/sandboxes/{victim}/execute", json={"code": "1"})
        assert r.status_code == 410 and r.json()["error"]["state"] == "lost", r.text
        assert {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]} == {survivor}

        r = c.get(f"/v1/sandboxes/{survivor}")
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        assert support.result_text(support.ok(support.execute(c, survivor, "x + 1"))) == "42"
        r = c.get(f"/v1/sandboxes/{survivor}/files/data/blob.bin")
        assert r.content == payloads[survivor]


def test_a_lost_sandbox_leaves_no_cgroup_behind(spawn_server):
    """A supervisor killed hard cannot clean up after itself, so the server that finds it
    lost must: otherwise every such crash leaks cgroups for the life of the host."""
    server = spawn_server()
    with server.client() as c:
        sid = support.create(c)["id"]
        support.ok(support.execute(c, sid, "x = 1"))
    pid = support.supervisor_pid(server, sid)
    groups = support.cgroup_dirs(sid)
    assert groups and all(os.path.isdir(g) for g in groups)  # control: it had cgroups
    server.kill9()
    os.kill(pid, signal.SIGKILL)
    assert support.wait_for(lambda: not support.processes_of(support.sandbox_dir(server, sid), [sid]), 10)
    server.start()
    with server.client() as c:
        assert c.get(f"/v1/sandboxes/{sid}").status_code == 410
    assert not os.path.ismount(support.sandbox_dir(server, sid) / "workspace")
    assert support.wait_for(lambda: not any(os.path.exists(g) for g in groups), 5), \
        [g for g in groups if os.path.exists(g)]


def test_server_kill9_mid_execute_interrupts_the_cell_and_keeps_the_sandbox(spawn_server):
    """The supervisor sees its caller vanish like any disconnected client: the cell is
    interrupted (not left running for its whole length) and the sandbox stays usable."""
    server = spawn_server()
    with server.client() as c:
        sid = support.create(c)["id"]
        support.ok(support.execute(c, sid, "y = 5"))
    thread, out = rs.stream_in_thread(server, sid, rs.long_cell(30))
    assert out["started"].wait(30), out
    server.kill9()
    thread.join(10)
    assert not thread.is_alive() and out["error"] is not None, out  # a torn stream, not a hang
    server.start()
    with server.client() as c:
        assert support.wait_for(lambda: c.get(f"/v1/sandboxes/{sid}").json().get("executing") is False, 20), \
            "the cell kept running after the server that asked for it died"
        events = support.ok(support.execute(c, sid, "y, started, 'finished' in globals()"))
        assert support.result_text(events) == "(5, True, False)"


def test_a_supervisor_whose_directory_was_removed_still_ends_its_sandbox_on_sigterm(spawn_server):
    """An operator who wipes a state directory by hand (lazy unmount, rm -rf) and then stops
    what is left: the supervisor cannot record the end any more, yet must still kill its
    sandbox and exit, or the sandbox runs on with nothing left to find it by."""
    server = spawn_server()
    with server.client() as c:
        sid = support.create(c)["id"]
        support.ok(support.execute(c, sid, "x = 1"))
    pid = support.supervisor_pid(server, sid)
    directory = support.sandbox_dir(server, sid)
    processes = support.processes_of(directory, [sid])
    server.kill9()
    assert runtime_alive(server, sid)  # control: the sandbox outlives the server
    if os.path.ismount(directory / "workspace"):
        subprocess.run(["umount", "-l", str(directory / "workspace")], check=True)
    shutil.rmtree(directory)
    os.kill(pid, signal.SIGTERM)
    assert support.wait_for(lambda: not support.pid_alive(pid), 15), f"supervisor {pid} ignored SIGTERM"
    assert support.wait_for(lambda: not any(support.pid_alive(p) for p in processes), 10), \
        {p: support.command(p) for p in processes if support.pid_alive(p)}


def test_a_sandbox_that_outlives_its_channel_still_ends_with_its_supervisor(spawn_server, isolation):
    """bwrap's --die-with-parent, on its own. The runtime ends itself when its channel to the
    supervisor closes, but the runtime is the sandbox's own code, which a cell can change:
    here the cell makes it ignore the end of its channel. With the server killed first,
    no reaper is left to kill the sandbox's cgroup after its supervisor, so only
    --die-with-parent (the supervisor's death kills bwrap, and bwrap's pid 1 takes the
    sandbox's pid namespace with it) can end these processes."""
    server = spawn_server()
    with server.client() as c:
        sid = support.create(c)["id"]
        support.ok(support.execute(c, sid, "\n".join([
            "import os, subprocess, threading",
            "os._exit = lambda status: threading.Event().wait()  # the runtime's exit on a closed channel",
            "keeper = subprocess.Popen(['sleep', '7373'])",
        ])))
    pid = support.supervisor_pid(server, sid)
    directory = support.sandbox_dir(server, sid)
    processes = support.processes_of(directory, [sid])
    assert any(support.holds_sandbox_code(cmd) for cmd in processes.values()), processes
    if isolation == "bwrap":  # under gVisor the sleep is a task of the Sentry, not a host process
        assert any(cmd == "sleep 7373" for cmd in processes.values()), processes
    server.kill9()
    os.kill(pid, signal.SIGKILL)
    assert support.wait_for(lambda: not support.pid_alive(pid), 10)
    assert support.wait_for(lambda: not support.processes_of(directory, [sid]), 15), \
        f"not within 15 s: the sandbox's processes to end with their supervisor: {support.processes_of(directory, [sid])}"


def pooled_ids(server: support.Server) -> list[str]:
    """The sandboxes whose supervisors recorded them as waiting in the pool."""
    found = []
    for sid in support.sandbox_ids(server.state_dir):
        try:
            if support.read_state(server, sid).get("state") == "pooled":
                found.append(sid)
        except (OSError, ValueError):
            pass  # no state.json yet
    return found


@pytest.mark.bwrap_only(reason="the suite's servers keep no gVisor pool (gvisor_pool_size 0, the default); tests/gvisor/test_gvisor_pool.py covers that tier's pool")
def test_a_restarted_server_claims_the_pooled_sandbox_it_readopted(spawn_server):
    """Warm sandboxes outlive a server like claimed ones do: the next server must put them
    back in its pool, so the first create after a restart is a claim, not a boot (and the
    old warm sandbox is not left running unused until its idle time ends)."""
    server = spawn_server("--pool-size", "1")

    def pool_ready() -> list[str] | None:
        with server.client() as c:
            ready = c.get("/v1/info").json()["pool"].get("default", {}).get("ready")
        ids = pooled_ids(server)
        return ids if ready == 1 and len(ids) == 1 else None

    warm = support.wait_for(pool_ready, 120, interval=0.25)
    assert warm, "not within 120 s: one warm sandbox in the pool"
    server.kill9()
    server.start()
    with server.client() as c:
        created = support.create(c)
        assert created["from_pool"] is True, created
        assert created["id"] == warm[0], (created["id"], warm)
        assert support.result_text(support.ok(support.execute(c, created["id"], "6 * 7"))) == "42"
