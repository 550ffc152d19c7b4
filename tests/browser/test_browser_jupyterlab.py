"""End to end, as a user meets it: a real Chromium drives a real JupyterLab, started the way
the README says (`sandbox-kernel lab`), whose "Python (sandbox)" kernel runs cells in real
sandboxes on the session's sandbox server.

The protocol-level tests (tests/kernel/) prove the kernel answers Jupyter messages; this one
proves the pieces fit in the product: the kernelspec shows up in the launcher, `%push` finds
files next to the notebook, figures render as images, the toolbar's interrupt button stops a
cell without killing the kernel, and the menu's restart gives a fresh sandbox.

Screenshots of each step go to artifacts/browser/ (git-ignored), with JupyterLab's log
(which includes the kernel's) and, on failure, a screenshot of the page as it was.

Needs: jupyterlab and playwright (pip), and a Chromium at /usr/bin/chromium (Debian's
`chromium` package; `.ci/run` installs it). Playwright never downloads a browser here.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
import typing as t

import httpx
import pytest

import support
from sandbox.service.server_process import ServerProcess, ServerStartError
from support import wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "browser"
CHROMIUM = pathlib.Path(os.environ.get("SANDBOX_KERNEL_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
KERNEL_DISPLAY_NAME = "Python (sandbox)"
# JupyterLab and the first kernel start on a loaded 2-core machine are slow.
LAB_START_TIMEOUT = 180.0
KERNEL_START_MS = 120_000
CELL_MS = 90_000

def _prerequisites() -> str | None:
    """Why the test cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no browser download needed)"
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        return "jupyterlab is not installed (pip install jupyterlab)"
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


MISSING = _prerequisites()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(MISSING is not None, reason=f"browser test prerequisite missing: {MISSING}"),
]


# --------------------------------------------------------------------------- JupyterLab


