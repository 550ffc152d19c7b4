"""Before a first image build, `serve` says the plan (steps, time, disk) as its first line,
before its imports and checks: the kernel that started it shows the log's last line."""

from __future__ import annotations

import shutil
import socket
import subprocess

from support import make_state_dir
from sandbox.service.server_process import serve_command, source_env

# A configuration `serve` refuses outright (a default over its maximum).
REFUSED = ("--set", "memory_mb=2048", "--set", "max_memory_mb=1024")


def first_lines(state) -> list[str]:
    """What `serve` says when it stops at its first slow step's end: it cannot listen on its
    port (one this test holds), after its imports and protection probes and before any build.
    (A configuration it refuses outright stops it before the plan: that server builds nothing.)"""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        done = subprocess.run(serve_command(state, "--port", str(held.getsockname()[1])), capture_output=True,
                              text=True, env=source_env(), timeout=120)
    assert done.returncode == 2, done
    return done.stderr.splitlines()


def test_the_plan_comes_first_when_the_default_image_is_not_built():
    state = make_state_dir("sk-plan-")
    try:
        lines = first_lines(state)
        assert lines[0].startswith("the 'default' image is not built yet; building it first: 5 steps"), lines
        assert "750 MiB of disk" in lines[0] and " s " in lines[0], lines
        assert lines[-1].startswith("not starting: cannot listen on"), lines
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_control_no_plan_when_the_image_is_built(sandbox_server):
    state = make_state_dir("sk-plan-", images_from=sandbox_server.state_dir)
    try:
        lines = first_lines(state)
        assert not any("not built yet" in line for line in lines), lines
        assert lines[-1].startswith("not starting: cannot listen on"), lines
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_a_refused_configuration_says_no_plan():
    """It would build nothing: its refusal is all it says (docs/cli-messages.md: one line)."""
    state = make_state_dir("sk-plan-")
    try:
        done = subprocess.run(serve_command(state, *REFUSED), capture_output=True, text=True, env=source_env(),
                              timeout=120)
        assert done.returncode == 2, done
        assert done.stderr.splitlines() == [
            "refusing to start: a default limit is over its maximum: memory_mb 2048 > max_memory_mb 1024"], done
    finally:
        shutil.rmtree(state, ignore_errors=True)
