"""Capacity per user on a shared server (sandbox/core/capacity.py): the arithmetic of the share.

One user holds its share of every total; its next create is refused with a 409 naming the
user, its share and what is free of it, while another user still has room. Control: with
``user_share`` 1 (no per-user cap) the same create passes, and the other user is the one
left with ``0 free``. The real server's path is tests/multiuser/test_multiuser.py.
"""

from __future__ import annotations

import pytest

from sandbox.core import capacity
from sandbox.core.config import ServiceConfig
from sandbox.common.errors import ApiError

HOST = capacity.Host(memory_mb=8192, cpus=2, disk_free_mb=100_000)
LIMITS = {"memory_mb": 1024, "cpus": 1.0, "pids": 256, "disk_mb": 1024}


def held(n: int) -> dict:
    return capacity.usage([LIMITS] * n)


def check(config: ServiceConfig, user: int, mine: int, everyone: int) -> None:
    capacity.check(config, HOST, LIMITS, 600, 3600, held(everyone), user=user, user_used=held(mine))


def test_one_user_cannot_take_what_is_left_for_others():
    config = ServiceConfig(multi_user=True, max_sandboxes=4, user_share=0.5)
    check(config, 1001, mine=1, everyone=1)  # alice's second: within her share of 2
    with pytest.raises(ApiError) as refused:
        check(config, 1001, mine=2, everyone=2)
    err = refused.value
    assert err.status == 409 and err.code == "capacity_exceeded", err.body()
    assert "uid 1001's share of this server is used" in err.message and "sandboxes 1 does not fit: 0 free of its 2" \
        in err.message, err.message
    body = err.body()["error"]
    assert body["user"] == 1001 and body["free"]["sandboxes"] == 0 and body["exceeded"]["sandboxes"]["server_free"] == 2
    check(config, 1002, mine=0, everyone=2)  # bob still has his share
    # Control: no per-user cap, alice takes the rest and bob is refused by the server's total.
    open_config = ServiceConfig(multi_user=True, max_sandboxes=4, user_share=1.0)
    check(open_config, 1001, mine=2, everyone=2)
    check(open_config, 1001, mine=3, everyone=3)
    with pytest.raises(ApiError) as full:
        check(open_config, 1002, mine=0, everyone=4)
    assert "this server has no room" in full.value.message and "0 free" in full.value.message


def test_the_share_applies_only_on_a_shared_server_and_to_capped_totals():
    check(ServiceConfig(multi_user=False, max_sandboxes=4, user_share=0.5), 1001, mine=3, everyone=3)
    # memory's total is the host's (8192 MB) even when not configured: half of it is a user's.
    config = ServiceConfig(multi_user=True, user_share=0.5)
    check(config, 1001, mine=3, everyone=3)
    with pytest.raises(ApiError) as refused:
        check(config, 1001, mine=4, everyone=4)
    assert "memory_mb 1024 does not fit: 0 free of its 4096" in refused.value.message, refused.value.message


def test_a_paused_sandbox_holds_its_disk_and_its_checkpoint():
    from sandbox.core.admission import held

    MiB = 1024 * 1024
    paused = {"state": "paused", "limits": {"memory_mb": 1024, "disk_mb": 1024},
              "checkpoint": {"size_bytes": 650 * MiB + 1}}
    assert held(paused) == {"disk_mb": 1024 + 651}
    # Control: running, it holds its limits (its memory in RAM, not on disk).
    assert held({**paused, "state": "running"}) == paused["limits"]
    config = ServiceConfig(total_disk_mb=2048)
    with pytest.raises(ApiError) as refused:
        capacity.check(config, HOST, LIMITS, 600, 3600, capacity.usage([held(paused)]))
    assert "disk_mb 1024 does not fit: 373 free of 2048" in refused.value.message, refused.value.message