class Lab:
    """A JupyterLab child process (sandbox.service.server_process.ServerProcess) and what the test
    needs to reach it."""

    def __init__(self, process: ServerProcess, port: int, token: str, root: pathlib.Path, log: pathlib.Path):
        self.process = process
        self.proc = process.proc
        self.port = port
        self.token = token
        self.root = root
        self.log = log
        self.started_kernels: set[int] = set()
        self.exit_code: int | None = None  # once stopped
        self.kept: dict[str, str] = {}  # the sandboxes its notebooks kept when it stopped (then deleted)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base}/lab?token={self.token}"

    def log_tail(self, n: int = 60) -> str:
        return self.process.log_tail(n)

    def kernel_pids(self) -> set[int]:
        """The kernel processes this JupyterLab started (its descendants running `-m kernel`,
        or forked by the fork server it started: `sandbox-kernel lab` runs JupyterLab as its
        child, which starts the kernels): the kernel records its pid in its sandbox's metadata."""
        parents: dict[int, int] = {}
        kernels: set[int] = set()
        forking: set[int] = set()  # the fork server and the kernels it forked (they keep its command line)
        for entry in pathlib.Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"kernel" in argv:
                    kernels.add(int(entry.name))
                elif b"kernel.forkserver" in argv:
                    forking.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
        kernels |= {pid for pid in forking if parents.get(pid) in forking}  # forked: the fork server's children

        def descends(pid: int) -> bool:
            for _ in range(8):  # lab -> JupyterLab -> kernel: a short chain
                pid = parents.get(pid, 0)
                if pid == self.proc.pid:
                    return True
                if pid <= 1:
                    return False
            return False

        pids = {pid for pid in kernels if descends(pid)}
        self.started_kernels |= pids
        return pids

    def reap_kernels(self) -> list[int]:
        """Kernels still alive after JupyterLab ended (only if it had to be killed):
        stop them, so that their sandboxes are not left to the TTL."""
        left = []
        for pid in self.started_kernels:
            try:
                if b"kernel" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGTERM)
                    left.append(pid)
            except (OSError, ProcessLookupError):
                pass
        return left

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGTERM, as Ctrl-C would: JupyterLab shuts its kernels down, which deletes
        their sandboxes. Returns the exit code (None if it had to be killed)."""
        return self.process.stop(timeout)


def _user_settings(settings_dir: pathlib.Path) -> None:
    """No news or update toasts over the notebook (they would also try the network). The
    completer waits for the kernel's answer as long as a loaded machine may need (by default
    it drops an answer later than 1 s: a Tab would then show nothing)."""
    target = settings_dir / "@jupyterlab" / "apputils-extension"
    target.mkdir(parents=True, exist_ok=True)
    (target / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    completer = settings_dir / "@jupyterlab" / "completer-extension"
    completer.mkdir(parents=True, exist_ok=True)
    (completer / "manager.jupyterlab-settings").write_text('{"providerTimeout": 60000}')


def start_lab(server: support.Server, workdir: pathlib.Path, extra_env: dict[str, str] | None = None,
              name: str = "lab") -> Lab:
    root = workdir / "notebooks"
    (root / "data").mkdir(parents=True)
    shutil.copy(REPO / "notebooks" / "data" / "campaign_weeks.csv", root / "data" / "campaign_weeks.csv")
    for folder in ("config", "runtime", "settings", "workspaces"):  # not `name`: the log's name below
        (workdir / folder).mkdir()
    _user_settings(workdir / "settings")

    env = support.with_repo_on_path(dict(os.environ))
    env.update(server.env)  # the kernel inherits JupyterLab's environment
    env["SANDBOX_KERNEL_START_SERVER"] = "0"  # use the session's server, never start one
    env.update(
        SANDBOX_KERNEL_STATE_DIR=str(workdir / "state"),  # where the kernels record each notebook's sandbox
        JUPYTER_CONFIG_DIR=str(workdir / "config"),
        JUPYTER_RUNTIME_DIR=str(workdir / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(workdir / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(workdir / "workspaces"),
    )
    env.pop("JUPYTER_TOKEN", None)
    env.update(extra_env or {})
    port = support.free_port()
    token = secrets.token_hex(16)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / f"jupyterlab-{name}.log"  # one per page: tests run side by side
    # `lab` takes everything after --port as JupyterLab's arguments (argparse REMAINDER).
    # REMAINDER must begin with a non-option word, and a "--" would be passed on to
    # JupyterLab, which then ignores every option after it: so the root directory (a
    # positional argument of `jupyter lab`) comes first, then the options.
    argv = [
        sys.executable, "-m", "sandbox", "lab", "--port", str(port),
        str(root),
        f"--ServerApp.token={token}",
        "--ServerApp.password=",
        "--ServerApp.open_browser=False",
        "--LabApp.news_url=None",
        "--ServerApp.shutdown_no_activity_timeout=0",
    ]
    log.unlink(missing_ok=True)
    process = ServerProcess(argv, log, env=env, cwd=root)
    process.start()
    lab = Lab(process, port, token, root, log)
    answers: list[httpx.Response] = []

    def kernelspecs_served() -> bool:
        try:
            r = httpx.get(f"{lab.base}/api/kernelspecs", params={"token": token}, timeout=5)
        except httpx.HTTPError:
            return False
        answers.append(r)
        return r.status_code == 200

    try:
        process.wait_ready(kernelspecs_served, LAB_START_TIMEOUT, interval=0.5, tail_lines=60, name="JupyterLab")
    except ServerStartError:
        lab.stop()
        raise
    r = answers[-1]
    specs = r.json()["kernelspecs"]
    names = {name: spec["spec"]["display_name"] for name, spec in specs.items()}
    assert KERNEL_DISPLAY_NAME in names.values(), f"`sandbox-kernel lab` did not install the kernelspec: {names}"
    print(f"JupyterLab: {lab.url}  (root {root}, log {log})", flush=True)
    return lab


# --------------------------------------------------------------------------- the page


@contextlib.contextmanager
def chromium_page(name: str, *, full_page: bool = False, console: bool = False,
                  log_tail: t.Callable[[], str] = lambda: "") -> t.Iterator[t.Any]:
    """A page in headless Chromium (Debian's, never a downloaded one), for one test.

    On failure: a screenshot (`name`-failure.png) and `log_tail()` (the JupyterLab log's
    end) printed; the browser closed after."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.set_default_timeout(60_000)
            if console:
                page.on("console", lambda m: print(f"console {m.type}: {m.text}"[:400], flush=True))
            yield page
        except BaseException:
            if page is not None:
                with contextlib.suppress(Exception):
                    page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"), full_page=full_page)
            print(f"JupyterLab log tail:\n{log_tail()}", flush=True)
            raise
        finally:
            browser.close()


@contextlib.contextmanager
def lab_page(server: support.Server, name: str, *, full_page: bool = False,
             console: bool = False, extra_env: dict[str, str] | None = None) -> t.Iterator[tuple[t.Any, Lab]]:
    """JupyterLab on the session's sandbox server and a Chromium page on it, for one test.

    On failure: a screenshot (`name`-failure.png) and JupyterLab's log tail. After: JupyterLab
    stopped (its exit code in `lab.exit_code`), and no kernel process of it left behind; the
    sandboxes its notebooks kept (`lab.kept`) deleted."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"sbk-browser-{name}-"))
    lab = start_lab(server, workdir, extra_env, name)
    try:
        with chromium_page(name, full_page=full_page, console=console, log_tail=lab.log_tail) as page:
            yield page, lab
    finally:
        lab.exit_code = lab.stop()
        left = lab.reap_kernels()
        lab.kept = end_kept_sandboxes(server, workdir / "state")
        shutil.rmtree(workdir, ignore_errors=True)
    assert not left, f"kernel processes {left} outlived JupyterLab (exit code {lab.exit_code})"


def end_kept_sandboxes(server: support.Server, state_dir: pathlib.Path) -> dict[str, str]:
    """The sandboxes JupyterLab's notebooks kept when it stopped ({id: state as it stopped}),
    deleted now: a test leaves nothing running on the session's server."""
    from kernel.binding import all_bindings

    kept = {}
    with server.client(timeout=60) as client:
        for binding, _path, _held in all_bindings(state_dir):
            r = client.get(f"/v1/sandboxes/{binding.sandbox_id}")
            kept[binding.sandbox_id] = r.json()["state"] if r.status_code == 200 else f"HTTP {r.status_code}"
            client.delete(f"/v1/sandboxes/{binding.sandbox_id}")
    return kept


def saved_notebook(lab: Lab, name: str) -> dict | None:
    """The notebook as saved on disk, or None while it is being written.

    Read from the file, never through the contents API while a save may be under way:
    jupyter_server writes a notebook in place (its copy aside is the fallback), and a GET
    that reads the half-written file takes it for a corrupt one, moves it to
    `name.invalid` and puts the old copy back: the save is lost (seen in CI)."""
    import nbformat

    try:  # (nbformat joins the lines a file stores as lists)
        return nbformat.reads((lab.root / name).read_text(), as_version=4)
    except (OSError, ValueError):  # (NotJSONError is a ValueError)
        return None


class Notebook:
    """The one open notebook, addressed by cell index."""

    def __init__(self, page: t.Any) -> None:
        self.page = page
        self.panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
        self.cells = self.panel.locator(".jp-Notebook .jp-Cell")

    def shot(self, name: str) -> pathlib.Path:
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path))
        return path

    def wait_status(self, status: str, timeout_ms: float) -> None:
        self.page.wait_for_function(
            """([panelSel, status]) => {
                const el = document.querySelector(panelSel + ' .jp-Notebook-ExecutionIndicator');
                return el !== null && el.getAttribute('data-status') === status;
            }""",
            arg=[".jp-NotebookPanel:not(.lm-mod-hidden)", status],
            timeout=timeout_ms,
        )

    def prompt(self, index: int) -> str:
        return self.cells.nth(index).locator(".jp-InputPrompt").first.inner_text().strip()

    def wait_done(self, index: int, timeout_ms: float = CELL_MS) -> None:
        """Until the cell's prompt shows its execution count (`[*]` while queued/running)."""
        prompt = self.cells.nth(index).locator(".jp-InputPrompt").first
        deadline = time.monotonic() + timeout_ms / 1000
        while not re.fullmatch(r"\[\d+\]:", prompt.inner_text().strip()):
            if time.monotonic() > deadline:
                raise AssertionError(f"cell {index} did not finish: prompt {prompt.inner_text()!r}")
            self.page.wait_for_timeout(200)

    def type_cell(self, index: int, code: str) -> None:
        """Type into cell `index` (CodeMirror 6) and run it with Shift+Enter."""
        self.cells.nth(index).wait_for(state="attached", timeout=30_000)
        editor = self.cells.nth(index).locator(".cm-content").first
        editor.click()
        # insert_text: one input event for the whole string, so CodeMirror's bracket
        # auto-closing and auto-indent do not add to what is typed.
        self.page.keyboard.insert_text(code)
        typed = self.cells.nth(index).locator(".cm-content").first.inner_text()
        assert typed.replace("\u00a0", " ").strip() == code.strip(), f"the editor holds {typed!r}"
        self.page.keyboard.press("Shift+Enter")

    def output(self, index: int) -> t.Any:
        return self.cells.nth(index).locator(".jp-Cell-outputArea").first

    def output_text(self, index: int) -> str:
        return self.output(index).inner_text()

    def run(self, index: int, code: str, timeout_ms: float = CELL_MS) -> str:
        self.type_cell(index, code)
        self.wait_done(index, timeout_ms)
        return self.output_text(index)

    def click_run_all(self) -> None:
        """Run → Run All Cells, from the menu bar (what a user clicks; JupyterLab then sends
        every cell with `stop_on_error`)."""
        self.page.locator(".lm-MenuBar-item").filter(has_text="Run").first.click()
        self.page.locator(".lm-Menu-item").filter(
            has=self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^\s*Run All Cells\s*$"))
        ).first.click()


