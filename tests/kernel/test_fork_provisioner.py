"""The fork provisioner: every kernel a fork of one pre-imported process, through real
jupyter_client, real kernels on the session's real server, a real fork server.

`%%host` cells run in the kernel process itself, so they show what that process is: its
parent, its working directory, its environment, what it inherited.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing as t

import pytest
import support
from support import run_cell

from kernel.forked_kernel import ForkedKernel

pytestmark = pytest.mark.slow


@pytest.fixture
def fork_dir(monkeypatch: pytest.MonkeyPatch) -> t.Iterator[pathlib.Path]:
    """A runtime dir of this test's own (short: a socket path has at most 107 bytes), so
    that its fork server is its own; the server ends with its last kernel."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="fk-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    yield base
    for lock in base.glob("sandbox-kernel-fork/*.lock"):
        server = _lock_holder(lock)
        if server:
            os.kill(server, signal.SIGTERM)
    shutil.rmtree(base, ignore_errors=True)


def _lock_holder(lock: pathlib.Path) -> int | None:
    """The fork server holding `lock` (from /proc/locks), if any."""
    inode = lock.stat().st_ino
    for line in pathlib.Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[5].endswith(f":{inode}"):
            return int(fields[4])
    return None


def host(kc: t.Any, code: str) -> str:
    run = run_cell(kc, "%%host\n" + code)
    assert run.status == "ok", run.outputs
    return run.stdout.strip()


def facts(kc: t.Any) -> dict[str, t.Any]:
    """What the kernel process is, from inside it."""
    return json.loads(host(kc, "import os, json\nprint(json.dumps({'pid': os.getpid(), 'ppid': os.getppid(), "
                               "'sid': os.getsid(0), 'cwd': os.getcwd(), "
                               "'session': os.environ.get('JPY_SESSION_NAME')}))"))


def test_a_forked_kernel_answers_keeps_state_and_is_the_fork_servers_child(fork_dir, start_kernel):
    km, kc = start_kernel()
    forked = km.provisioner.process
    assert isinstance(forked, ForkedKernel), type(forked)
    assert run_cell(kc, "1 + 1").result_text() == "2"
    assert run_cell(kc, "x = 41").status == "ok"
    assert run_cell(kc, "x + 1").result_text() == "42"
    me = facts(kc)
    assert me["pid"] == forked.pid == km.provisioner.pid
    assert me["ppid"] == forked.server_pid != os.getpid()
    assert me["sid"] == me["pid"]  # a session of its own, as a plain launch's
    assert "kernel.forkserver" in support.command(forked.server_pid)
    # nothing in the fork server ever started a thread (a fork would inherit a held lock)
    status = pathlib.Path(f"/proc/{forked.server_pid}/status").read_text()
    assert "\nThreads:\t1\n" in status, status


def test_two_kernels_share_one_fork_server_and_nothing_of_each_other(fork_dir, start_kernel):
    """The probe: a module attribute and an environment variable a first kernel's host
    cell sets. Control: that kernel sees them itself; the second, forked later from the
    clean template, sees neither."""
    km1, kc1 = start_kernel()
    assert host(kc1, "import kernel, os\nkernel.LEFT_BEHIND = 'one'\nos.environ['LEFT_BEHIND'] = 'one'\n"
                     "print(getattr(kernel, 'LEFT_BEHIND', None), os.environ.get('LEFT_BEHIND'))") == "one one"
    km2, kc2 = start_kernel()
    one, two = km1.provisioner.process, km2.provisioner.process
    assert isinstance(one, ForkedKernel) and isinstance(two, ForkedKernel)
    assert one.server_pid == two.server_pid
    assert one.pid != two.pid
    assert facts(kc1)["ppid"] == facts(kc2)["ppid"] == one.server_pid
    assert host(kc2, "import kernel, os\nprint(getattr(kernel, 'LEFT_BEHIND', None), "
                     "os.environ.get('LEFT_BEHIND'))") == "None None"
    assert run_cell(kc2, "y = 2").status == "ok"
    assert run_cell(kc1, "'y' in dir()").result_text() == "False"  # two sandboxes, too


