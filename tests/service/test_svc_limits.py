"""Limits a create asks for are checked before anything starts: against what one sandbox
may have here (the operator's maxima, the host's memory, CPUs and free disk) and against
what all live sandboxes hold together. Refusals are 4xx with a body that says what is
allowed, and /v1/info reports the same numbers for a placement layer.
"""

from __future__ import annotations

import os
import secrets
import threading

import pytest

from support import Server, create, make_state_dir
from svc_support import api_error

MiB = 1024 * 1024
ABSURD = {"memory_mb": 1048576, "cpus": 1024, "pids": 4194304, "disk_mb": 1000000}


def host_memory_mb() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("MemTotal:"))


def live_ids(api) -> set[str]:
    return {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]}


@pytest.mark.slow
def test_limits_the_host_cannot_keep_are_refused(sandbox_server, api, new_sandbox):
    before = live_ids(api)
    error = api_error(api.post("/v1/sandboxes", json=ABSURD), 422)
    assert error["code"] == "limit_exceeded", error
    assert set(error["exceeded"]) == set(ABSURD), error  # every field named at once
    allowed = error["allowed"]
    st = os.statvfs(sandbox_server.state_dir)
    assert allowed["memory_mb"] <= host_memory_mb()
    assert allowed["cpus"] <= len(os.sched_getaffinity(0))
    assert allowed["disk_mb"] <= st.f_bavail * st.f_frsize // MiB
    assert allowed["pids"] < ABSURD["pids"]
    for key in ABSURD:
        assert error["exceeded"][key]["requested"] == ABSURD[key] and key in error["message"], error
    assert live_ids(api) == before, "a refused create left a sandbox behind"
    # control: asking for exactly what is allowed (pids, cpus) is granted, and in force
    sandbox = new_sandbox(memory_mb=512, cpus=allowed["cpus"], pids=allowed["pids"])
    assert sandbox["limits"]["pids"] == allowed["pids"] and sandbox["limits"]["cpus"] == allowed["cpus"]


def test_info_reports_maxima_and_free_capacity(api, new_sandbox):
    info = api.get("/v1/info").json()
    for key in ("memory_mb", "cpus", "pids", "disk_mb", "ttl_seconds", "max_lifetime_seconds"):
        assert info["maxima"][key] > 0, info["maxima"]
    assert info["host"]["memory_mb"] == info["maxima"]["memory_mb"] <= host_memory_mb()
    assert info["host"]["cpus"] == len(os.sched_getaffinity(0))
    memory = info["capacity"]["memory_mb"]
    assert memory["enforced"] is True and memory["total"] == info["host"]["memory_mb"], memory
    assert memory["free"] == memory["total"] - memory["used"]

    new_sandbox(memory_mb=300, cpus=0.25)
    after = api.get("/v1/info").json()["capacity"]
    reserved = min(300, info["defaults"]["memory_request_mb"] or 300)  # the request, not the limit
    assert after["memory_mb"]["used"] == memory["used"] + reserved, (memory, after["memory_mb"])
    assert after["memory_mb"]["free"] == memory["free"] - reserved
    assert after["sandboxes"]["used"] == info["capacity"]["sandboxes"]["used"] + 1
    assert after["cpus"]["used"] == pytest.approx(info["capacity"]["cpus"]["used"] + 0.25)


@pytest.fixture(scope="module")
def small_server(sandbox_server):
    """A server whose operator allows little: 1000 MiB in total, two sandboxes, at most
    700 MiB and 10 minutes of TTL each; each sandbox reserves its whole memory limit."""
    state = make_state_dir("sbk-limits-", images_from=sandbox_server.state_dir)
    settings = ["total_memory_mb=1000", "memory_request_mb=0", "max_sandboxes=2", "max_memory_mb=700", "max_ttl_seconds=600", "ttl_seconds=300",
                "memory_mb=256"]
    server = Server(state, "--pool-size", "0", *[a for s in settings for a in ("--set", s)],
                    token=secrets.token_hex(16), start_timeout=300)
    with server:
        yield server


@pytest.mark.slow
def test_operator_maxima_and_totals_are_enforced(small_server):
    with small_server.client(timeout=120) as api:
        error = api_error(api.post("/v1/sandboxes", json={"memory_mb": 800}), 422)
        assert error["exceeded"]["memory_mb"] == {"requested": 800, "allowed": 700, "set_by": "max_memory_mb"}, error
        error = api_error(api.post("/v1/sandboxes", json={"memory_mb": 256, "ttl_seconds": 601}), 422)
        assert set(error["exceeded"]) == {"ttl_seconds"}, error

        first = create(api, memory_mb=600)
        error = api_error(api.post("/v1/sandboxes", json={"memory_mb": 600}), 409)
        assert error["code"] == "capacity_exceeded"
        assert error["exceeded"]["memory_mb"] == {"requested": 600, "free": 400, "total": 1000, "reserved": 600}, error
        assert error["free"]["memory_mb"] == 400
        second = create(api, memory_mb=400)
        error = api_error(api.post("/v1/sandboxes", json={"memory_mb": 64}), 409)
        assert set(error["exceeded"]) == {"memory_mb", "sandboxes"}, error
        capacity = api.get("/v1/info").json()["capacity"]
        assert capacity["memory_mb"] == {"total": 1000, "used": 1000, "free": 0, "enforced": True}
        assert capacity["sandboxes"] == {"total": 2, "used": 2, "free": 0, "enforced": True}
        error = api_error(api.post(f"/v1/sandboxes/{first['id']}/renew", json={"ttl_seconds": 601}), 422)
        assert error["code"] == "limit_exceeded"

        # deleting gives the room back
        assert api.delete(f"/v1/sandboxes/{second['id']}").status_code == 200
        third = create(api, memory_mb=400)
        assert api.delete(f"/v1/sandboxes/{third['id']}").status_code == 200
        assert api.delete(f"/v1/sandboxes/{first['id']}").status_code == 200


@pytest.mark.slow
def test_concurrent_creates_cannot_both_take_the_last_room(small_server):
    """The room a create is given is held while its sandbox starts: two creates racing for
    the last 600 MiB of a 1000 MiB total cannot both be granted."""
    statuses: list[int] = []
    made: list[str] = []

    def make():
        with small_server.client(timeout=120) as api:
            r = api.post("/v1/sandboxes", json={"memory_mb": 600})
            statuses.append(r.status_code)
            if r.status_code == 201:
                made.append(r.json()["id"])

    threads = [threading.Thread(target=make) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with small_server.client(timeout=120) as api:
        for sandbox_id in made:
            api.delete(f"/v1/sandboxes/{sandbox_id}")
    assert sorted(statuses) == [201, 409], statuses
