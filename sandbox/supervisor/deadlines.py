"""The deadlines a supervisor keeps even when no server is running.

The TTL (slid by every execute, command and renew; see ``StateRecord.touch``) ends an
idle sandbox (or pauses it, with ``on_idle: "pause"``), the absolute lifetime cap ends any sandbox, and a cell or command that
ignores its interrupt for INTERRUPT_GRACE seconds is escalated (``execute``, ``commands``).
"""

from __future__ import annotations

import asyncio
import time

from ..runtime import vocabulary as V
from .core import SupervisorCore
from .pausing import pause

INTERRUPT_GRACE = 2.0
CHECK_EVERY = 0.25


async def watch_deadlines(supervisor: SupervisorCore) -> None:
    record, channel = supervisor.record, supervisor.channel
    while not supervisor.finished.is_set():
        await asyncio.sleep(CHECK_EVERY)
        now = time.time()
        if now >= record["max_expires_at"]:
            await supervisor.end(V.EXPIRED, "it reached its maximum lifetime of "
                                 f"{supervisor.spec['max_lifetime_seconds']} s")
            return
        if (now >= record["expires_at"] and channel.cell is None and not supervisor.exec_lock.locked()
                and not channel.commands and record["state"] in (V.RUNNING, V.POOLED)):
            what = "pool idle time" if record["pooled"] else f"TTL of {record['ttl_seconds']} s"
            if supervisor.spec.get("on_idle") == V.ON_IDLE_PAUSE:  # sleep on disk instead of ending
                reply = await pause(supervisor, f"it was not used within its {what}", by=V.PAUSED_BY_TTL)
                if reply.get("ok"):
                    supervisor.finished.set()
                    return
                what += f", and could not be paused ({reply.get('message')})"
            await supervisor.end(V.EXPIRED, f"it was not used within its {what}")
            return
