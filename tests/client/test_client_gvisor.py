"""The client's gvisor surface: create(isolation=..., on_idle=...), pause() and resume(),
in both flavours (the `client` fixture)."""

from __future__ import annotations

import pytest

from sandbox.isolation import gvisor

AVAILABLE, WHY = gvisor.available()


@pytest.mark.skipif(not AVAILABLE, reason=f"gvisor backend unavailable here: {WHY}")
def test_pause_and_resume_through_the_client(client, sandbox_server):
    server = sandbox_server
    with client.Sandbox.create(isolation="gvisor", on_idle="pause", url=server.url, token=server.token) as s:
        assert s.info.isolation["backend"] == "gvisor" and s.info.raw["on_idle"] == "pause"
        s.run_code("x = 6 * 7")
        paused = s.pause()
        assert paused.state == "paused" and paused.raw["checkpoint"]["size_bytes"] > 0
        assert s.resume().state == "running"
        assert s.run_code("x").results[0]["text/plain"] == "42"
