"""Red team, composition: two allowed things that together hand a sandbox's bytes to the host.

No single message is wrong in these attacks; the harm is in who acts on the bytes next.
Each probe looks where the effect would land (a marker file a pulled module would write on
the host, a process still running, a mount still mounted) and has a control that removes
the protection and shows the probe notices.

c01. A sandbox writes a module named like one the host kernel imports lazily (the Markdown
     renderer, `markdown_it`), the cell pulls it (`%pull --allow-code`, so that the flag is
     not what stops it) and displays Markdown: nothing runs on the host, because the kernel
     starts with `python -P` (its folder is not on `sys.path`). Control: the same kernel
     with its folder first on `sys.path`, as `python -m kernel` had it, runs the module.
c02. A pulled `kernel.py` in the notebook's folder and a new kernel started there through
     jupyter_client with the installed kernelspec: it does not run, the kernel works.
     Control: the old kernelspec's argv (`python -m kernel`) runs it at start.
c03. Without the flag, `%pull` and `%pull *` write no file a host program would run, import
     or read as config (`kernel/host_code.py`), and say why; control: `--allow-code` writes it.
c04. Root's `sandbox-kernel stop` against a directory an ordinary user (made with `useradd`)
     prepared: a `server.json` naming another server's pid, its socket linked to that
     server's: the other server runs on. Control: the same stop with the identity check
     removed stops it.
c05. Root's `stop` and `purge` against a user's state directory that is a symlink to a
     directory holding a mount: refused, the mount and its files stay, and purge does not
     claim it removed anything. Control: the same purge aimed at where the link leads
     unmounts and removes it. A link *inside* a state directory is removed as a link.
c06. A runtime's log with escape sequences (what the sandbox's processes wrote to stderr):
     `sandbox-kernel logs` prints them escaped. Control: printed as they are, they reach
     the terminal.

Every other path a sandbox's bytes take to a host program is a row of docs/security.md's boundary
table (Security model), with its test.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
import typing as t

import pytest

import support
from sandbox.common.paths import StateDir
from sandbox.service import housekeeping, server_identity

MARKER_SOURCE = "import pathlib\npathlib.Path({marker!r}).write_text('ran on the host')\n"
#: The kernel as `python -m kernel` ran it before: its folder first on sys.path, no check.
UNSAFE_IMPORT_ARGV = ["-c", "import os, sys; sys.path.insert(0, os.getcwd()); from kernel.app import main; main()",
                      "-f", "{connection_file}"]
#: The kernelspec's argv before `-P`.
OLD_ARGV = ["-m", "kernel", "-f", "{connection_file}"]


# ------------------------------------------------------------------ kernels


@pytest.fixture(scope="module")
def kernel_dirs() -> t.Iterator[dict[str, pathlib.Path]]:
    """The installed kernelspec, and the controls' kernelspecs (the same kernel started
    the unsafe ways), each in a kernels directory of its own."""
    installed = support.install_kernelspec() / "kernels"
    controls = pathlib.Path(tempfile.mkdtemp(prefix="sbk-composition-specs-"))
    spec = json.loads((installed / "sandbox" / "kernel.json").read_text())
    for name, argv in (("unsafe-import", UNSAFE_IMPORT_ARGV), ("old-argv", OLD_ARGV)):
        (controls / name).mkdir()
        (controls / name / "kernel.json").write_text(json.dumps({**spec, "argv": [sys.executable, *argv]}))
    yield {"sandbox": installed, "unsafe-import": controls, "old-argv": controls}
    shutil.rmtree(controls, ignore_errors=True)


class Kernels:
    """Kernels started by jupyter_client from a kernelspec, in a folder; all shut down after."""

    def __init__(self, dirs: dict[str, pathlib.Path], env: dict[str, str]) -> None:
        self.dirs, self.env, self.started = dirs, env, []

    def manager(self, name: str, cwd: pathlib.Path):
        from jupyter_client.kernelspec import KernelSpecManager

        km = support.kernel_manager(name, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(self.dirs[name])]))
        km.start_kernel(cwd=str(cwd), env=dict(self.env))
        self.started.append(km)
        return km

    def start(self, name: str, cwd: pathlib.Path):
        km = self.manager(name, cwd)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=90)
        return kc

    def close(self) -> None:
        for km in self.started:
            if km.is_alive():
                km.shutdown_kernel(now=True)


@pytest.fixture
def kernels(sandbox_server, kernel_dirs) -> t.Iterator[Kernels]:
    env = support.kernel_environ(sandbox_server, kernel_dirs["sandbox"].parent)
    env["SANDBOX_KERNEL_HOST_CELLS"] = "0"  # the setting docs/kernel.md calls safe for model-written cells
    env["SANDBOX_KERNEL_KEEP_NOTEBOOK_SANDBOX"] = "0"
    made = Kernels(kernel_dirs, env)
    yield made
    made.close()


def plant_and_pull(kc, name: str, source: str) -> None:
    """The sandbox writes /workspace/NAME, the cell pulls it into the notebook's folder."""
    run = support.run_cell(kc, f"open('/workspace/{name}', 'w').write({source!r})")
    assert run.status == "ok", run.errors
    run = support.run_cell(kc, f"%pull --allow-code {name}", timeout=120)
    assert run.status == "ok" and f"pulled /workspace/{name}" in run.stdout, (run.errors, run.stdout)


