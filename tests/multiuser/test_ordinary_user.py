"""An ordinary user gets the whole product, or is told exactly what not: a real account
(``useradd``, ``runuser``), the project installed in a venv of Debian's /usr/bin/python3, and
nothing of root's but the session's built image (borrowed by path, as the suites do).

- Their own server, started with ``serve --daemon`` and ended with ``stop``: a sandbox's CPU
  and memory are measured from its processes (``ls`` shows them, not 0 and not "not
  measured"); a notebook's cell near its memory limit gets the 80 % note (the probe: the
  note's text; the control: a cell well under the limit gets none); ``%sandbox`` shows
  the figures; "Python (sandbox, gVisor)", which cannot run for this user, answers its
  first cell with one line naming the kernel to use instead, no traceback.
- The host's system server (root's ``serve --multi-user``): the user's client, CLI and
  kernel find it with nothing configured; ``logs`` says it cannot read root's state
  directory (exit status 1). The control: with no system server where they look, the same
  ``ls`` lists nothing of it.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import tempfile

import pytest

import support
from test_multiuser import SYSTEM_PYTHON, seed_images, user_venv, users  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the users' venv is built first (minutes)


@pytest.fixture(scope="module")
def scripts() -> pathlib.Path:
    """The kernel script where every user can read it (the checkout may be under /root)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="sbk-cells-", dir="/tmp"))
    d.chmod(0o755)
    shutil.copy(pathlib.Path(__file__).with_name("user_cells.py"), d / "user_cells.py")
    (d / "user_cells.py").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_user(user: str, argv: list[str], timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    home = os.path.expanduser(f"~{user}")
    return subprocess.run([shutil.which("runuser"), "-u", user, "--", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": home, **env})


def cells_as(user: str, user_venv: pathlib.Path, scripts: pathlib.Path, kernel: str, cells: list[str],
             **env: str) -> list[dict]:
    r = as_user(user, [str(user_venv / "venv/bin/python"), str(scripts / "user_cells.py"), kernel,
                       json.dumps(cells)], timeout=900, **env)
    assert r.returncode == 0 and "RESULT " in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])
    return json.loads(r.stdout.split("RESULT ", 1)[1])


def client_code(code: str) -> str:
    """A cell run through the Python client, found by the endpoint rule alone."""
    return ("from sandbox.client import Sandbox\n"
            "sbx = Sandbox.create(ttl_seconds=600)\n"
            f"r = sbx.run_code({code!r})\n"
            "assert r.error is None, r.error\n"
            "print(sbx.id)\n")


def test_own_server_measures_usage_warns_near_memory_and_names_the_kernel_instead_of_gvisor(
        users, user_venv, scripts, sandbox_server):
    user = users[0]
    state = seed_images(user, sandbox_server)
    cli = str(user_venv / "venv/bin/sandbox-kernel")
    pid_file = state / "server.pid"
    try:
        started = as_user(user, [cli, "serve", "--daemon", "--state-dir", str(state), "--pool-size", "0"])
        assert started.returncode == 0, (started, (state / "server.log").read_text(errors="replace")[-3000:])
        pid = int(pid_file.read_text())
        assert support.real_uid(pid) == int(subprocess.check_output(["id", "-u", user]))

        made = as_user(user, [str(user_venv / "venv/bin/python"), "-c", client_code(
            "block = b'\\x01' * (96 * 2**20)\nx = sum(range(3 * 10**7))")], SANDBOX_KERNEL_STATE_DIR=str(state))
        assert made.returncode == 0, made
        sandbox_id = made.stdout.split()[-1]

        def row_of_ls() -> str:
            listed = as_user(user, [cli, "ls", "--state-dir", str(state)])
            return next(r for r in listed.stdout.splitlines() if r.startswith(sandbox_id))

        def measured(row: str) -> bool:  # the figures lag the cell by a sample or a state write
            cpu = re.search(r"\s(\d+\.\d) s\s", row)
            memory = re.search(r"\s(\d+(?:\.\d)?) MiB\s", row)
            return bool(cpu and float(cpu.group(1)) > 0.1 and memory and float(memory.group(1)) >= 90)

        assert support.wait_for(lambda: measured(row_of_ls()), 120, interval=5), row_of_ls()
        assert "not measured" not in row_of_ls()

        limit_mb = 256
        notebook = cells_as(user, user_venv, scripts, "sandbox", [
            "small = b'\\x01' * (8 * 2**20)",                  # the control: far under the limit
            "big = b'\\x01' * (200 * 2**20)",                  # over 80 % of 256 MiB with the interpreter
            "%sandbox",
        ], SANDBOX_KERNEL_URL=f"unix:{state}/server.sock", SANDBOX_KERNEL_MEMORY_MB=str(limit_mb))
        small, big, report = notebook
        assert not small["errors"] and "memory at" not in small["notes"], small
        assert not big["errors"] and re.search(r"memory at .* of 256\.0 MiB \(\d+ %\)", big["notes"]), big
        shown = report["stream"] + report["notes"]
        assert re.search(r"memory \d+\.\d MiB now", shown) and "not measured" not in shown, shown

        gvisor = cells_as(user, user_venv, scripts, "sandbox-gvisor", ["print('hello')"],
                          SANDBOX_KERNEL_URL=f"unix:{state}/server.sock")
        [error] = gvisor[0]["errors"]
        assert 'the kernel "Python (sandbox)"' in error["evalue"], error
        assert not any("Traceback" in line or 'File "' in line for line in error["traceback"]), error

        stopped = as_user(user, [cli, "stop", "--state-dir", str(state)])
        assert stopped.returncode == 0 and f"pid {pid}" in stopped.stdout, stopped
        assert not support.pid_alive(pid) and not pid_file.exists()
    finally:
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        if pid and support.pid_alive(pid):
            support.signal_server(pid, 15)
            support.wait_for(lambda: not support.pid_alive(pid), 30)
        support.sweep(state)


def test_users_commands_and_kernel_find_the_system_server(users, user_venv, scripts, sandbox_server):
    user = users[1]
    seed_images(user, sandbox_server)  # their own image: a server of theirs must not be what answers
    state = support.make_state_dir("sbk-system-", images_from=sandbox_server.state_dir)
    nowhere = pathlib.Path(tempfile.mkdtemp(prefix="sbk-nosystem-", dir="/tmp"))
    nowhere.chmod(0o755)
    server = support.Server(state, "--multi-user", "--pool-size", "0", token=secrets.token_hex(16))
    cli = str(user_venv / "venv/bin/sandbox-kernel")
    try:
        server.start()
        system = {"SANDBOX_KERNEL_SYSTEM_STATE_DIR": str(state)}
        made = as_user(user, [str(user_venv / "venv/bin/python"), "-c", client_code("x = 1")], **system)
        assert made.returncode == 0, made
        sandbox_id = made.stdout.split()[-1]
        assert sandbox_id in support.sandbox_ids(state), "the sandbox is not the system server's"

        listed = as_user(user, [cli, "ls"], **system)
        assert listed.returncode == 0 and sandbox_id in listed.stdout and user in listed.stdout, listed
        logs = as_user(user, [cli, "logs", sandbox_id], **system)
        assert logs.returncode == 1 and "not readable by you" in logs.stderr, logs

        # Control: no system server where they look; the user's own state has none running either.
        control = as_user(user, [cli, "ls"], SANDBOX_KERNEL_SYSTEM_STATE_DIR=str(nowhere))
        assert control.returncode == 0 and sandbox_id not in control.stdout + control.stderr, control

        [report] = cells_as(user, user_venv, scripts, "sandbox", ["%sandbox"], **system)
        assert f"unix:{state}/server.sock" in report["stream"] + report["notes"], report
    finally:
        server.close()
        shutil.rmtree(nowhere, ignore_errors=True)


def test_install_leaves_out_the_gvisor_kernelspec_for_a_user_whose_server_cannot_run_it(users, user_venv):
    """`sandbox-kernel install --user` as an ordinary user: "Python (sandbox, gVisor)" is not
    installed (its kernels would fail: runsc needs a root server), and the output says why
    and which kernel to use. The control: pinned to a server (--url), whose refusal is its
    own, both are installed."""
    user = users[0]
    home = pathlib.Path(os.path.expanduser(f"~{user}"))
    kernels = home / ".local/share/jupyter/kernels"
    cli = str(user_venv / "venv/bin/sandbox-kernel")
    try:
        own = as_user(user, [cli, "install", "--user"])
        assert own.returncode == 0, own
        assert (kernels / "sandbox/kernel.json").exists() and not (kernels / "sandbox-gvisor").exists()
        assert "not installed: kernelspec 'sandbox-gvisor'" in own.stdout and "'Python (sandbox)'" in own.stdout, own

        pinned = as_user(user, [cli, "install", "--user", "--url", "unix:/nonexistent/server.sock"])
        assert pinned.returncode == 0 and (kernels / "sandbox-gvisor/kernel.json").exists(), pinned
    finally:
        shutil.rmtree(kernels, ignore_errors=True)
