"""Stopping a server nobody uses: the kernel's embedded server ends by itself.

The embedded server is started by the first kernel that needs it and outlives that kernel
on purpose (the next kernel reuses it). Without this it would also outlive JupyterLab,
holding its warm pool (about 150 MiB a sandbox) until someone found its pid. So a server
started with ``idle_stop_seconds`` counts itself idle while no request is in flight and no
sandbox is tied to a live caller (a kernel's ``end_with_caller`` link: a kernel that holds a
sandbox keeps the server, however quiet the notebook); once idle for that long it stops the
way SIGTERM stops it (warm pool ended, kept sandboxes left to their deadlines, images
unmounted). A server started by hand with ``serve`` has ``idle_stop_seconds`` 0 and stays.
"""

from __future__ import annotations

import asyncio
import logging
import time
import typing as t

log = logging.getLogger("sandbox.service.idle")


# Polled by monitors, not used by anyone: a health check or a scrape keeps no server alive.
UNATTENDED = ("/v1/health", "/metrics")


class Activity:
    """ASGI middleware that counts requests in flight and remembers when the last ended."""

    def __init__(self, app: t.Any) -> None:
        self.app = app
        self.in_flight = 0
        self.last = time.monotonic()

    async def __call__(self, scope: dict, receive: t.Callable, send: t.Callable) -> None:
        if scope["type"] != "http" or scope.get("path") in UNATTENDED:
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            self.last = time.monotonic()


async def stop_when_idle(activity: Activity, callers: t.Callable[[], int], seconds: float,
                         stop: t.Callable[[], None], tick: float = 1.0) -> None:
    """Call ``stop()`` once nothing happened for ``seconds``: no request in flight or ended
    within it, and ``callers()`` (sandboxes tied to a live caller) 0 throughout."""
    quiet_since = time.monotonic()
    while True:
        await asyncio.sleep(min(tick, seconds))
        now = time.monotonic()
        if activity.in_flight or callers():
            quiet_since = now
            continue
        if now - max(quiet_since, activity.last) >= seconds:
            log.info("no kernel has used this server for %.0f s: stopping (idle_stop_seconds)", seconds)
            stop()
            return