def sandboxes_of(api: httpx.Client, kernel_pids: set[int]) -> dict[str, dict]:
    listing = api.get("/v1/sandboxes").json()["sandboxes"]
    return {
        s["id"]: s
        for s in listing
        if (s.get("metadata") or {}).get("client") == "sandbox-kernel"
        and (s.get("metadata") or {}).get("kernel_pid") in kernel_pids
    }


# --------------------------------------------------------------------------- the test


def test_jupyterlab_notebook_with_the_sandbox_kernel(sandbox_server: support.Server, api: httpx.Client) -> None:
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):
        old.unlink()
    seen: dict[str, dict] = {}  # every sandbox this JupyterLab's kernels used
    with lab_page(sandbox_server, "notebook") as (page, lab):
        run_the_notebook(page, lab, api, seen, expect)
        last = set(sandboxes_of(api, lab.kernel_pids()))
    print(f"JupyterLab exited with {lab.exit_code}; sandboxes used: {sorted(seen)}", flush=True)

    # Shutting JupyterLab down shut its kernel down, which kept the notebook's sandbox for
    # its next kernel (JupyterLab told the kernel its notebook: JPY_SESSION_NAME); lab_page
    # deleted it afterwards. The one "Restart Kernel" left was deleted at once.
    assert seen, "no sandbox was ever attributed to this JupyterLab's kernels"
    assert lab.kept == {sid: "running" for sid in last}, (lab.kept, last)
    for sandbox_id in seen:
        r = api.get(f"/v1/sandboxes/{sandbox_id}")
        assert r.status_code == 410, f"{sandbox_id}: {r.status_code} {r.text}"
        assert "was deleted" in r.json()["error"]["message"], f"{sandbox_id}: {r.text}"


