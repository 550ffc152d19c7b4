"""No dead ends when no server runs: the real CLI on a state directory whose server has
stopped while a kept sandbox runs on (as after `lab` exits), and `serve --daemon` for a host
without systemd.

- `ls` lists the kept sandbox and `rm --all` ends it, each by starting a server for the call
  and stopping it after: the probe is the sandbox's supervisor (alive after `ls`, gone after
  `rm --all`) and the state directory's server record (none left running either way). The
  control is the same `ls` against the endpoint as a URL (`--url unix:…`), which starts
  nothing: it cannot reach a server, as every command could not before.
- `serve --daemon` returns once the server answers, with its pid in the pid file and its
  output in STATE/server.log; `stop` ends it and the pid file goes with it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import support
from support import REPO, with_repo_on_path

pytestmark = pytest.mark.slow  # servers started and stopped by the CLI


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = with_repo_on_path({k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")})
    return subprocess.run([sys.executable, "-m", "sandbox", *args], cwd=str(REPO), env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def server_pid(state: pathlib.Path) -> int | None:
    import json

    try:
        pid = json.loads((state / "server.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
    return pid if support.pid_alive(pid) else None


def test_ls_and_rm_all_reach_a_kept_sandbox_when_no_server_runs(image_source):
    server = support.own_server(image_source)
    state = server.state_dir
    try:
        server.start()
        with server.client() as c:
            sandbox_id = support.create(c, ttl_seconds=600)["id"]
        supervisor = support.supervisor_pid(server, sandbox_id)
        stopped = cli("stop", "--state-dir", str(state))
        assert stopped.returncode == 0 and sandbox_id in stopped.stdout, stopped  # kept: it runs on
        assert server_pid(state) is None and support.is_supervisor(supervisor, state / "sandboxes" / sandbox_id)

        # Control: the same socket named as a URL starts nothing, and cannot be reached.
        control = cli("ls", "--url", f"unix:{state}/server.sock")
        assert control.returncode == 1 and "cannot reach the sandbox server" in control.stderr, control

        listed = cli("ls", "--state-dir", str(state))
        assert listed.returncode == 0 and sandbox_id in listed.stdout, listed
        assert "starting one for this command" in listed.stderr, listed.stderr
        assert server_pid(state) is None, "the server started for `ls` still runs"
        assert support.is_supervisor(supervisor, state / "sandboxes" / sandbox_id), "ls ended the sandbox"

        removed = cli("rm", "--all", "--state-dir", str(state))
        assert removed.returncode == 0 and f"deleted {sandbox_id}" in removed.stdout, removed
        assert support.wait_for(lambda: not support.pid_alive(supervisor), 30), "the sandbox still runs"
        assert server_pid(state) is None, "the server started for `rm --all` still runs"

        # Nothing runs there now: said, exit status 0 (nothing to do), and no server started.
        empty = cli("ls", "--state-dir", str(state))
        assert empty.returncode == 0 and empty.stdout == "" and "no sandbox server runs on" in empty.stderr, empty
        assert "starting one" not in empty.stderr
    finally:
        server.close()


def test_serve_daemon_runs_in_the_background_until_stop(image_source):
    state = support.make_state_dir("sk-daemon-", images_from=image_source)
    pid = None
    try:
        started = cli("serve", "--daemon", "--state-dir", str(state), "--pool-size", "0")
        assert started.returncode == 0, started
        pid_file = state / "server.pid"
        pid = int(pid_file.read_text())
        assert f"pid {pid}" in started.stdout and "sandbox-kernel stop" in started.stdout, started.stdout
        assert support.pid_alive(pid) and server_pid(state) == pid  # the pid file names the running server
        assert os.getsid(pid) == pid, "the server is not in a session of its own"
        assert "sandbox server on unix:" in (state / "server.log").read_text()  # its output, in the log
        answered = cli("ls", "--state-dir", str(state))
        assert answered.returncode == 0 and "no sandboxes on" in answered.stderr, answered

        again = cli("serve", "--daemon", "--state-dir", str(state), "--pool-size", "0", timeout=600)
        assert again.returncode == 1 and "Traceback" not in again.stderr, again  # one server per state directory
        assert int(pid_file.read_text()) == pid and support.pid_alive(pid)

        stopped = cli("stop", "--state-dir", str(state))
        assert stopped.returncode == 0 and f"pid {pid}" in stopped.stdout, stopped
        assert not support.pid_alive(pid) and not pid_file.exists()
    finally:
        if pid and support.pid_alive(pid):
            support.signal_server(pid, 15)
            support.wait_for(lambda: not support.pid_alive(pid), 30)
        support.sweep(state)
        shutil.rmtree(state, ignore_errors=True)
