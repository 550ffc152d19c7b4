"""A handler's task handed over the way pyzmq's stream does (a future of what the callback
returns, then dropped), and a cycle collection while the handler waits on a future only it
can reach: whether its task lives through it and the handler finishes
(sandbox/common/background.py)."""

from __future__ import annotations

import asyncio
import gc
import typing as t
import weakref


def waiting_handler(finished: list[bool]) -> t.Callable[[t.Any], t.Awaitable[None]]:
    """A handler that waits for an answer (the sandbox's, the server's) only it holds."""

    async def handler(msg: t.Any) -> None:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        loop.call_later(0.2, _answer, weakref.ref(answer))
        await answer
        finished.append(True)

    return handler


def _answer(ref: weakref.ref) -> None:
    answer = ref()
    if answer is not None:  # collected with its task: nobody is there to answer
        answer.set_result(None)


def lives_through_a_collection(hand_over: t.Callable[[], t.Awaitable[t.Any]]) -> bool:
    """Whether the task of ``hand_over()`` is still there after a collection mid-wait."""

    async def scenario() -> bool:
        task = weakref.ref(asyncio.ensure_future(hand_over()))  # pyzmq keeps no reference
        await asyncio.sleep(0.05)  # it runs, then waits for its answer
        gc.collect()
        alive = task() is not None
        await asyncio.sleep(0.3)
        return alive

    return asyncio.run(scenario())