def test_a_forked_kernel_makes_no_ssl_context_of_its_own(fork_dir, start_kernel):
    """Its HTTP client speaks plain HTTP to the server (a unix socket or http://), with the
    SSL context the fork server made before the fork (frozen there, so not among the
    collector's objects here). Made in the kernel, one was about 4 MiB of its own memory.
    Control: a context the kernel does make is listed."""
    km, kc = start_kernel()
    assert isinstance(km.provisioner.process, ForkedKernel)
    assert run_cell(kc, "1 + 1").result_text() == "2"  # its client has been used
    count = "import gc, ssl\nprint(sum(isinstance(o, ssl.SSLContext) for o in gc.get_objects()))"
    assert host(kc, count) == "0"
    assert host(kc, "made = ssl.create_default_context()\n" + count) == "1"


def test_env_and_cwd_reach_the_child(fork_dir, start_kernel, tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    km, kc = start_kernel(cwd=folder, JPY_SESSION_NAME=str(folder / "mine.ipynb"))
    assert isinstance(km.provisioner.process, ForkedKernel)
    me = facts(kc)
    assert me["cwd"] == str(folder)
    assert me["session"] == str(folder / "mine.ipynb")
    assert host(kc, "import os\nprint(os.environ['JPY_PARENT_PID'])") == str(os.getpid())


def test_a_kernel_has_its_launchs_environment_not_the_fork_servers(fork_dir, start_kernel):
    """The fork server started with the first launch's environment; the second launch's
    lacks one of its variables and changes another: its kernel (and what that kernel starts,
    which reads the C environment) sees exactly its own. Control: the first kernel has both."""
    km1, kc1 = start_kernel(FROM_THE_FIRST="1", CHANGED="first")
    km2, kc2 = start_kernel(CHANGED="second")
    assert km1.provisioner.process.server_pid == km2.provisioner.process.server_pid
    shown = ("import os, subprocess\nprint(os.environ.get('FROM_THE_FIRST'), os.environ.get('CHANGED'), "
             "subprocess.run(['sh', '-c', 'echo ${FROM_THE_FIRST:-unset} $CHANGED'], capture_output=True, "
             "text=True).stdout.strip())")
    assert host(kc1, shown) == "1 first 1 first"
    assert host(kc2, shown) == "None second unset second"


def test_interrupt_restart_and_shutdown_act_on_the_child(fork_dir, start_kernel):
    km, kc = start_kernel()
    assert run_cell(kc, "x = 1").status == "ok"
    msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)", stop_on_error=False)
    assert support.wait_for(lambda: _printed(kc, msg_id, "sleeping"), 60)
    km.interrupt_kernel()  # message mode: an interrupt_request on the control channel
    while True:
        reply = kc.get_shell_msg(timeout=50)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert run_cell(kc, "x").result_text() == "1"

    first = km.provisioner.process
    km.restart_kernel(now=True)  # kill + launch
    second = km.provisioner.process
    assert isinstance(second, ForkedKernel) and second.pid != first.pid
    assert first.returncode == -signal.SIGKILL
    assert not support.pid_alive(first.pid)
    kc.wait_for_ready(timeout=60)
    assert run_cell(kc, "1 + 1").result_text() == "2"

    km.shutdown_kernel(now=False)  # a shutdown_request; the kernel ends on its own
    assert second.returncode == 0
    assert not support.pid_alive(second.pid)
    assert not km.is_alive()


def _printed(kc: t.Any, msg_id: str, text: str) -> bool:
    from queue import Empty

    try:
        msg = kc.get_iopub_msg(timeout=1)
    except Empty:
        return False
    return msg["parent_header"].get("msg_id") == msg_id and text in msg["content"].get("text", "")


def test_a_kernel_starts_plainly_when_the_fork_server_cannot(fork_dir, start_kernel, caplog):
    """The socket folder is not this user's alone (0755): no fork server, a plain launch,
    one warning. Control: the same folder at 0700 gives a fork."""
    folder = fork_dir / "sandbox-kernel-fork"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with caplog.at_level("WARNING"):
        km, kc = start_kernel()
    assert not isinstance(km.provisioner.process, ForkedKernel)
    assert facts(kc)["ppid"] == os.getpid()  # jupyter_client's own child
    assert run_cell(kc, "1 + 1").result_text() == "2"
    assert [r for r in caplog.records if "without the fork server" in r.getMessage()], caplog.text

    folder.chmod(0o700)
    km2, kc2 = start_kernel()
    assert isinstance(km2.provisioner.process, ForkedKernel)
    assert run_cell(kc2, "1 + 1").result_text() == "2"


