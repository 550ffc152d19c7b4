"""An ordinary user's notebook comes back after its sandbox ended, seen in the browser.

A real Unix account (``useradd``) runs JupyterLab (``sandbox-kernel lab``, from a venv of
Debian's /usr/bin/python3 with the project and its ``lab`` extra: /root's interpreter is not
theirs to run); its kernel starts the user's own embedded server on the bwrap tier (no
root, no gVisor). In Chromium the user sets ``df`` and shuts the kernel down (keeping the
notebook's sandbox); the sandbox's TTL ends it, and the server saves its variables by value
first. Reopened, the notebook's first cell has ``df`` back and says where it came from.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import tempfile
import typing as t

import httpx
import pytest

import support
from test_browser_jupyterlab import MISSING, Notebook, chromium_page
from tests.multiuser.test_multiuser import _skip_unless_possible, installed_for_every_user, seed_images, stop_users_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(MISSING is not None, reason=f"browser test prerequisite missing: {MISSING}"),
    pytest.mark.bwrap_only("an ordinary user's server has the bwrap tier only"),
]

TTL = 20  # seconds: long enough for the cells below, short for the wait after the shutdown
NOTEBOOK = "analysis.ipynb"


@pytest.fixture(scope="module")
def user() -> t.Iterator[str]:
    """A fresh unprivileged account with a private home, removed afterwards."""
    _skip_unless_possible()
    name = f"sbkl{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        pathlib.Path(os.path.expanduser(f"~{name}")).chmod(0o700)
        yield name
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "--remove", name], capture_output=True)


@pytest.fixture(scope="module")
def lab_venv() -> t.Iterator[pathlib.Path]:
    """The project with its ``lab`` extra, installed for every user."""
    with installed_for_every_user("sbk-labvenv-", "[lab]") as root:
        yield root / "venv"


def write_notebook(path: pathlib.Path, owner: str) -> None:
    """An empty notebook on the sandbox kernel, as the launcher would have saved it."""
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": ""} for i in range(3)],
        "metadata": {"kernelspec": {"name": "sandbox", "display_name": "Python (sandbox)", "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5}))
    subprocess.run(["chown", f"{owner}:", str(path)], check=True)


class UsersLab:
    """``sandbox-kernel lab`` run by ``user`` (runuser), in a folder of theirs."""

    def __init__(self, user: str, venv: pathlib.Path, home: pathlib.Path):
        self.root = home / "notebooks"
        self.root.mkdir()
        subprocess.run(["chown", f"{user}:", str(self.root)], check=True)
        self.port, self.token = support.free_port(), secrets.token_hex(16)
        self.log = home / "lab.log"
        env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(home), "SANDBOX_KERNEL_TTL": str(TTL)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [shutil.which("runuser"), "-u", user, "--", str(venv / "bin/sandbox-kernel"), "lab", "--port", str(self.port),
                 str(self.root), f"--ServerApp.token={self.token}", "--ServerApp.password=",
                 "--ServerApp.open_browser=False", "--LabApp.news_url=None"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=str(self.root), env=env)
        ready = support.wait_for(lambda: self.answers() or self.proc.poll() is not None, 300, interval=0.5)
        assert ready and self.proc.poll() is None, self.tail()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, method: str, path: str) -> httpx.Response:
        return httpx.request(method, f"{self.base}{path}", params={"token": self.token}, timeout=60)

    def answers(self) -> bool:
        try:
            return self.api("GET", "/api/kernelspecs").status_code == 200
        except httpx.HTTPError:
            return False

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # runuser passes it on
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def open_notebook(page: t.Any, lab: UsersLab) -> Notebook:
    page.goto(f"{lab.base}/lab/tree/{NOTEBOOK}?token={lab.token}", wait_until="domcontentloaded")
    nb = Notebook(page)
    nb.panel.wait_for(state="visible", timeout=120_000)
    nb.wait_status("idle", 180_000)
    return nb


def run_cell(nb: Notebook, index: int, code: str) -> str:
    """Type and run a cell; the toolbar's Run button again if Shift+Enter left it unqueued.

    A Shift+Enter that JupyterLab's page took while its session showed no kernel yet opens
    its "Select Kernel" dialog (JupyterLab's own, whatever the kernel: the page had not
    attached it); it is answered as a user would, with the preferred kernel it offers."""
    nb.type_cell(index, code)
    prompt = nb.cells.nth(index).locator(".jp-InputPrompt").first
    if not support.wait_for(lambda: prompt.inner_text().strip() != "[ ]:", 15):
        print("Shift+Enter left the cell unqueued; the toolbar's Run button", flush=True)
        dialog = nb.page.locator(".jp-Dialog").first
        if dialog.count() and "Select Kernel" in dialog.inner_text():
            print(f"JupyterLab asked: {dialog.inner_text()!r}; its preferred kernel selected", flush=True)
            dialog.locator("button.jp-Dialog-button.jp-mod-accept").click()
            dialog.wait_for(state="detached", timeout=30_000)
        nb.cells.nth(index).click()
        nb.panel.locator('.jp-Toolbar [data-command="notebook:run-cell-and-select-next"]').first.click()
    nb.wait_done(index, 300_000)
    return nb.output_text(index)


def notes_of(nb: Notebook, index: int) -> str:
    """The text of a cell's kernel notes: each is HTML drawn in an isolated frame of its own."""
    texts = []
    for element in nb.output(index).locator("iframe").all():
        with contextlib.suppress(Exception):
            frame = element.element_handle().content_frame()
            texts.append(frame.inner_text("body", timeout=5_000) if frame is not None else "")
    return "\n".join(texts)


