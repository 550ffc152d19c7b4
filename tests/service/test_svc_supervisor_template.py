"""The supervisor template: each sandbox's supervisor is forked from one process the server
started (sandbox/supervisor/template.py), not started as a new interpreter.

Looked at in the host's process table: whose child each supervisor is, which files it holds
open (/proc/PID/fd), and that it outlives the server and is taken back by the next one. The
control for "forked by the template" is a server with ``supervisor_template=False``, whose
supervisors are its own children; the fallback is a server whose template was killed.
The sandboxes are bwrap ones: a gVisor sandbox's create, resume and fork through the
template are tests/gvisor/test_gvisor_template.py.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests import support

from sandbox.common.paths import SUPERVISOR_TEMPLATE_LOG

TEMPLATE = support.SUPERVISOR_COMMANDS[1]


def open_files(pid: int) -> dict[str, str]:
    """fd -> what it is (a path, socket:[inode], pipe:[inode])."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    return found


def test_supervisors_are_forked_by_the_template_and_hold_only_their_own_files(spawn_server):
    server = spawn_server()
    with server.client(timeout=120) as c:
        ids = [support.create(c)["id"] for _ in range(2)]
        for sid in ids:
            assert support.result_text(support.ok(support.execute(c, sid, "6 * 7"))) == "42"
        template = support.template_of(server)
        supervisors = {sid: support.supervisor_pid(server, sid) for sid in ids}
        for sid, pid in supervisors.items():
            assert support.parent_of(pid) == template, (sid, pid, support.parent_of(pid), template)
            assert support.is_supervisor(pid, support.sandbox_dir(server, sid))
            assert os.getsid(pid) == pid  # a session of its own, as a Popen'd one is
            assert os.readlink(f"/proc/{pid}/cwd") == "/"
        # no thread in the template (a fork copies only the thread that forks: a lock another held stays held)
        assert os.listdir(f"/proc/{template}/task") == [str(template)]
        template_socket = open_files(template)["0"]
        assert template_socket.startswith("socket:"), open_files(template)
        for sid, pid in supervisors.items():
            other = next(i for i in ids if i != sid)
            files = open_files(pid)
            # control: the probe sees this sandbox's own files (its log on stdout and stderr)
            assert files["1"] == files["2"] == str(support.sandbox_dir(server, sid) / "supervisor.log"), files
            assert files["0"] == "/dev/null", files
            assert not [f for f in files.values() if other in f], (sid, files)
            assert template_socket not in files.values(), (sid, files)
            assert not [f for f in files.values() if f.endswith(SUPERVISOR_TEMPLATE_LOG)], files
        # ...and no pipe or socket of the other's supervisor is among them (readlink names
        # those by inode; every epoll is the one anon_inode and says nothing)
        shared = set(open_files(supervisors[ids[0]]).values()) & set(open_files(supervisors[ids[1]]).values())
        assert {f for f in shared if not f.startswith("anon_inode:")} <= {"/dev/null"}, shared


def test_the_template_builds_the_seccomp_filter_its_children_would_each_build(spawn_server):
    """Built in a supervisor, the filter (libseccomp, through ctypes) made about a MiB of
    its memory its own; built in the template, every supervisor shares it: the template has
    libseccomp loaded (it never spawns a sandbox itself), and the sandbox still gets the filter."""
    server = spawn_server()
    with server.client(timeout=120) as c:
        created = support.create(c)  # once it has forked one, the template is past its start-up
        assert created["isolation"]["seccomp"] is True, created["isolation"]
        assert support.result_text(support.ok(support.execute(c, created["id"], "6 * 7"))) == "42"
        supervisor = support.supervisor_pid(server, created["id"])
    template = support.template_of(server)
    assert support.parent_of(supervisor) == template
    with open(f"/proc/{template}/maps") as f:
        assert "libseccomp" in f.read()


def test_with_the_template_off_the_server_starts_each_supervisor_itself(spawn_server):
    """The control: the same probe names the server as the parent."""
    server = spawn_server("--set", "supervisor_template=False")
    with server.client(timeout=120) as c:
        sid = support.create(c)["id"]
        pid = support.supervisor_pid(server, sid)
        assert not [p for p in support.children_of(server.proc.pid) if TEMPLATE in support.cmdline(p)]
        assert support.parent_of(pid) == server.proc.pid and support.cmdline(pid)[1:3] == ["-m", "sandbox.supervisor"]
        assert support.result_text(support.ok(support.execute(c, sid, "6 * 7"))) == "42"


@pytest.mark.slow
def test_a_killed_template_is_replaced_by_a_supervisor_of_the_servers_own(spawn_server):
    server = spawn_server()
    with server.client(timeout=120) as c:
        first = support.create(c)["id"]
        template = support.template_of(server)
        assert support.parent_of(support.supervisor_pid(server, first)) == template
        os.kill(template, signal.SIGKILL)
        assert support.wait_for(lambda: not support.pid_alive(template), 10)
        later = [support.create(c)["id"] for _ in range(2)]
        for sid in later:
            assert support.parent_of(support.supervisor_pid(server, sid)) == server.proc.pid
            assert support.result_text(support.ok(support.execute(c, sid, "6 * 7"))) == "42"
        # the template's children live on without it
        assert support.result_text(support.ok(support.execute(c, first, "6 * 7"))) == "42"
    log = server.log_path.read_text()
    assert log.count("the supervisor template failed") == 1, server.log_tail()


@pytest.mark.slow
def test_forked_supervisors_outlive_the_server_are_readopted_and_their_ttl_still_ends_them(spawn_server):
    ttl = 12
    server = spawn_server()
    with server.client(timeout=120) as c:
        sid = support.create(c, ttl_seconds=ttl)["id"]
        support.ok(support.execute(c, sid, "x = 41"))
    pid = support.supervisor_pid(server, sid)
    template = support.template_of(server)
    assert support.parent_of(pid) == template

    server.terminate()  # an orderly stop: sandboxes are kept, the template ends with the server
    assert support.wait_for(lambda: not support.pid_alive(template), 10), "the template outlived the server"
    assert support.is_supervisor(pid, support.sandbox_dir(server, sid)), "the supervisor died with the server"

    server.start()
    with server.client(timeout=120) as c:
        r = c.get(f"/v1/sandboxes/{sid}")
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        assert support.result_text(support.ok(support.execute(c, sid, "x + 1"))) == "42"
        # Its TTL, counted by its supervisor, ends it; the new server files it as expired.
        assert support.wait_for(lambda: c.get(f"/v1/sandboxes/{sid}").status_code == 410, ttl + 60), \
            c.get(f"/v1/sandboxes/{sid}").text
        assert c.get(f"/v1/sandboxes/{sid}").json()["error"]["state"] == "expired"
    assert support.wait_for(lambda: not support.pid_alive(pid), 30)


@pytest.mark.slow
def test_a_sandbox_woken_by_value_gets_a_supervisor_from_the_template(spawn_server):
    server = spawn_server("--set", "bwrap_sleep_after_seconds=2")
    with server.client(timeout=300) as c:
        sid = support.create(c, metadata={"save_label": "notebook:template"})["id"]
        support.ok(support.execute(c, sid, "x = 41"))
        asleep_pid = support.supervisor_pid(server, sid)
        assert support.wait_for(lambda: c.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused", 90)
        assert support.result_text(support.ok(support.execute(c, sid, "x + 1"))) == "42"
        woken = support.supervisor_pid(server, sid)
        assert woken != asleep_pid and support.parent_of(woken) == support.template_of(server)