def open_from_launcher(page: t.Any, lab: Lab, expect: t.Any, screenshot: str | None = None) -> Notebook:
    """The launcher offers the sandbox kernel; its tile opens a notebook on it, whose kernel
    is then idle."""
    page.goto(lab.url, wait_until="domcontentloaded")
    launcher = page.locator(".jp-Launcher").first
    launcher.wait_for(state="visible", timeout=120_000)
    tile = launcher.locator('.jp-LauncherCard[data-category="Notebook"]').filter(
        has=page.locator(".jp-LauncherCard-label", has_text=re.compile(r"^\s*Python \(sandbox\)\s*$"))
    )
    expect(tile).to_have_count(1)
    tile.scroll_into_view_if_needed()
    if screenshot:
        page.screenshot(path=str(ARTIFACTS / screenshot))
    tile.click()

    nb = Notebook(page)
    nb.panel.wait_for(state="visible", timeout=60_000)
    expect(nb.panel.locator(".jp-Toolbar-kernelName").first).to_have_text(KERNEL_DISPLAY_NAME, timeout=60_000)
    nb.wait_status("idle", KERNEL_START_MS)
    return nb


def run_the_notebook(page: t.Any, lab: Lab, api: httpx.Client, seen: dict[str, dict], expect: t.Any) -> None:
    # 1. The launcher offers the sandbox kernel; its tile opens a notebook on it.
    nb = open_from_launcher(page, lab, expect, screenshot="01-launcher.png")
    expect(page.locator(".jp-StatusBar-Widget, #jp-main-statusbar").filter(has_text=KERNEL_DISPLAY_NAME).first
           ).to_be_visible()
    nb.shot("02-notebook-idle.png")

    # 2a. %push: the file next to the notebook goes into the sandbox's /workspace, keeping
    # its relative path, so the same read_csv works in both places.
    out = nb.run(0, "%push data/campaign_weeks.csv")
    assert re.search(r"pushed data/campaign_weeks\.csv → /workspace/data/campaign_weeks\.csv \(234 B\)", out), out
    first = wait_for(lambda: sandboxes_of(api, lab.kernel_pids()), 30, interval=0.5)
    assert first, "timed out after 30 s waiting for the kernel's sandbox in the listing"
    assert len(first) == 1, first
    seen.update(first)
    (first_id,) = first

    # 2b. pandas in the sandbox reads the pushed file.
    nb.run(1, 'import pandas as pd\ndf = pd.read_csv("data/campaign_weeks.csv")\n'
              'ctr = df.clicks.sum() / df.impressions.sum() * 100\nprint(f"CTR {ctr:.2f} %")')
    expect(nb.output(1)).to_contain_text("CTR 1.01 %")
    assert "Error" not in nb.output_text(1), nb.output_text(1)

    # 2c. A figure comes back as an inline PNG.
    nb.run(2, '(df.clicks / df.impressions * 100).plot(kind="bar")')
    img = nb.output(2).locator('img[src^="data:image/png"]')
    expect(img).to_have_count(1)
    expect(img).to_be_visible()
    assert img.evaluate("el => el.naturalWidth") > 100, "the figure did not decode as an image"
    nb.cells.nth(0).scroll_into_view_if_needed()
    img.scroll_into_view_if_needed()
    nb.shot("03-ctr-and-chart.png")

    # 2d. The toolbar's interrupt button stops a long cell; the kernel and df survive.
    kernels_before = lab.kernel_pids()
    assert len(kernels_before) == 1, kernels_before
    nb.type_cell(3, "import time; time.sleep(60)")
    running = nb.cells.nth(3).locator(".jp-InputPrompt").first
    expect(running).to_have_text(re.compile(r"\[\*\]:"), timeout=30_000)
    nb.wait_status("busy", 30_000)
    page.wait_for_timeout(2_000)
    interrupt = nb.panel.locator(
        '.jp-NotebookPanel-toolbar [data-command="notebook:interrupt-kernel"], '
        '.jp-NotebookPanel-toolbar [title*="Interrupt"]'
    ).first
    clicked = time.monotonic()
    interrupt.click()
    # Generous bound, but far below the 60 s the cell would otherwise sleep.
    expect(nb.output(3)).to_contain_text("KeyboardInterrupt", timeout=30_000)
    nb.wait_done(3, 30_000)
    print(f"interrupt: KeyboardInterrupt shown {time.monotonic() - clicked:.1f} s after the click", flush=True)
    nb.wait_status("idle", 30_000)
    assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").first.inner_text()
    out = nb.run(4, "print(len(df))")
    assert out.strip() == "3", out
    nb.wait_status("idle", 30_000)
    assert lab.kernel_pids() == kernels_before, "the kernel process was replaced (died and restarted?)"
    still = sandboxes_of(api, lab.kernel_pids())
    assert set(still) == {first_id}, f"the interrupt replaced the sandbox: {first_id} -> {sorted(still)}"
    nb.shot("04-interrupted.png")

    # 2e. Kernel → Restart Kernel…: a new kernel with a new, empty sandbox; the old one is deleted.
    page.locator(".lm-MenuBar-item").filter(has_text=re.compile(r"^\s*Kernel\s*$")).first.click()
    restart = page.locator('.lm-Menu-item[data-command="kernelmenu:restart"]')
    if restart.count() == 0:
        restart = page.locator(".lm-Menu-item").filter(has_text=re.compile(r"^\s*Restart Kernel…"))
    restart.first.click()
    dialog = page.locator(".jp-Dialog").first
    dialog.wait_for(state="visible")
    accept = dialog.locator("button.jp-Dialog-button.jp-mod-accept")
    expect(accept).to_have_text(re.compile(r"^\s*Restart\s*$"))
    accept.click()
    dialog.wait_for(state="detached", timeout=30_000)
    nb.wait_status("idle", KERNEL_START_MS)
    out = nb.run(5, "df")
    assert "NameError" in out and "'df' is not defined" in out, out
    after = wait_for(lambda: sandboxes_of(api, lab.kernel_pids()), 30, interval=0.5)
    assert after, "timed out after 30 s waiting for the restarted kernel's sandbox"
    seen.update(after)
    assert first_id not in after and len(after) == 1, f"before restart {first_id}, after {sorted(after)}"
    assert wait_for(lambda: api.get(f"/v1/sandboxes/{first_id}").status_code == 410, 30, interval=0.5), \
        f"timed out after 30 s waiting for the old sandbox {first_id} to be deleted by the restart"
    r = api.get(f"/v1/sandboxes/{first_id}")
    assert "was deleted" in r.json()["error"]["message"], r.text
    nb.shot("05-restarted-nameerror.png")

    # 2f. Jupyter Server names the notebook to its kernel (JPY_SESSION_NAME, the notebook's
    # path): the kernel records the sandbox as the notebook's, to be kept when JupyterLab
    # stops (the test's end checks it, in lab.kept) and taken back by its next kernel.
    from kernel.binding import all_bindings

    (restarted_id,) = after
    sessions = httpx.get(f"{lab.base}/api/sessions", params={"token": lab.token}, timeout=10).json()
    (session,) = sessions
    bound = wait_for(lambda: [(b.notebook, b.sandbox_id) for b, _, held in all_bindings(lab.root.parent / "state")
                              if held], 30, interval=0.5)
    assert bound == [(str(lab.root / session["path"]), restarted_id)], bound
