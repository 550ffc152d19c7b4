"""A team on one host behind a real JupyterHub, set up as deploy/jupyterhub says.

Everything the deployment runs is read from deploy/jupyterhub, the files docs/teams.md shows:
setup.sh installs (a venv of Debian's /usr/bin/python3 with the `hub` extra from PyPI,
configurable-http-proxy from npm with Debian's nodejs, the kernelspecs pinned to the system
server), and the two systemd units' ExecStart lines start the system server and the hub. The
test changes only where things go: PREFIX and STATE are scratch directories of this run
(for /opt/sandbox-kernel and /var/lib/sandbox-kernel), the hub, its API and the proxy's API
listen on free ports (the units' defaults are fixed ones), and the team's Unix group is one
of this run's.

Two accounts made here (useradd, chpasswd: PAM checks their real passwords) log in through
Chromium at the same time and run cells at once; then:
- each has a sandbox of the system server, under its own host uid, and neither reaches the
  other's variables, files, sandbox (`%sandbox attach`) or host (`%%host` is off);
- their homes are 0700 after the hub's spawn, whatever useradd made;
- "Stop My Server" in the hub, then "Start My Server": the notebook's variable is still there
  (the binding is in the user's own state directory; the server's is root's);
- a hub restart: the same for both;
- a cull: the hub restarted with the culler's timeout shortened (SANDBOX_KERNEL_HUB_CULL_SECONDS),
  both leave their notebooks, jupyterhub-idle-culler stops both servers, and on reopening
  both variables are back;
- after the hub stops, no process of either account and none of the hub's is left.

Each user is a window of their own that stays visible (Chromium's backgrounding of hidden
windows off: two people at two screens), and a notebook counts as open once its page has
the kernel's kernel_info_reply on its websocket (JupyterLab's "Idle" shows before its kernel
connection exists, and a cell run before that is dropped by JupyterLab, for any kernel).

Needs root (accounts, PAM, the system server), npm, /usr/bin/python3, Playwright and
Debian's Chromium; skipped, saying which is missing, otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import pwd
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing as t
from dataclasses import dataclass

import httpx
import pytest

import support
import testrun
from sandbox.service.server_process import ServerProcess

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "browser"))
from test_browser_jupyterlab import (ARTIFACTS, CELL_MS, CHROMIUM, CHROMIUM_ARGS, KERNEL_START_MS,  # noqa: E402
                                     Notebook)

DEPLOY = support.REPO / "deploy" / "jupyterhub"
SYSTEM_PYTHON = "/usr/bin/python3"
REAL_PREFIX, REAL_STATE = "/opt/sandbox-kernel", "/var/lib/sandbox-kernel"
SPAWN_MS = 180_000
# The culler's timeout while the cull is tested: longer than two spawns, two notebooks opened and
# a cell in each take (the hub sees a server's activity only every few minutes, so a server is
# culled this long after its spawn whatever its page does), short enough to wait for.
CULL_SECONDS = 150
# Two users at two screens: no window is hidden, so none is throttled or frozen.
HUB_CHROMIUM_ARGS = CHROMIUM_ARGS + ["--disable-background-timer-throttling", "--disable-renderer-backgrounding",
                                     "--disable-backgrounding-occluded-windows"]


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root: Unix accounts with PAM passwords, the system server, the hub"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "chpasswd", "runuser", "npm", "node"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install nodejs npm passwd util-linux)"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing: the hub's venv is made with Debian's python3"
    if not pathlib.Path("/etc/pam.d/login").is_file():
        return "no PAM service 'login' (/etc/pam.d/login): the hub's PAMAuthenticator uses it"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


def exec_start(unit: str, prefix: pathlib.Path, state: pathlib.Path) -> list[str]:
    """A unit's ExecStart, with this run's directories for the real ones."""
    text = (DEPLOY / unit).read_text()
    line = re.search(r"^ExecStart=(.*)$", text, re.M)[1]
    line = line.replace(REAL_PREFIX, str(prefix)).replace(REAL_STATE, str(state))
    return shlex.split(line)


@dataclass
class Member:
    name: str
    password: str
    uid: int
    home: pathlib.Path


@dataclass
class Host:
    prefix: pathlib.Path
    state: pathlib.Path
    group: str
    members: list[Member]
    log: pathlib.Path
    hub: ServerProcess | None = None
    port: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_hub(self, cull_seconds: int | None = None) -> None:
        self.port, hub_port, proxy_api = support.free_port(), support.free_port(), support.free_port()
        argv = exec_start("jupyterhub.service", self.prefix, self.state) + [
            f"--JupyterHub.bind_url=http://127.0.0.1:{self.port}",
            f"--JupyterHub.hub_bind_url=http://127.0.0.1:{hub_port}",
            f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{proxy_api}",
        ]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SANDBOX_KERNEL_HUB_GROUP": self.group,
               "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
        if cull_seconds is not None:
            env["SANDBOX_KERNEL_HUB_CULL_SECONDS"] = str(cull_seconds)
        self.hub = ServerProcess(argv, self.log, env=env, cwd=self.prefix / "hub", banner="hub")
        self.hub.start()
        assert support.wait_for(lambda: _answers(f"{self.base}/hub/login"), 180), self.tail()

    def stop_hub(self) -> None:
        """SIGTERM, as systemd stops it: the hub stops the single-user servers and the proxy."""
        if self.hub is not None and self.hub.running:
            self.hub.proc.send_signal(signal.SIGTERM)
            try:
                self.hub.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.hub.proc.kill()
                self.hub.proc.wait(10)
                raise AssertionError(f"the hub did not stop on SIGTERM\n{self.tail()}") from None

    def tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def processes_of_members(self) -> dict[int, str]:
        """Every live process running as one of the members (their servers, their kernels)."""
        uids = {m.uid for m in self.members}
        found = {}
        for pid in [int(e) for e in os.listdir("/proc") if e.isdigit()]:
            try:
                if support.real_uid(pid) in uids and support.pid_alive(pid):
                    found[pid] = support.command(pid)[:200]
            except (OSError, ValueError, IndexError):
                continue
        return found

    def left_behind(self) -> dict[int, str]:
        """Processes of the members, and any running from the hub's prefix (hub, proxy,
        single-user servers, kernels, the culler); not the system server and its sandboxes,
        which outlive the hub by design (the notebooks keep their sandboxes)."""
        found = {**support.processes_of(self.prefix), **self.processes_of_members()}
        servers = support.processes_of(self.state, support.sandbox_ids(self.state))
        return {pid: cmd for pid, cmd in found.items() if pid not in servers}


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def system_api(host: Host) -> httpx.Client:
    """Root's client of the system server (root sees every user's sandboxes)."""
    transport = httpx.HTTPTransport(uds=str(host.state / "server.sock"))
    return httpx.Client(transport=transport, base_url="http://sandbox", timeout=60)


def accounts(argv: list[str], stdin: str | None = None) -> None:
    """useradd, groupadd, chpasswd: tried again while another run on the machine holds the
    account files' lock (they exit 10, or 1 for chpasswd, saying "cannot lock")."""
    for _ in range(30):
        done = subprocess.run(argv, input=stdin, text=True, capture_output=True)
        if done.returncode == 0:
            return
        if "lock" not in done.stderr.lower() and done.returncode != 10:
            break
        time.sleep(1)
    raise AssertionError(f"{argv[0]} failed ({done.returncode}): {done.stderr}")


