"""The supervisor's merge of queued stream events (sandbox/supervisor/execute.py)."""

from __future__ import annotations

import asyncio

from sandbox.runtime import vocabulary as V
from sandbox.supervisor.execute import MERGE_MAX_CHARS, merge_streams


def queue_of(*events: dict) -> asyncio.Queue:
    q: asyncio.Queue = asyncio.Queue()
    for e in events:
        q.put_nowait(e)
    return q


def test_same_name_merges_up_to_another_event_which_is_handed_back():
    shown = {"type": V.DISPLAY_DATA, "data": {"text/plain": "x"}}
    q = queue_of(V.stream_event(V.STDOUT, "b"), V.stream_event(V.STDOUT, "c"), shown, V.stream_event(V.STDOUT, "d"))
    merged, held = merge_streams(V.stream_event(V.STDOUT, "a"), q)
    assert merged["text"] == "abc" and held is shown and q.qsize() == 1


def test_another_stream_name_ends_the_merge():
    err = V.stream_event(V.STDERR, "e")
    merged, held = merge_streams(V.stream_event(V.STDOUT, "a"), queue_of(err))
    assert merged == V.stream_event(V.STDOUT, "a") and held is err


def test_nothing_queued_nothing_waited_for():
    first = V.stream_event(V.STDOUT, "a")
    assert merge_streams(first, asyncio.Queue()) == (first, None)


def test_a_merge_is_bounded_and_keeps_a_cut():
    piece = "x" * 1000
    q = queue_of(*[V.stream_event(V.STDOUT, piece) for _ in range(200)])
    q.put_nowait({**V.stream_event(V.STDOUT, "y"), "truncated": True})
    merged, held = merge_streams(V.stream_event(V.STDOUT, piece), q)
    assert held is None and MERGE_MAX_CHARS <= len(merged["text"]) < MERGE_MAX_CHARS + 1000
    later = []  # the rest goes in the next events
    while q.qsize():
        later.append(merge_streams(q.get_nowait(), q)[0])
    assert len(later) == 3 and later[-1].get("truncated") is True and not later[0].get("truncated")
    assert len(merged["text"]) + sum(len(e["text"]) for e in later) == 201 * 1000 + 1
