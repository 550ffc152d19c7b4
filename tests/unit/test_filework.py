"""The file-work threads (sandbox/core/filework.py): one sandbox cannot hold what others need.

A sandbox's file calls (a DELETE on a tree it keeps refilling runs until its deadline) are
stood in for by calls that block until released: real threads of the real pool, blocked
for as long as the test says, so the order of events is exact. The attacker fills its
share and queues more; the bystander's call completes while every one of the attacker's
is still held. Control: a share as large as the pool (the protection off), and the
bystander's call completes only after one of the attacker's is released.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from sandbox.core.filework import FileWork

ATTACKS = 8


async def bystander_while_saturated(work: FileWork) -> dict:
    release = threading.Event()
    released_first: list[bool] = []

    def held() -> str:
        release.wait(60)
        return "attacker"

    def listing() -> str:
        released_first.append(release.is_set())
        return "listed"

    attacks = [asyncio.ensure_future(work.run("attacker", held)) for _ in range(ATTACKS)]
    await asyncio.sleep(0.2)  # not an assertion: lets the attacker take its threads first
    other = asyncio.ensure_future(work.run("bystander", listing))
    done, _ = await asyncio.wait({other}, timeout=5)
    in_use = work.in_use("attacker")
    release.set()
    results = await asyncio.gather(*attacks, other)
    return {"listed_while_held": bool(done), "released_first": released_first, "attacker_in_use": in_use,
            "results": results, "left": work.in_use("attacker") + work.in_use("bystander")}


@pytest.mark.timeout(120)
def test_one_sandbox_cannot_hold_the_file_threads_of_others():
    work = FileWork(threads=4, per_sandbox=2)
    try:
        seen = asyncio.run(bystander_while_saturated(work))
    finally:
        work.close()
    assert seen["listed_while_held"] and seen["released_first"] == [False], seen
    assert seen["attacker_in_use"] == ATTACKS, seen  # all of its calls still running or waiting
    assert seen["results"] == ["attacker"] * ATTACKS + ["listed"] and seen["left"] == 0, seen
    # Control: the share as large as the pool, and the bystander waits for a released thread.
    work = FileWork(threads=4, per_sandbox=ATTACKS)
    try:
        control = asyncio.run(bystander_while_saturated(work))
    finally:
        work.close()
    assert not control["listed_while_held"] and control["released_first"] == [True], control


def test_a_sandbox_calls_run_at_most_its_share_at_once():
    work = FileWork(threads=8, per_sandbox=2)
    running, peak, lock = [0], [0], threading.Lock()

    def call() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        threading.Event().wait(0.05)
        with lock:
            running[0] -= 1

    async def main() -> None:
        await asyncio.gather(*(work.run("s", call) for _ in range(10)))

    try:
        asyncio.run(main())
    finally:
        work.close()
    assert peak[0] == 2, peak
