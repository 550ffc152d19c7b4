"""The server page's curl example over TCP (docs/service.md), run as written on a server of its own (its port in place
of 8765, its state directory as STATE, its token in STATE/token as the page says): it
creates a sandbox, runs a cell, and leaves nothing running. The control: the same block
without its DELETE line leaves the sandbox it created."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from docblocks import blocks

import support
from support import REPO

pytestmark = pytest.mark.slow  # a server of its own


def tcp_example() -> str:
    [block] = [b for b in blocks([REPO / "docs" / "service.md"]) if "TOKEN=$(cat $STATE/token)" in b.code]
    return block.code


def run_on(server: support.Server, code: str) -> subprocess.CompletedProcess:
    script = code.replace("localhost:8765", f"127.0.0.1:{server.port}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")}
    env["STATE"] = str(server.state_dir)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)


def sandboxes_of(server: support.Server) -> list[str]:
    with server.client() as c:
        return [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]]


@pytest.fixture(scope="module")
def server(image_source):
    """A server that writes its own token to STATE/token, as one started by hand does."""
    srv = support.Server(support.make_state_dir("sk-tcp-", images_from=image_source), "--pool-size", "0",
                         token=None, start_timeout=support.OWN_SERVER_START_TIMEOUT)
    srv.open()
    yield srv
    srv.close()


def test_the_tcp_example_cleans_up_after_itself(server):
    code = tcp_example()
    ran = run_on(server, code)
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    # print() may reach the stream as one write or two ("42", then "\n"): the text is what counts
    assert "".join(e.get("text", "") for e in events if e.get("type") == "stream") == "42\n", ran.stdout
    assert sandboxes_of(server) == []  # the sandbox it made is gone
    # The control: without the DELETE line, the sandbox it created is still there.
    kept = run_on(server, "\n".join(line for line in code.splitlines() if "-XDELETE" not in line))
    assert kept.returncode == 0, kept.stderr
    assert len(sandboxes_of(server)) == 1
