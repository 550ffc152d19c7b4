"""A newcomer's first day, from a fresh clone and README only, leaves nothing running.

What this adds to the suites that run the pieces (notebooks 01 and 02 under nbval as root,
tests/notebooks; `lab` stopping its server with
the images mounted as root, tests/kernel/test_server_lifecycle.py; every documented snippet,
test_documented_snippets.py): README's own run line, as written, on a `git clone` of this
checkout's HEAD, by a new ordinary account (README: "root or an ordinary user alike"; an
account of its own gives the embedded default its real place, ~/.local/share/sandbox-kernel,
and a plain test of what is left: any process of that uid at all).

1. README's run line is read out of README's block ("Two commands"): everything before
   `sandbox-kernel lab` is the setup, run as is in the clone (a fresh venv of Debian's
   /usr/bin/python3: root's interpreter may sit in a 0700 home). pip reaches the package
   index; its cache is kept with the run's images, so a second run is quick.
2. `sandbox-kernel lab` as written, headless (a port and a token of the test's, after `--`).
   The account's state directory borrows the run's built image (make_state_dir does the
   same): the first-cell build is the image tests' job, not worth two minutes here.
3. One cell through a kernel that JupyterLab started; it starts the embedded server.
4. Every notebook in notebooks/ passes nbval (README, Notebooks) as this ordinary user runs
   it, with the clone's venv: README's extras plus nbval, nothing else the notebooks could
   use; one whose extra README's install leaves out (05, adk) is skipped, saying so. The
   stored outputs are the root mode's (tests/notebooks checks 01 and 02 as root); the
   cells whose facts depend on the mode print the same in both (notebook 02's memory bomb)
   or are masked where %sandbox names the mode (notebooks/nbval_sanitize.cfg). nbval kills
   its kernels: afterwards none of their sandboxes may still run.
5. File > Shut Down (POST /api/shutdown); `lab` exits, stopping the server its kernel
   started; then no process of the account remains and nothing is mounted under its home.
   `lab`'s terminal printed no debugger "frozen modules" lines and no plaintext-TCP warning.

Needs root, to make the account (useradd, runuser); skipped, saying so, without it.
"""

from __future__ import annotations

import json
import os
import pathlib
import pwd
import secrets
import shutil
import signal
import subprocess
import time
import typing as t
from dataclasses import dataclass

import httpx
import pytest
import testrun
from docblocks import readme_run_line
from jupyter_client import BlockingKernelClient
from support import (REPO, code_cell_count, command, free_port, jupyter_answers, pid_alive, processes_of, real_uid,
                     run_cell, running_in, sandbox_ids, summary_counts, sweep, wait_for)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SYSTEM_PYTHON = "/usr/bin/python3"
LAB = ".venv/bin/sandbox-kernel lab"