def show_markdown(kc) -> support.CellRun:
    return support.run_cell(kc, "from IPython.display import Markdown\ndisplay(Markdown('# composed'))", timeout=120)


def test_c01_a_pulled_module_the_kernel_imports_lazily_never_runs_on_the_host(kernels, tmp_path):
    marker = tmp_path / "marker-c01"
    folder = tmp_path / "nb"
    folder.mkdir()
    kc = kernels.start("sandbox", folder)
    plant_and_pull(kc, "markdown_it.py", MARKER_SOURCE.format(marker=str(marker)))
    assert (folder / "markdown_it.py").is_file()
    run = show_markdown(kc)
    assert run.status == "ok", run.errors
    assert run.of_type("display_data"), "the Markdown was displayed (rendered by the host kernel)"
    assert not marker.exists(), "the pulled module ran in the host kernel"

    # control: the same kernel with its folder on sys.path imports the pulled module
    control_folder = tmp_path / "control"
    control_folder.mkdir()
    shutil.copy(folder / "markdown_it.py", control_folder / "markdown_it.py")
    show_markdown(kernels.start("unsafe-import", control_folder))
    assert marker.read_text() == "ran on the host", "control: the probe's module runs where the folder is on sys.path"
    print("\nPROBE c01 | pulled markdown_it.py + Markdown display | not run by the host kernel (control: ran)")


def test_c02_a_pulled_kernel_py_never_runs_at_the_next_kernel_start(kernels, tmp_path):
    marker = tmp_path / "marker-c02"
    folder = tmp_path / "nb"
    folder.mkdir()
    plant_and_pull(kernels.start("sandbox", folder), "kernel.py", MARKER_SOURCE.format(marker=str(marker)))
    kc = kernels.start("sandbox", folder)  # the next kernel in that folder, from the installed kernelspec
    assert support.run_cell(kc, "6 * 7").result_text() == "42"
    assert not marker.exists(), "the pulled kernel.py ran at the kernel's start"

    # control: the kernelspec's old argv (`python -m kernel`) in that folder runs the pulled file
    km = kernels.manager("old-argv", folder)
    assert support.wait_for(marker.exists, 60), "control: the old argv imports kernel.py from its folder"
    km.shutdown_kernel(now=True)
    print("\nPROBE c02 | pulled kernel.py + a new kernel in its folder | not run (control: `python -m kernel` ran it)")


