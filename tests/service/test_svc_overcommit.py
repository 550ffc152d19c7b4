"""Admission by use: sandboxes reserve their memory *request*, not their limit, so a server
admits more of them than their limits would fit while real memory is free; a refusal says
why (the reservations, or the host's real memory running short)."""

from __future__ import annotations

import pytest

from support import create, execute, ok, own_server, stream_text
from svc_support import api_error

# Two sandboxes' limits fill this total; their requests leave room for three.
TOTAL, LIMIT, REQUEST = "total_memory_mb=1024", "memory_mb=512", 300


def overcommit_server(sandbox_server, request_mb: int, *more: str):
    settings = [TOTAL, LIMIT, f"memory_request_mb={request_mb}", *more]
    return own_server(sandbox_server.state_dir, *[a for s in settings for a in ("--set", s)])


@pytest.mark.slow
def test_more_sandboxes_than_limits_fit_are_admitted_and_answer(sandbox_server):
    with overcommit_server(sandbox_server, REQUEST) as server, server.client(timeout=120) as api:
        made = [create(api) for _ in range(3)]  # 3 x 512 MB of limits on a 1024 MB total
        for sandbox in made:
            assert sandbox["limits"]["memory_mb"] == 512, sandbox  # the limit is what was asked
            assert stream_text(ok(execute(api, sandbox["id"], "print(6 * 7)"))) == "42\n"
        capacity = api.get("/v1/info").json()["capacity"]["memory_mb"]
        assert capacity["used"] == 3 * REQUEST, capacity
        error = api_error(api.post("/v1/sandboxes", json={}), 409)
        assert error["code"] == "capacity_exceeded", error
        assert f"reserving its request of {REQUEST}" in error["message"], error
        assert error["exceeded"]["memory_mb"]["free"] == 1024 - 3 * REQUEST, error


@pytest.mark.slow
def test_control_reserving_whole_limits_refuses_the_third(sandbox_server):
    """The control: with memory_request_mb=0 a sandbox reserves its whole limit, as before,
    and the third create on the same total is refused."""
    with overcommit_server(sandbox_server, 0) as server, server.client(timeout=120) as api:
        made = [create(api) for _ in range(2)]
        error = api_error(api.post("/v1/sandboxes", json={}), 409)
        assert error["exceeded"]["memory_mb"] == {"requested": 512, "free": 0, "total": 1024,
                                                  "reserved": 512}, error
        assert len(made) == 2


@pytest.mark.slow
def test_a_create_the_hosts_real_memory_cannot_hold_is_refused_with_the_reason(sandbox_server):
    """Keeping more real memory free than the host has: nothing fits, there is no idle gVisor
    sandbox to put to sleep, and the refusal names the reason and the numbers."""
    with overcommit_server(sandbox_server, REQUEST, "memory_reserve_mb=100000000") as server, \
            server.client(timeout=120) as api:
        error = api_error(api.post("/v1/sandboxes", json={}), 409)
        assert error["code"] == "capacity_exceeded", error
        assert error["reason"] == "host_memory_short", error
        assert error["request_mb"] == REQUEST and error["reserve_mb"] == 100000000, error
        assert 0 < error["available_mb"] and "MB available" in error["message"], error
        assert "no idle gVisor sandbox" in error["message"], error
        assert api.get("/v1/info").json()["capacity"]["sandboxes"]["used"] == 0