def saves_of(state: pathlib.Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in state.glob("saves/*/sv-*/save.json")]


def test_an_ordinary_users_notebook_comes_back_after_its_sandbox_ended(user, lab_venv, sandbox_server):
    home = pathlib.Path(os.path.expanduser(f"~{user}"))
    state = seed_images(user, sandbox_server)  # the user's own default state directory
    lab = UsersLab(user, lab_venv, home)
    write_notebook(lab.root / NOTEBOOK, user)
    try:
        # the gVisor kernelspec pip ships is not offered: an ordinary user's server has no gVisor
        specs = set(lab.api("GET", "/api/kernelspecs").json()["kernelspecs"])
        assert "sandbox" in specs and "sandbox-gvisor" not in specs, specs
        assert "not offered in JupyterLab: Python (sandbox, gVisor): " in lab.tail(), lab.tail()
        with chromium_page("ordinary-user", console=True, log_tail=lab.tail) as page:
            nb = open_notebook(page, lab)
            out = run_cell(nb, 0, "import pandas as pd\ndf = pd.DataFrame({'n': range(1000)})\nprint(int(df.n.sum()))")
            assert "499500" in out, out
            (kept,) = support.running_in(state)
            # "Shut Down Kernel" as JupyterLab's session closing does it; the sandbox is kept
            page.goto("about:blank")
            (session,) = lab.api("GET", "/api/sessions").json()
            assert lab.api("DELETE", f"/api/sessions/{session['id']}").status_code == 204
            # its TTL ends it, the server saving its variables by value first
            assert support.wait_for(lambda: not support.running_in(state), TTL * 6), support.running_in(state)
            saves = saves_of(state)
            # (a loaded host that takes past the TTL's last seconds to save may save twice)
            assert saves and {(s["source_sandbox"], s["by"]) for s in saves} == {(kept, "ttl")}, saves
            assert stat_owner(state / "saves") == user

            nb = open_notebook(page, lab)
            out = run_cell(nb, 1, "int(df.n.sum()), type(df).__name__")
            assert "(499500, 'DataFrame')" in out, out
            note = support.wait_for(lambda: "restored this notebook" in notes_of(nb, 1) and notes_of(nb, 1), 60)
            assert note, notes_of(nb, 1)
            assert f"the sandbox of this notebook ({kept}) ended" in note, note
            assert "restored this notebook's variables saved" in note and "df (pandas." in note, note
            nb.shot("ordinary-user-restored.png")
    finally:
        lab.stop()
        stop_users_server(state)


def stat_owner(path: pathlib.Path) -> str:
    import pwd

    return pwd.getpwuid(path.stat().st_uid).pw_name