def test_c03_pull_writes_no_host_code_without_the_flag(kernels, tmp_path):
    folder = tmp_path / "nb"
    folder.mkdir()
    kc = kernels.start("sandbox", folder)
    names = ["sitecustomize.py", "evil.pth", ".envrc", "ipython_config.py", "kernel.json", "data.csv"]
    code = "import os\nos.makedirs('/workspace/.ipynb_checkpoints', exist_ok=True)\n" + "".join(
        f"open('/workspace/{n}', 'w').write('x')\n" for n in [*names, ".ipynb_checkpoints/nb-checkpoint.ipynb"])
    assert support.run_cell(kc, code).status == "ok"
    run = support.run_cell(kc, "%pull sitecustomize.py", stop_on_error=False)
    assert run.status == "error" and "--allow-code" in run.reply["content"]["evalue"], run.reply["content"]
    assert "Python" in run.reply["content"]["evalue"], "it says why"
    run = support.run_cell(kc, "%pull data.csv evil.py", stop_on_error=False)
    assert run.status == "error" and "--allow-code" in run.reply["content"]["evalue"], "the local name counts"
    run = support.run_cell(kc, "%pull **", timeout=120)
    assert run.status == "ok", run.errors
    assert sorted(p.name for p in folder.iterdir()) == ["data.csv"], sorted(folder.iterdir())
    for name in [*names[:-1], ".ipynb_checkpoints/nb-checkpoint.ipynb"]:
        assert f"skipped {name}:" in run.stdout, (name, run.stdout)
    # control: with the flag the same files land, so the probe would see them
    run = support.run_cell(kc, "%pull --allow-code --force **", timeout=120)
    assert run.status == "ok", run.errors
    assert (folder / "sitecustomize.py").is_file() and (folder / ".envrc").is_file()
    print("\nPROBE c03 | %pull of host code | refused, skipped in globs, each with why (control: --allow-code writes)")


# ------------------------------------------------------------------ admin commands against a user's directory


@pytest.fixture(scope="module")
def hostile_user() -> t.Iterator[str]:
    """A fresh ordinary account, the author of the directories root's admin commands are
    pointed at; removed afterwards."""
    with support.fresh_account("sbkh", home=True,
                               why_root="root's admin commands against a user's directory need root (useradd, runuser)") as name:
        yield name


def as_user(user: str, script: str) -> None:
    subprocess.run(["runuser", "-u", user, "--", "/bin/sh", "-c", script], check=True, capture_output=True, timeout=60)


def admin(*args: str) -> subprocess.CompletedProcess:
    """The CLI as root runs it: `sandbox-kernel ARGS`."""
    return subprocess.run([sys.executable, "-m", "sandbox", *args], capture_output=True, text=True, timeout=120,
                          env=support.with_repo_on_path(dict(os.environ)), cwd=support.REPO)


def user_state(user: str, name: str = "state") -> pathlib.Path:
    return pathlib.Path(os.path.expanduser(f"~{user}")) / f"{name}-{secrets.token_hex(3)}"


@pytest.mark.slow
@pytest.mark.bwrap_only(reason="admin commands judge a host process and directory; the sandboxes' tier plays no part")
def test_c04_stop_never_signals_the_pid_a_user_wrote(hostile_user, spawn_server, monkeypatch):
    victim = spawn_server("--pool-size", "0")
    pid = victim.proc.pid
    state = user_state(hostile_user)
    record = json.dumps({"pid": pid, "socket": str(state / "server.sock"), "url": None})
    as_user(hostile_user, f"mkdir -m 700 {state} && printf '%s' '{record}' > {state}/server.json && "
                          f"ln -s {victim.state_dir}/server.sock {state}/server.sock")
    done = admin("stop", "--state-dir", str(state))
    assert done.returncode == 1 and "not this directory's server" in done.stderr, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert support.pid_alive(pid) and victim.healthy(), "root's stop signalled the server the user named"
    assert housekeeping.running_server(StateDir(str(state))) is None
    # a server.json that is a FIFO (reading it would hang root's command) is no record at all
    as_user(hostile_user, f"rm {state}/server.json && mkfifo {state}/server.json")
    done = admin("stop", "--state-dir", str(state))
    assert done.returncode == 0 and "no sandbox server runs" in done.stdout, (done.stdout, done.stderr)
    as_user(hostile_user, f"rm {state}/server.json && printf '%s' '{record}' > {state}/server.json")

    # control: without the identity check the same stop ends the victim
    monkeypatch.setattr(server_identity, "server_problem", lambda *args: None)
    housekeeping.stop_server(StateDir(str(state)), timeout=60)
    assert support.wait_for(lambda: not support.pid_alive(pid), 30), "control: the probe sees the server stop"
    print(f"\nPROBE c04 | stop --state-dir ~user with server.json -> pid {pid} | refused: {done.stderr.strip()}")