def _make_member(group: str, tag: str) -> Member:
    name = f"sbkh{tag}{secrets.token_hex(3)}"
    password = secrets.token_urlsafe(12)
    accounts(["useradd", "--create-home", "--shell", "/bin/bash", "-G", group, name])
    accounts(["chpasswd"], f"{name}:{password}\n")
    entry = pwd.getpwnam(name)
    home = pathlib.Path(entry.pw_dir)
    home.chmod(0o755)  # Debian's default before bookworm; the hub's spawn narrows it
    notebook = {"cells": [], "metadata": {"kernelspec": {"name": "sandbox", "display_name": "Python (sandbox)",
                                                         "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (home / "team.ipynb").write_text(json.dumps(notebook))
    os.chown(home / "team.ipynb", entry.pw_uid, entry.pw_gid)
    return Member(name, password, entry.pw_uid, home)


@pytest.fixture(scope="module")
def host(sandbox_server: support.Server) -> t.Iterator[Host]:
    missing = _missing()
    if missing:
        print(f"skipped: {missing}")
        pytest.skip(missing)
    prefix = pathlib.Path(tempfile.mkdtemp(prefix=f"sbk-hub-{testrun.tag() or 'x'}-", dir="/tmp"))
    prefix.chmod(0o755)
    state = support.make_state_dir("sbk-hubstate-", images_from=sandbox_server.state_dir)
    group = f"sbkhub{secrets.token_hex(3)}"
    accounts(["groupadd", group])
    host = Host(prefix, state, group, [], prefix / "test.log")
    server = None
    try:
        cache = testrun.image_home() / "pip-cache"
        cache.mkdir(exist_ok=True)
        # The machine's own settings for reaching the registries (certificates, proxies) pass.
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SANDBOX_KERNEL_", "VIRTUAL_ENV"))},
               "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PREFIX": str(prefix), "STATE": str(state),
               "PIP_CACHE_DIR": str(cache), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        setup = subprocess.run([str(DEPLOY / "setup.sh")], env=env, capture_output=True, text=True, timeout=1500,
                               stdin=subprocess.DEVNULL)
        assert setup.returncode == 0, f"setup.sh failed\n{setup.stdout[-3000:]}\n{setup.stderr[-5000:]}"
        server = ServerProcess(exec_start("sandbox-kernel.service", prefix, state), prefix / "server.log",
                               banner="system server")
        server.start()
        assert support.wait_for((state / "server.sock").exists, 120), server.log_tail(40)
        host.members = [_make_member(group, tag) for tag in ("a", "b")]
        yield host
    finally:
        host.stop_hub() if host.hub is not None and host.hub.running else None
        for member in host.members:
            subprocess.run(["pkill", "-KILL", "-u", member.name], capture_output=True)
        if server is not None and server.running:
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(30)
        support.sweep(state)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for log in (prefix / "test.log", prefix / "server.log"):  # the hub's, the single-user servers', the kernels'
            if log.exists():
                shutil.copy(log, ARTIFACTS / f"jupyterhub-{log.name}")
        if os.environ.get("SANDBOX_KERNEL_TEST_KEEP_STATE") == "1":
            print(f"kept: {prefix}, {state}, the accounts {[m.name for m in host.members]} and the group {group}")
            return
        for member in host.members:
            subprocess.run(["userdel", "--remove", member.name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(prefix, ignore_errors=True)


def start_server(page: t.Any, host: Host, member: Member, then: str = "") -> None:
    """What the hub's "Start My Server" does (/hub/spawn), logging in first when the hub asks
    (PAM checks the account's password): ends in the member's JupyterLab (at `then`, a path
    under it, if given: the hub's `next`)."""
    page.goto(f"{host.base}/hub/spawn" + (f"?next=/user/{member.name}/lab/{then}" if then else ""))
    if "/hub/login" in page.url:
        page.fill("#username_input", member.name)
        page.fill("#password_input", member.password)
        page.click("#login_submit")
    page.wait_for_url(re.compile(rf"/user/{member.name}/lab"), timeout=SPAWN_MS)


class KernelFrames:
    """What a page's kernel websockets carried, decoded (JupyterLab speaks the binary
    v1.kernel.websocket.jupyter.org protocol): the test's sign that a notebook's kernel is
    connected, and on failure a record of each request and its replies."""

    def __init__(self, page: t.Any) -> None:
        self.messages: list[tuple[str, dict[str, t.Any]]] = []
        page.on("websocket", self._watch)

    def _watch(self, ws: t.Any) -> None:
        if "/channels" in ws.url:
            ws.on("framesent", lambda payload: self.messages.append(("sent", decode_frame(payload))))
            ws.on("framereceived", lambda payload: self.messages.append(("recv", decode_frame(payload))))

    def received(self, msg_type: str, since: int) -> bool:
        return any(way == "recv" and m.get("msg_type") == msg_type for way, m in self.messages[since:])

    def dump(self, path: pathlib.Path) -> None:
        path.write_text("".join(f"{way} {m.get('channel')} {m.get('msg_type')} id={m.get('msg_id')} "
                                f"parent={m.get('parent')} {json.dumps(m.get('content'))[:160]}\n"
                                for way, m in self.messages))


def decode_frame(payload: t.Any) -> dict[str, t.Any]:
    """One websocket message: the v1 binary layout (a count, offsets, then channel, header,
    parent header, metadata, content) or the JSON one."""
    try:
        if isinstance(payload, bytes):
            count = int.from_bytes(payload[:8], "little")
            offsets = [int.from_bytes(payload[8 + 8 * i:16 + 8 * i], "little") for i in range(count)] + [len(payload)]
            parts = [payload[offsets[i]:offsets[i + 1]] for i in range(min(count, 5))]
            channel, header, parent, _metadata, content = parts[0].decode(), *(json.loads(p) for p in parts[1:5])
        else:
            msg = json.loads(payload)
            channel, header, parent, content = msg["channel"], msg["header"], msg["parent_header"], msg["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return {}
    return {"channel": channel, "msg_type": header.get("msg_type"), "msg_id": header.get("msg_id"),
            "parent": (parent or {}).get("msg_id"), "content": content}


def open_notebook(page: t.Any, host: Host, member: Member, frames: KernelFrames, since: int | None = None) -> Notebook:
    """The member's notebook, once its kernel is connected: its page has the kernel's
    kernel_info_reply (JupyterLab shows "Idle" before that; a cell run earlier it drops).
    With `since` (a count of frames), the page is there already (see `reopen_all`)."""
    if since is None:
        since = len(frames.messages)
        page.goto(f"{host.base}/user/{member.name}/lab/tree/team.ipynb", timeout=SPAWN_MS)
    notebook = Notebook(page)
    notebook.wait_status("idle", KERNEL_START_MS)
    deadline = time.monotonic() + KERNEL_START_MS / 1000
    while not frames.received("kernel_info_reply", since):
        assert time.monotonic() < deadline, f"{member.name}'s notebook never connected to its kernel"
        page.wait_for_timeout(200)
    return notebook


def run_cells_at_once(notebooks: list[Notebook], codes: list[str], indexes: list[int]) -> list[str]:
    """Type a cell into each notebook, then wait for all: the cells run at the same time."""
    for notebook, code, index in zip(notebooks, codes, indexes):
        notebook.page.bring_to_front()  # a background window gets no focus: Shift+Enter would not run the cell
        notebook.type_cell(index, code)
    for notebook, index in zip(notebooks, indexes):
        notebook.wait_done(index, CELL_MS * 2)
    return [notebook.output_text(index) for notebook, index in zip(notebooks, indexes)]


def hub_stop_and_start(page: t.Any, host: Host, member: Member) -> None:
    """The hub's own buttons on /hub/home: Stop My Server, then Start My Server."""
    page.goto(f"{host.base}/hub/home")
    page.click("#stop")
    # #start is on the page all along (it reads "My Server" while the server runs, and leads to
    # it): it starts the server only once the stop is through, when the page hides #stop.
    page.locator("#stop").wait_for(state="hidden", timeout=SPAWN_MS)
    page.click("#start")
    page.wait_for_url(re.compile(rf"/user/{member.name}/lab"), timeout=SPAWN_MS)


def sandboxes_by_uid(host: Host) -> dict[int, list[str]]:
    """The system server's sandboxes by owner, as root lists them."""
    with system_api(host) as api:
        listed = api.get("/v1/sandboxes").json()["sandboxes"]
    owners: dict[int, list[str]] = {}
    for item in listed:
        owners.setdefault(item["owner"]["uid"], []).append(item["id"])
    return owners


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_team_on_one_host_behind_jupyterhub(host: Host) -> None:
    from playwright.sync_api import sync_playwright

    alice, bob = host.members
    host.start_hub()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=HUB_CHROMIUM_ARGS)
        pages = [browser.new_context().new_page() for _ in host.members]
        frames = [KernelFrames(page) for page in pages]

        def reopen_all() -> list[Notebook]:
            """Each server started straight into the notebook: one page load. (Landing in /lab
            first, whose saved workspace reopens the notebook, then loading the notebook's URL
            made a second session, and kernel, for the same notebook now and then; the first,
            orphaned, kept the notebook's sandbox, and the page's kernel got a fresh one.)"""
            marks = [len(f.messages) for f in frames]
            for page, member in zip(pages, host.members):
                start_server(page, host, member, then="tree/team.ipynb")
            return [open_notebook(page, host, member, f, since)
                    for page, member, f, since in zip(pages, host.members, frames, marks)]

        try:
            for page, member in zip(pages, host.members):
                start_server(page, host, member)
            for member in host.members:
                assert member.home.stat().st_mode & 0o777 == 0o700, f"{member.home} is not 0700 after the spawn"
            notebooks = [open_notebook(page, host, member, f) for page, member, f in zip(pages, host.members, frames)]

            outs = run_cells_at_once(notebooks, [
                f"secret = '{m.name}-41'\nopen('/workspace/mine.txt', 'w').write(secret)\nprint('kept', secret)"
                for m in host.members], [0, 0])
            assert [f"kept {m.name}-41" in out for out, m in zip(outs, host.members)] == [True, True], outs

            # Each a sandbox of the system server, its binding in the user's own state directory.
            owners = sandboxes_by_uid(host)
            ids = {m.name: owners.get(m.uid, []) for m in host.members}
            assert all(len(v) == 1 for v in ids.values()), (owners, host.tail())
            for m in host.members:
                bindings = list((m.home / ".local/share/sandbox-kernel/notebooks").glob("*.json"))
                assert [json.loads(b.read_text())["sandbox_id"] for b in bindings] == ids[m.name], bindings

            check_isolation(notebooks[1], bob, alice, ids[alice.name][0])

            # A server stop from the hub: the notebook keeps its sandbox.
            hub_stop_and_start(pages[0], host, alice)
            notebooks[0] = open_notebook(pages[0], host, alice, frames[0])
            again = run_one(notebooks[0], "print(secret, open('/workspace/mine.txt').read())")
            assert f"{alice.name}-41 {alice.name}-41" in again, again
            assert sandboxes_by_uid(host).get(alice.uid) == ids[alice.name]

            # A hub restart: the same for both (the culler's timeout shortened from here on).
            host.stop_hub()
            assert support.wait_for(lambda: not host.left_behind(), 60), host.left_behind()
            host.start_hub(cull_seconds=CULL_SECONDS)
            notebooks = reopen_all()
            outs = run_cells_at_once(notebooks, ["print(secret)"] * 2, [len_cells(n) for n in notebooks])
            assert [f"{m.name}-41" in out for out, m in zip(outs, host.members)] == [True, True], outs
            assert {m.name: sandboxes_by_uid(host).get(m.uid) for m in host.members} == ids

            # A cull of both servers; reopened, the variables are back.
            wait_for_the_cull(host, pages)
            notebooks = reopen_all()
            outs = run_cells_at_once(notebooks, ["print(secret)"] * 2, [len_cells(n) for n in notebooks])
            assert [f"{m.name}-41" in out for out, m in zip(outs, host.members)] == [True, True], outs
            assert {m.name: sandboxes_by_uid(host).get(m.uid) for m in host.members} == ids
        except BaseException:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            for page, member, f in zip(pages, host.members, frames):
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(ARTIFACTS / f"jupyterhub-{member.name[:5]}.png"))
                f.dump(ARTIFACTS / f"jupyterhub-{member.name[:5]}-frames.txt")
            raise
        finally:
            browser.close()
    host.stop_hub()
    assert support.wait_for(lambda: not host.left_behind(), 60), host.left_behind()


def wait_for_the_cull(host: Host, pages: list[t.Any]) -> None:
    """Both leave their notebooks (an open JupyterLab keeps its server busy with requests),
    until jupyterhub-idle-culler has stopped both servers (its log line names each)."""
    for page in pages:
        page.goto("about:blank")
    assert support.wait_for(lambda: not host.processes_of_members(), CULL_SECONDS * 3, interval=2), \
        (host.processes_of_members(), host.tail())
    log = host.log.read_text(errors="replace")
    assert all(f"Culling server {m.name}" in log for m in host.members), host.tail()


def check_isolation(probe: Notebook, member: Member, other: Member, other_sandbox: str) -> None:
    """From `member`'s notebook: none of the other's variables or files, and neither their
    sandbox (`%sandbox attach`) nor their home (`%%host` is off) can be reached."""
    seen = run_one(probe, "import os\nprint(globals().get('secret'), sorted(os.listdir('/workspace')))")
    assert f"{member.name}-41" in seen and other.name not in seen, seen
    refused = run_one(probe, f"%sandbox attach {other_sandbox}")
    assert "SandboxNotFound" in refused and other.name not in refused, refused  # as an unknown id
    host_cell = run_one(probe, f"%%host\nimport os\nprint(os.listdir({str(other.home)!r}))")
    assert "team.ipynb" not in host_cell and "off" in host_cell.lower(), host_cell


def run_one(notebook: Notebook, code: str) -> str:
    """Run `code` in the notebook's last (empty) cell, its window in front."""
    notebook.page.bring_to_front()
    return notebook.run(len_cells(notebook), code)


def len_cells(notebook: Notebook) -> int:
    """The index of the notebook's last cell (an empty one, where the next code goes)."""
    return notebook.cells.count() - 1


def test_the_team_recipe_is_what_the_hub_test_runs() -> None:
    """The team recipe (docs/teams.md) runs deploy/jupyterhub's files, the ones the test above runs: its
    setup script, and the two units whose ExecStart lines start the server and the hub."""
    from docblocks import blocks

    recipe = next(b.code for b in blocks([support.REPO / "docs" / "teams.md"])
                  if b.lang == "bash" and "deploy/jupyterhub/setup.sh" in b.code)
    lines = [line.split("#")[0].strip() for line in recipe.strip().splitlines()]
    assert lines[1] == "deploy/jupyterhub/setup.sh", lines
    units = lines[2].split()[1:-1]
    assert lines[2].startswith("cp ") and lines[2].endswith(" /etc/systemd/system/"), lines
    assert sorted(units) == ["deploy/jupyterhub/jupyterhub.service", "deploy/jupyterhub/sandbox-kernel.service"]
    assert lines[3] == "systemctl enable --now sandbox-kernel jupyterhub", lines
    for unit in units:
        assert exec_start(pathlib.Path(unit).name, pathlib.Path(REAL_PREFIX), pathlib.Path(REAL_STATE))[0] \
            .startswith(f"{REAL_PREFIX}/.venv/bin/"), unit
    group = re.search(r"groupadd (\S+)", lines[0])[1]
    config = (DEPLOY / "jupyterhub_config.py").read_text()
    assert f'"SANDBOX_KERNEL_HUB_GROUP", "{group}"' in config  # the group the recipe makes is the one the hub allows
