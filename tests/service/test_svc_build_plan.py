"""Before a first image build, `serve` says the plan (steps, time, disk) as its first line,
before its imports and checks: the kernel that started it shows the log's last line."""

from __future__ import annotations

import shutil
import subprocess

from support import make_state_dir
from sandbox.service.server_process import serve_command, source_env

# A configuration `serve` refuses right after its imports (a default over its maximum), so
# that the test sees what comes before that without building an image.
REFUSED = ("--set", "memory_mb=2048", "--set", "max_memory_mb=1024")


def first_lines(state) -> list[str]:
    done = subprocess.run(serve_command(state, *REFUSED), capture_output=True, text=True, env=source_env(),
                          timeout=120)
    assert done.returncode == 2, done
    return done.stderr.splitlines()


def test_the_plan_comes_first_when_the_default_image_is_not_built():
    state = make_state_dir("sk-plan-")
    try:
        lines = first_lines(state)
        assert lines[0].startswith("the 'default' image is not built yet; building it first: 5 steps"), lines
        assert "750 MiB of disk" in lines[0] and " s " in lines[0], lines
        assert lines[1].startswith("refusing to start: a default limit is over its maximum"), lines
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_control_no_plan_when_the_image_is_built(sandbox_server):
    state = make_state_dir("sk-plan-", images_from=sandbox_server.state_dir)
    try:
        lines = first_lines(state)
        assert lines[0].startswith("refusing to start"), lines
    finally:
        shutil.rmtree(state, ignore_errors=True)