@dataclass
class Newcomer:
    """A new account with a home and nothing else: no venv, no state directory, no variable of ours."""

    account: str
    home: pathlib.Path
    uid: int

    @property
    def clone(self) -> pathlib.Path:
        return self.home / "sandbox-kernel"

    @property
    def state_dir(self) -> pathlib.Path:
        return self.home / ".local/share/sandbox-kernel"  # the embedded default of an ordinary user

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PIP_CACHE_DIR": str(pip_cache()),
                "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def argv(self, line: str) -> list[str]:
        shell = ["bash", "-e", "-o", "pipefail", "-c", line]
        return [shutil.which("runuser") or "runuser", "-u", self.account, "--", *shell]

    def run(self, line: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(line), cwd=self.clone, env=self.env(), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def processes(self) -> dict[int, str]:
        """What runs on the newcomer's behalf: every process of the account's uid, and any
        that names its home (the venv, the state directory)."""
        found = processes_of(self.home, sandbox_ids(self.state_dir))
        for pid in [int(e) for e in os.listdir("/proc") if e.isdigit()]:
            try:
                if real_uid(pid) == self.uid and pid_alive(pid):
                    found[pid] = command(pid)[:300]
            except (OSError, ValueError, IndexError):  # ended while looked at
                continue
        return found

    def mounts(self) -> list[str]:
        with open("/proc/self/mountinfo") as f:
            return [line.split()[4] for line in f if line.split()[4].startswith(f"{self.home}/")]


def pip_cache() -> pathlib.Path:
    """Kept with the run's images (SANDBOX_KERNEL_TEST_STATE_DIR keeps both between runs)."""
    return testrun.image_home() / "pip-cache"


@pytest.fixture
def newcomer() -> t.Iterator[Newcomer]:
    if os.geteuid() != 0:
        pytest.skip("making the newcomer's account (useradd, runuser) needs root")
    if shutil.which("git") is None:
        pytest.skip("git is not installed: nothing to clone with")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    if not all(shutil.which(tool) for tool in ("useradd", "userdel", "runuser")):
        pytest.skip("useradd, userdel and runuser are needed to make the newcomer's account")
    account = f"sbkn{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", account], check=True, capture_output=True)
    home = pathlib.Path(os.path.expanduser(f"~{account}"))
    home.chmod(0o700)
    who = Newcomer(account, home, pwd.getpwnam(account).pw_uid)
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(who.clone)], check=True,
                       capture_output=True, timeout=300)
        subprocess.run(["git", "-C", str(who.clone), "checkout", "--quiet", "--detach", head], check=True,
                       capture_output=True)
        pip_cache().mkdir(exist_ok=True)
        for path in (who.home, pip_cache()):
            subprocess.run(["chown", "-R", f"{account}:", str(path)], check=True)
        yield who
    finally:
        end_what_is_left(who)


def borrow_image(who: Newcomer, image_source: pathlib.Path) -> None:
    """The run's built image in the account's state directory (make_state_dir does the same)."""
    images = who.state_dir / "images/default"
    images.mkdir(parents=True)
    shutil.copy(image_source / "images/default/image.json", images / "image.json")
    subprocess.run(["chown", "-R", f"{who.account}:", str(who.home / ".local")], check=True)