def test_a_kernel_starts_plainly_when_the_fork_server_exits(fork_dir, start_kernel, monkeypatch, caplog):
    """The fork server starts but cannot listen (its socket's path is past the 107 bytes a
    Unix socket may have): it exits with an error, and the launch is a plain one."""
    deep = fork_dir / ("d" * 100)
    deep.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    with caplog.at_level("WARNING"):
        km, kc = start_kernel()
    assert not isinstance(km.provisioner.process, ForkedKernel)
    assert run_cell(kc, "1 + 1").result_text() == "2"
    assert [r for r in caplog.records if "fork server exited with status" in r.getMessage()], caplog.text


def test_the_fork_server_can_be_turned_off(fork_dir, start_kernel):
    km, kc = start_kernel(SANDBOX_KERNEL_FORK="0")
    assert not isinstance(km.provisioner.process, ForkedKernel)
    assert facts(kc)["ppid"] == os.getpid()


# ----------------------------------------------------------------- another user


_ATTACK = r"""
import json, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
body = json.dumps({"argv": ["--version"], "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/"}).encode()
try:
    socket.send_fds(s, [struct.pack("!I", len(body)) + body], [0, 1, 2])
    s.settimeout(30)
    data = s.recv(65536)
except OSError as exc:
    data = b""
print("REPLY " + data[4:].decode() if data else "CLOSED")
"""


@pytest.fixture
def other_user() -> t.Iterator[str]:
    with support.fresh_account("sbkf", why_root="another uid needs root here (useradd, runuser): not run") as name:
        yield name


def _server_for_all(folder: pathlib.Path, *, uid_check: bool) -> tuple[subprocess.Popen, str]:
    """A fork server whose socket anyone can reach (the provisioner's folder is 0700, which
    alone keeps others out: this probes the server's own check behind it)."""
    path = str(folder / "fork.sock")
    code = ("import sys, kernel.forkserver as f\n"
            + ("" if uid_check else "f.peer_allowed = lambda conn: True  # the control: the check removed\n")
            + "sys.exit(f.main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-P", "-c", code, path, "--idle", "60"], cwd="/",
                            env=support.with_repo_on_path(dict(os.environ)))
    assert support.wait_for(lambda: os.path.exists(path), 60), "the fork server did not listen"
    os.chmod(path, 0o777)
    return proc, path


@pytest.mark.parametrize("uid_check", [True, False], ids=["checked", "control-unchecked"])
def test_the_fork_server_refuses_another_uid(other_user, uid_check):
    folder = pathlib.Path(tempfile.mkdtemp(prefix="fku-", dir="/tmp"))
    folder.chmod(0o711)
    proc, path = _server_for_all(folder, uid_check=uid_check)
    try:
        out = subprocess.run(["runuser", "-u", other_user, "--", "/usr/bin/python3", "-c", _ATTACK, path],
                             capture_output=True, text=True, timeout=60, cwd="/")
        lines = out.stdout.strip().splitlines()
        answers = [line for line in lines if line.startswith(("REPLY", "CLOSED"))]
        assert answers, (out.stdout, out.stderr)
        if uid_check:
            assert answers == ["CLOSED"] and lines == ["CLOSED"], (out.stdout, out.stderr)
        else:
            # a process of ours ran at their word (`python -m kernel --version`), on their stdout
            assert answers[0].startswith("REPLY") and '"pid"' in answers[0], out.stdout
            assert [line for line in lines if line not in answers], out.stdout  # its version, printed
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------- lifetimes


