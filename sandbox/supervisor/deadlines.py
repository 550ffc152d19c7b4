"""The deadlines a supervisor keeps even when no server is running.

The TTL (slid by every execute, command and renew; see ``StateRecord.touch``) ends an
idle sandbox, the absolute lifetime cap ends any sandbox, and a cell or command that
ignores its interrupt for INTERRUPT_GRACE seconds is escalated (``execute``, ``commands``).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ..runtime import vocabulary as V

if TYPE_CHECKING:
    from .lifecycle import Supervisor

INTERRUPT_GRACE = 2.0
CHECK_EVERY = 0.25


async def watch_deadlines(supervisor: "Supervisor") -> None:
    record, channel = supervisor.record, supervisor.channel
    while not supervisor.finished.is_set():
        await asyncio.sleep(CHECK_EVERY)
        now = time.time()
        if now >= record["max_expires_at"]:
            await supervisor.end(V.EXPIRED, "it reached its maximum lifetime of "
                                 f"{supervisor.spec['max_lifetime_seconds']} s")
            return
        if (now >= record["expires_at"] and channel.cell is None and not supervisor.exec_lock.locked()
                and not channel.commands):
            what = "pool idle time" if record["pooled"] else f"TTL of {record['ttl_seconds']} s"
            await supervisor.end(V.EXPIRED, f"it was not used within its {what}")
            return