@pytest.fixture
def victim_mount(tmp_path) -> t.Iterator[pathlib.Path]:
    """A directory outside any user's files holding a tmpfs mount with a file on it."""
    outside = tmp_path / "outside"
    mount = outside / "mnt"
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True, capture_output=True)
    (mount / "precious").write_text("kept")
    yield outside
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def mounted(path: pathlib.Path) -> bool:
    return str(path) in housekeeping.mounts_under(str(path))


@pytest.mark.slow
def test_c05_stop_and_purge_never_follow_a_users_link(hostile_user, victim_mount):
    state = user_state(hostile_user)
    as_user(hostile_user, f"ln -s {victim_mount} {state}")
    for command in (["stop"], ["purge", "--yes", "--force"]):
        done = admin(*command, "--state-dir", str(state))
        assert done.returncode == 1 and "symlink" in done.stderr, (command, done.returncode, done.stdout, done.stderr)
        assert "removed" not in done.stdout and "Traceback" not in done.stderr, (command, done.stdout)
    assert mounted(victim_mount / "mnt") and (victim_mount / "mnt" / "precious").read_text() == "kept"

    # a link inside a user's state directory is removed as a link, never walked
    inner = user_state(hostile_user)
    as_user(hostile_user, f"mkdir {inner} && ln -s {victim_mount} {inner}/images && ln -s {victim_mount} {inner}/sandboxes")
    done = admin("purge", "--yes", "--state-dir", str(inner))
    assert done.returncode == 0 and f"removed {inner}" in done.stdout, (done.stdout, done.stderr)
    assert not os.path.lexists(inner) and mounted(victim_mount / "mnt")
    assert (victim_mount / "mnt" / "precious").read_text() == "kept"

    # control: the same purge aimed at where the link leads detaches the mount and removes it all
    done = admin("purge", "--yes", "--state-dir", str(victim_mount))
    assert done.returncode == 0 and "after unmounting 1 mount" in done.stdout, (done.stdout, done.stderr)
    assert not mounted(victim_mount / "mnt") and not victim_mount.exists(), "control: the probe sees the purge"
    print("\nPROBE c05 | stop/purge --state-dir ~user/link | refused, the mount kept (control: purged through the target)")


def test_purge_of_a_missing_directory_has_nothing_to_do(tmp_path):
    done = admin("purge", "--state-dir", str(tmp_path / "never-made"))
    assert done.returncode == 0 and "nothing to purge" in done.stdout, (done.returncode, done.stdout, done.stderr)


# ------------------------------------------------------------------ logs on the admin's terminal


def test_c06_logs_bring_no_escape_sequence_to_the_terminal(tmp_path, capsysbinary, monkeypatch):
    """A runtime's log holds what the sandbox's processes wrote to stderr; `sandbox-kernel
    logs` prints it on the admin's terminal. The bytes that reach the terminal (this
    command's stdout) hold no ESC, BEL or C1 control. Control: printed as they are, they do."""
    from sandbox.cli import human, main

    sandbox_dir = tmp_path / "sandboxes" / "sbx-c06"
    sandbox_dir.mkdir(parents=True)
    hostile = b"\x1b]52;c;ZXZpbA==\x07\x1b[2Jcleared \xc2\x9b31m \xff\n"  # clipboard, clear, C1 CSI, not UTF-8
    (sandbox_dir / "runtime.log").write_bytes(b"started\n" + hostile)

    def logs() -> bytes:
        with pytest.raises(SystemExit) as exited:
            main(["logs", "sbx-c06", "--state-dir", str(tmp_path)])
        assert exited.value.code == 0
        return capsysbinary.readouterr().out

    shown = logs()
    assert b"started" in shown and b"cleared" in shown
    assert not any(ch in shown for ch in (b"\x1b", b"\x07", b"\xc2\x9b")), shown
    assert b"\\x1b]52;c;ZXZpbA==\\x07" in shown and b"\\x9b31m" in shown and b"\\xff" in shown, shown
    monkeypatch.setattr(human, "terminal_text", lambda raw: raw.decode("utf-8", "replace"))
    assert b"\x1b]52;" in logs(), "control: printed as they are, the bytes reach the terminal"
    print("\nPROBE c06 | sandbox-kernel logs of a runtime.log with escape sequences | escaped (control: raw)")