_JUPYTER = r"""
import json, sys, time
from jupyter_client.manager import KernelManager
km = KernelManager(kernel_name="sandbox", connection_file=sys.argv[3])  # killed: it cannot remove it
km.start_kernel(cwd=sys.argv[1], independent=sys.argv[2] == "1")
forked = km.provisioner.process
print(json.dumps({"kernel": forked.pid, "server": forked.server_pid}), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("independent", [False, True], ids=["tied", "control-independent"])
def test_kernel_and_fork_server_end_with_the_jupyter_server(fork_dir, kernel_env, tmp_path, independent):
    """A stand-in Jupyter server starts a forked kernel and is killed: the kernel ends (it
    watches the server, not its parent the fork server), then the fork server (its parent
    gone, no child left). Control: an independent kernel (no JPY_PARENT_PID) outlives it,
    and so does its fork server: the probe sees survivors."""
    jupyter = subprocess.Popen([sys.executable, "-P", "-c", _JUPYTER, str(tmp_path), "1" if independent else "0",
                                str(tmp_path / "kernel.json")],
                               stdout=subprocess.PIPE, text=True, env=dict(os.environ), cwd="/")
    try:
        pids = json.loads(jupyter.stdout.readline())
    finally:
        jupyter.kill()
        jupyter.wait()
    try:
        gone = support.wait_for(lambda: not support.pid_alive(pids["kernel"]) and not support.pid_alive(pids["server"]),
                                timeout=10 if independent else 60)
        assert gone is (not independent), pids
    finally:
        for pid in (pids["kernel"], pids["server"]):
            if support.pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------- which launches fork


@pytest.mark.parametrize(("cmd", "env", "forks"), [
    (["python", "-P", "-m", "kernel", "-f", "c.json"], {}, True),
    (["python", "-I", "-m", "kernel", "-f", "c.json"], {}, True),
    (["python", "-m", "kernel", "-f", "c.json"], {"PYTHONSAFEPATH": "1"}, True),
    # `python -m kernel` imports from its folder first (the plain kernel refuses to run so):
    # a fork from a server that imported elsewhere would not be that process
    (["python", "-m", "kernel", "-f", "c.json"], {}, False),
    (["python", "-P", "-m", "kernel", "-f", "c.json"], {"PYTHONPATH": ".:/opt/lib"}, False),
    (["python", "-P", "-c", "import kernel", "-m", "kernel"], {}, False),
    (["python", "-P", "-m", "ipykernel_launcher", "-f", "c.json"], {}, False),
])
def test_only_a_safe_python_m_kernel_is_forked(cmd, env, forks):
    from kernel.fork_provisioner import safe_path, split_command

    split = split_command(cmd)
    assert (split is not None and safe_path(split[0][1:], env)) is forks


INNER_LAUNCH = r"""
import json, os, sys, tempfile
from jupyter_client.manager import KernelManager
folder = tempfile.mkdtemp(prefix="fk-inner-", dir="/tmp")
km = KernelManager(kernel_name="sandbox", transport="ipc", connection_file=os.path.join(folder, "k.json"))
km.start_kernel(cwd=sys.argv[1], env=dict(os.environ))
kc = km.client()
kc.start_channels()
out = []
try:
    kc.wait_for_ready(timeout=120)
    kc.execute_interactive("%%host\nimport os\nprint(os.readlink('/proc/self/ns/mnt'))", timeout=120,
                           output_hook=lambda m: out.append(m["content"].get("text", "")))
    print(json.dumps({"launcher": os.readlink("/proc/self/ns/mnt"), "kernel": "".join(out).strip(),
                      "forked": type(km.provisioner.process).__name__}))
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"""


def test_a_launch_from_another_mount_namespace_gets_a_fork_server_there(fork_dir, start_kernel, kernel_env, tmp_path):
    """A kernel runs in its fork server's namespaces, not its launcher's: a launch from a
    private mount namespace (as `unshare -m` with a state directory bound over the default
    one) must not be forked by a server outside it. Control: the first kernel, launched out
    here, leaves a fork server with every other part of the key the same, and the inner
    launch reports a mount namespace of its own (the unshare took)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a private mount namespace needs root and unshare: not run")
    outer_km, _ = start_kernel()
    assert isinstance(outer_km.provisioner.process, ForkedKernel)
    env = dict(kernel_env, XDG_RUNTIME_DIR=str(fork_dir))
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, "-c", INNER_LAUNCH,
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["launcher"] != os.readlink("/proc/self/ns/mnt"), seen  # control: the launch was elsewhere
    assert seen["forked"] == "ForkedKernel", seen
    assert seen["kernel"] == seen["launcher"], seen
