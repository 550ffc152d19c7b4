"""The embedded server's life: it stops by itself once no kernel uses it, and
`sandbox-kernel lab` stops the server its kernels started when JupyterLab exits; either
way nothing of ours is left on the host: no process, no mount (docs/operations.md, "When the server
stops").

Each test has a state directory that owns its images, as a newcomer's does (the images are
hard links of the session's, so nothing is built, but their loop mounts are this state
directory's own), and none of its sandboxes is kept (a kept notebook sandbox outlives the
server by design and is covered by its own tests).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest
import testrun
from support import (REPO, free_port, jupyter_answers, make_state_dir, pid_alive, processes_of, sandbox_ids, sweep,
                     wait_for, with_repo_on_path)

from sandbox.service import housekeeping
from sandbox.service.endpoint import unix
from sandbox.common.paths import StateDir

pytestmark = pytest.mark.slow


@pytest.fixture
def own_images_state(image_source: pathlib.Path):
    """A fresh state directory holding (hard links of) the built images, their records
    pointing at this directory: its servers mount its own packs."""
    home = testrun.image_home()  # where the run's images really are (image_source borrows them)
    state = make_state_dir("sk-life-")
    shutil.rmtree(state / "images", ignore_errors=True)
    top = str(home / "images")

    def left_out(folder: str, names: list[str]) -> list[str]:
        """Mounts and locks; and every image but the default and the trees images share
        (``_python``, the interpreter): another worker may be building an image under its
        final name (an own root's files come and go meanwhile)."""
        return [n for n in names if n.endswith((".mnt", ".lock"))
                or (folder == top and n != "default" and not n.startswith("_"))]

    shutil.copytree(home / "images", state / "images", copy_function=os.link, symlinks=True, ignore=left_out)
    for record in (state / "images").glob("*/image.json"):
        text = record.read_text().replace(str(home), str(state))
        record.unlink()  # a hard link: the source's record stays as it was
        record.write_text(text)
    yield state
    housekeeping.stop_server(StateDir(str(state)), timeout=30)
    sweep(state)
    shutil.rmtree(state, ignore_errors=True)


def user_env(state: pathlib.Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")}
    env.update(SANDBOX_KERNEL_STATE_DIR=str(state), **extra)
    return with_repo_on_path(env)


def nothing_left(state: pathlib.Path) -> tuple[dict, list]:
    return processes_of(state, sandbox_ids(state)), housekeeping.mounts_under(str(state))


def test_the_embedded_server_stops_once_no_kernel_uses_it(own_images_state):
    from kernel.server import ensure_server

    state = own_images_state
    # a grace longer than a loaded host takes to start the holder below (at 3 s the server
    # once stopped before the holder's first call reached it)
    assert ensure_server(unix(state / "server.sock"), state, timeout=120, idle_seconds=15)
    server = housekeeping.running_server(StateDir(str(state)))
    assert server and server["idle_stop_seconds"] == 15
    # A caller holding a sandbox (a kernel does this with end_with_caller) keeps it up.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom sandbox.client import Sandbox\n"
         f"s = Sandbox.create(state_dir={str(state)!r}, end_with_caller=True)\nprint(s.id, flush=True)\n"
         "time.sleep(600)"], cwd=str(REPO), env=user_env(state), stdout=subprocess.PIPE, text=True)
    try:
        sandbox_id = holder.stdout.readline().strip()
        assert sandbox_id.startswith("sbx-")
        time.sleep(20)  # well past the grace
        assert pid_alive(server["pid"]), "the server stopped under a caller holding a sandbox"
        if os.geteuid() == 0:  # the control: a root server mounts the image's packs here
            assert any(p.endswith(".mnt") for p in housekeeping.mounts_under(str(state / "images")))
    finally:
        holder.kill()
        holder.wait()
    # The caller is gone, so is its sandbox; after the grace the server stops by itself.
    assert wait_for(lambda: not pid_alive(server["pid"]), 90), "the idle server did not stop"
    assert wait_for(lambda: nothing_left(state) == ({}, []), 30), nothing_left(state)
    assert not (state / "server.json").exists() and not (state / "server.sock").exists()


def test_lab_stops_the_server_its_kernels_started(own_images_state, tmp_path):
    state = own_images_state
    port, token = free_port(), "lab-test-token"
    env = user_env(state, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    lab = subprocess.Popen([sys.executable, "-m", "sandbox", "lab", "--port", str(port), "--state-dir", str(state),
                            "--", f"--ServerApp.token={token}", f"--ServerApp.root_dir={tmp_path}"],
                           # not the checkout: it is on PYTHONPATH, and a kernel refuses a folder on its sys.path
                           cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: jupyter_answers(base, token), 90), "JupyterLab did not come up"
        r = httpx.post(f"{base}/api/kernels", params={"token": token}, json={"name": "sandbox"}, timeout=30)
        assert r.status_code == 201, r.text
        # The kernel claims its sandbox at start, starting the state directory's server.
        sdir = StateDir(str(state))
        assert wait_for(lambda: housekeeping.running_server(sdir) and housekeeping.live_sandboxes(sdir), 180), \
            "the kernel did not start the server and its sandbox"
        server_pid = housekeeping.running_server(sdir)["pid"]
        if os.geteuid() == 0:
            assert housekeeping.mounts_under(str(state / "images")), "the control: the images are mounted"
        lab.send_signal(signal.SIGTERM)
        output, _ = lab.communicate(timeout=120)
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
    assert "stopping the sandbox server JupyterLab's kernels started" in output, output[-3000:]
    assert not pid_alive(server_pid)
    assert nothing_left(state) == ({}, []), output[-3000:]


def test_stop_then_purge(own_images_state):
    """`stop` stops the server now; `purge` refuses while it runs, then removes the state
    directory, its mounts detached first."""
    from kernel.server import ensure_server

    state = own_images_state

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sandbox", *args, "--state-dir", str(state)], cwd=str(REPO),
                              env=user_env(state), capture_output=True, text=True, timeout=120)

    assert ensure_server(unix(state / "server.sock"), state, timeout=120)  # no idle stop: as `serve`
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(state / "server.sock")), timeout=120) as c:
        assert c.post("http://x/v1/sandboxes", json={}).status_code == 201
    refused = cli("purge", "--yes")
    assert refused.returncode == 1 and "stop it first" in refused.stderr and state.is_dir()
    kept = cli("stop")
    assert kept.returncode == 0 and "stopped the sandbox server" in kept.stdout
    assert "1 sandbox(es) kept running" in kept.stdout  # claimed sandboxes outlive the server
    assert "--force" in cli("purge", "--yes").stderr
    gone = cli("purge", "--yes", "--force")
    assert gone.returncode == 0, gone.stderr
    assert not state.exists() and housekeeping.mounts_under(str(state)) == []
    assert wait_for(lambda: not processes_of(state), 15), processes_of(state)
