"""The watch on the nodes' calls in flight: what ends a call that its node will not end.

A node that vanishes (a host powered off, a process stopped) sends no reset: its
connections stay open and silent. The node table notices from its periodic ``/v1/info``
(the node is *down*); once it has been down for a whole ``node_timeout_seconds`` more it is
*lost*, and every relayed call still waiting on it is ended here: an error answer if none
has started, the closing events of an execute stream, or a cut. The same pass ends a call
other than an execute whose node has sent nothing for its read timeout.

One pass a second over the nodes that have calls in flight replaces what each call used to
do for itself (a task and an ``asyncio.wait`` with a timeout per request and per chunk), so
the data path pays nothing for it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .nodes import NodeTable

log = logging.getLogger("sandbox.gateway.watchdog")
WATCH_SECONDS = 1.0


def end_stalled_calls(table: NodeTable) -> None:
    now = time.monotonic()
    for node in list(table.nodes.values()):
        if not node.calls:
            continue
        if table.lost(node, now):
            log.warning("node %s (%s) stopped answering: ending its %d call(s) in flight",
                        node.node_id, node.address, len(node.calls))
            for call in list(node.calls):
                call.node_lost()
            continue
        for call in list(node.calls):
            if (call.read_timeout is not None and now - call.progress_at > call.read_timeout
                    and not call.client.write_paused):  # (a client reading slowly is not the node's fault)
                call.timed_out()


async def watch(table: NodeTable) -> None:
    while True:
        await asyncio.sleep(WATCH_SECONDS)
        try:
            end_stalled_calls(table)
        except Exception:
            log.exception("the watch on calls in flight failed")