def end_what_is_left(who: Newcomer) -> None:
    for _ in range(3):  # a dying parent may start nothing new, but be sure
        for pid in who.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not who.processes(), 15)
    sweep(who.state_dir)
    for point in sorted(who.mounts(), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    subprocess.run(["userdel", "--remove", who.account], capture_output=True)
    shutil.rmtree(who.home, ignore_errors=True)


def split_run_line(line: str) -> tuple[str, str]:
    """README's run line: the setup, and `sandbox-kernel lab` that ends it."""
    setup, _, main = line.rpartition(" && ")
    assert main == LAB and setup, f"README's run line no longer ends with `{LAB}`: {line}"
    return setup, main


def lab_kernel_client(who: Newcomer, base: str, token: str) -> BlockingKernelClient:
    """A kernel JupyterLab starts (as the launcher does, not a notebook's: nothing is kept)."""
    r = httpx.post(f"{base}/api/kernels", params={"token": token}, json={"name": "sandbox"}, timeout=120)
    assert r.status_code == 201, r.text
    kernel_id = r.json()["id"]
    connection = who.home / ".local/share/jupyter/runtime" / f"kernel-{kernel_id}.json"
    assert wait_for(connection.exists, 60), f"no connection file {connection}"
    kc = BlockingKernelClient()
    kc.load_connection_file(str(connection))
    kc.start_channels()
    # A heart a second late on a loaded host is not dead (the default: 1 s, and a CI run's
    # wait_for_ready then said "Kernel died" of a kernel that was starting).
    kc.hb_channel.time_to_dead = 20.0
    kc.wait_for_ready(timeout=300)
    return kc


# README's Notebooks validation, with nbval added to README's install (nothing the notebooks
# use: nbval and pytest only); one process, not the suite's xdist workers (`addopts`).
NBVAL = (".venv/bin/pip install -q nbval && .venv/bin/python -m pytest -o addopts= -p no:cacheprovider -q "
         "--nbval notebooks/ --nbval-kernel-name sandbox --nbval-sanitize-with notebooks/nbval_sanitize.cfg")


def test_readme_first_day_from_a_fresh_clone(newcomer: Newcomer, tmp_path: pathlib.Path,
                                            request: pytest.FixtureRequest):
    who = newcomer
    setup, main = split_run_line(readme_run_line(who.clone / "README.md"))
    began = time.monotonic()
    installed = who.run(setup, timeout=1200)
    assert installed.returncode == 0, f"README's setup failed: {setup}\n{installed.stdout[-3000:]}\n" \
                                      f"{installed.stderr[-5000:]}"
    timings = {"setup": time.monotonic() - began}
    # Only now: the run's image may still be building (its first minute), and README's setup
    # needs none of it.
    borrow_image(who, request.getfixturevalue("image_source"))

    port, token = free_port(), secrets.token_hex(16)
    log = tmp_path / "lab.log"
    headless = f"{main} --port {port} -- --ServerApp.token={token}"
    with open(log, "w") as out:
        lab = subprocess.Popen(who.argv(headless), cwd=who.clone, env=who.env(), stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        up = wait_for(lambda: jupyter_answers(base, token) or lab.poll() is not None, 180, interval=0.5)
        assert up and lab.poll() is None, log.read_text()[-5000:]
        began = time.monotonic()
        kc = lab_kernel_client(who, base, token)
        try:
            cell = run_cell(kc, "import os, pandas as pd\nprint(os.getcwd(), pd.DataFrame({'x': [6]}).x.sum() * 7)",
                            timeout=600)
        finally:
            kc.stop_channels()
        assert cell.status == "ok" and cell.stdout == "/workspace 42\n", (cell.reply, cell.outputs)
        timings["first cell"] = time.monotonic() - began
        server = json.loads((who.state_dir / "server.json").read_text())
        assert pid_alive(server["pid"]) and who.processes(), "the control: the embedded server runs"

        began = time.monotonic()
        notebooks = sorted((who.clone / "notebooks").glob("*.ipynb"))
        assert len(notebooks) >= 5, notebooks
        lab_kernels = set(running_in(who.state_dir))  # the kernel above runs on
        ran = who.run(NBVAL, timeout=1200)
        assert ran.returncode == 0, f"a notebook failed with README's install:\n{ran.stdout[-6000:]}\n" \
                                    f"{ran.stderr[-3000:]}"
        counts = summary_counts(ran.stdout)
        # A notebook whose extra README's install leaves out (05: adk) is skipped, every cell,
        # saying why (notebooks/conftest.py), and so is one that needs an image a user cannot
        # build (06: a Debian root of its own); every other cell ran and passed.
        skipped = [n for n in notebooks if (n.name == "05-adk-agent.ipynb" and "adk" not in setup)
                   or n.name == "06-polyglot-analysis.ipynb"]
        assert counts.get("passed") == sum(code_cell_count(n) for n in notebooks if n not in skipped), \
            ran.stdout[-3000:]
        assert counts.get("skipped", 0) == sum(map(code_cell_count, skipped)), ran.stdout[-3000:]
        assert set(counts) <= {"passed", "skipped"}, ran.stdout[-3000:]
        # nbval killed its kernels: the embedded server ended their sandboxes by itself.
        assert wait_for(lambda: set(running_in(who.state_dir)) == lab_kernels, 60, interval=0.5), \
            (running_in(who.state_dir), lab_kernels)
        timings["notebooks"] = time.monotonic() - began

        began = time.monotonic()
        assert httpx.post(f"{base}/api/shutdown", params={"token": token}, timeout=60).status_code == 200
        lab.wait(timeout=300)
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait()
    output = log.read_text(errors="replace")
    assert lab.returncode == 0, output[-5000:]
    assert "stopping the sandbox server JupyterLab's kernels started" in output, output[-5000:]
    # The newcomer's terminal: neither debugpy's nor ipykernel's noise (tests/cli/test_lab_terminal.py).
    assert "frozen modules" not in output and "without encryption" not in output, output[-5000:]
    # Supervisors tear their sandboxes down as the server ends them: awaited, not assumed.
    left = wait_for(lambda: not who.processes() and not who.mounts(), 60, interval=0.5)
    assert left, f"left after `lab` exited: {who.processes()}, mounts {who.mounts()}\n{output[-3000:]}"
    timings["lab exit"] = time.monotonic() - began
    print("fresh clone:", ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
