"""When the host's real memory cannot hold a create, the server first puts an idle gVisor
sandbox to sleep (a checkpoint: its memory goes back to the host), and only then refuses,
saying so. The create asks for more memory than the host has as its request (requests equal
to limits here, and a total twice the host's), so it stays short however much the sleep frees,
and the test sees both effects: the idle sandbox asleep, and the refusal that names it."""

from __future__ import annotations

import time

import pytest

import support
from sandbox.core.capacity import host_facts
from sandbox.core.memory_pressure import HOST_MEMORY_SHORT, IDLE_ENOUGH_SECONDS


@pytest.mark.slow
def test_an_idle_gvisor_sandbox_is_put_to_sleep_before_a_create_is_refused(spawn_server):
    host_mb = host_facts("/").memory_mb
    server = spawn_server("--set", "memory_request_mb=100000000", "--set", f"total_memory_mb={2 * host_mb}",
                          "--set", "gvisor_sleep_after_seconds=0")  # the sleeper itself stays out of it
    with server.client(timeout=180) as api:
        idle = support.create(api, isolation="gvisor", memory_mb=256)["id"]
        support.ok(support.execute(api, idle, "x = 41"))
        time.sleep(IDLE_ENOUGH_SECONDS + 2)  # what the supervisor asks before it lets a pause through
        r = api.post("/v1/sandboxes", json={"memory_mb": host_mb})
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["reason"] == HOST_MEMORY_SHORT and error["slept"] == 1, error
        assert "1 idle gVisor sandbox(es) were put to sleep" in error["message"], error
        asleep = api.get(f"/v1/sandboxes/{idle}").json()
        assert asleep["state"] == "paused" and asleep["paused_by"] == "idle", asleep
        assert support.result_text(support.ok(support.execute(api, idle, "x + 1"))) == "42"  # woken with its state


@pytest.mark.slow
def test_control_a_busy_gvisor_sandbox_is_not_put_to_sleep(spawn_server):
    """Used a moment ago, the sandbox is left running and the refusal says none could sleep."""
    host_mb = host_facts("/").memory_mb
    server = spawn_server("--set", "memory_request_mb=100000000", "--set", f"total_memory_mb={2 * host_mb}",
                          "--set", "gvisor_sleep_after_seconds=0")
    with server.client(timeout=180) as api:
        used = support.create(api, isolation="gvisor", memory_mb=256)["id"]
        support.ok(support.execute(api, used, "x = 41"))
        error = api.post("/v1/sandboxes", json={"memory_mb": host_mb}).json()["error"]
        assert error["reason"] == HOST_MEMORY_SHORT and error["slept"] == 0, error
        assert api.get(f"/v1/sandboxes/{used}").json()["state"] == "running"
