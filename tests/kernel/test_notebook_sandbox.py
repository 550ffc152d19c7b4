"""A notebook keeps its sandbox across kernels (kernel/keeping.py, kernel/binding.py), through
jupyter_client as Jupyter Server drives it: a kernel started with JPY_SESSION_NAME, shut
down, and a new kernel on the same notebook; Restart kernel; two kernels on one notebook."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import typing as t

import pytest
from support import run_cell, wait_for

from sandbox.client import Sandbox, SandboxGone, SandboxNotFound

from test_kernel import live_ids, sandbox_id, wait_gone

pytestmark = pytest.mark.slow


@pytest.fixture
def notebook(start_kernel, tmp_path, kernel_env):
    """start(name="a.ipynb", **env) -> (km, kc): a kernel for that notebook, as Jupyter
    Server starts it (JPY_SESSION_NAME), with a state directory of the test's own. After the
    test, the sandboxes its notebooks kept are deleted: nothing stays on the shared server."""
    from kernel.binding import all_bindings

    state = tmp_path / "state"

    def start(name: str = "a.ipynb", **env: str) -> tuple[t.Any, t.Any]:
        return start_kernel(cwd=tmp_path, JPY_SESSION_NAME=str(tmp_path / name), SANDBOX_KERNEL_STATE_DIR=str(state),
                            **env)

    start.state = state  # type: ignore[attr-defined]
    yield start
    for binding, _path, _held in all_bindings(state):
        try:
            sbx = connect(kernel_env, binding.sandbox_id)
        except (SandboxGone, SandboxNotFound):
            continue
        sbx.delete()
        sbx.close()


def shut_down(km: t.Any, kc: t.Any) -> None:
    """"Shut down kernel", as JupyterLab's menu and the server's culling do it."""
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def connect(env: dict[str, str], sid: str) -> Sandbox:
    return Sandbox.connect(sid, url=env["SANDBOX_KERNEL_URL"], token=env["SANDBOX_KERNEL_TOKEN"])


def test_shut_down_then_reopen_keeps_the_state(notebook, kernel_env):
    km, kc = notebook()
    assert run_cell(kc, "df = {'rows': 2_000}").status == "ok"
    sid = sandbox_id(kc)
    shut_down(km, kc)
    assert sid in live_ids(kernel_env), "shutting the kernel down keeps the notebook's sandbox"

    km, kc = notebook()
    run = run_cell(kc, "df['rows']")
    assert run.status == "ok", run.errors
    assert run.result_text() == "2000"
    note = run.notes
    assert sid in note and "still running" in note and "%sandbox new" in note
    assert len(note.strip().splitlines()) == 1, note
    assert run_cell(kc, "1").notes == "", "said once, on the first cell"
    assert sandbox_id(kc) == sid
    # Counts start at 1, as in any new kernel; the kept sandbox's IPython takes them on.
    assert run.reply["content"]["execution_count"] == 1
    n = run_cell(kc, "2").reply["content"]["execution_count"]
    assert run_cell(kc, f"Out[{n}]").result_text() == "2"


def test_restart_kernel_is_a_fresh_interpreter_and_deletes_the_old_sandbox(notebook, kernel_env):
    km, kc = notebook()
    assert run_cell(kc, "secret = 42").status == "ok"
    old = sandbox_id(kc)
    km.restart_kernel(now=False)
    kc.wait_for_ready(timeout=60)
    run = run_cell(kc, "secret", stop_on_error=False)
    assert run.reply["content"]["ename"] == "NameError"
    assert "still running" not in run.notes
    assert sandbox_id(kc) != old
    wait_gone(kernel_env, old, timeout=10)
    # ... and the new sandbox is the notebook's from now on.
    new = sandbox_id(kc)
    shut_down(km, kc)
    km, kc = notebook()
    assert sandbox_id(kc) == new


def test_another_notebook_gets_its_own_sandbox(notebook):
    km, kc = notebook("a.ipynb")
    assert run_cell(kc, "mine = 1").status == "ok"
    a = sandbox_id(kc)
    shut_down(km, kc)
    km, kc = notebook("b.ipynb")
    assert run_cell(kc, "mine", stop_on_error=False).reply["content"]["ename"] == "NameError"
    assert sandbox_id(kc) != a


def test_two_kernels_on_one_notebook_never_share(notebook, kernel_env):
    km1, kc1 = notebook()
    assert run_cell(kc1, "owner = 'first'").status == "ok"
    first = sandbox_id(kc1)
    km2, kc2 = notebook()
    run = run_cell(kc2, "owner", stop_on_error=False)
    assert run.reply["content"]["ename"] == "NameError"
    assert "another kernel" in run.notes and str(km1.provisioner.pid) in run.notes
    second = sandbox_id(kc2)
    assert second != first
    # The second kernel's sandbox is not the notebook's: deleted when it ends; the first kept.
    shut_down(km2, kc2)
    wait_gone(kernel_env, second, timeout=10)
    assert run_cell(kc1, "owner").result_text() == "'first'"


def test_a_killed_kernel_keeps_the_sandbox_and_frees_the_notebook(notebook, kernel_env):
    """Culling that ends in SIGTERM or SIGKILL, or a crash: the sandbox stays the notebook's
    (its TTL still ends it if nobody comes back), and the lease goes with the process."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        km, kc = notebook()
        assert run_cell(kc, f"n = {int(signum)}").status == "ok"
        sid = sandbox_id(kc)
        kc.stop_channels()
        os.kill(km.provisioner.pid, signum)
        wait_for(lambda: not km.is_alive(), timeout=30)
        km.cleanup_resources()
        assert sid in live_ids(kernel_env)
        km, kc = notebook()
        run = run_cell(kc, "n")
        assert run.result_text() == str(int(signum)) and sid in run.notes
        shut_down(km, kc)


def test_a_kept_sandbox_that_ended_is_said_and_replaced(notebook, kernel_env):
    km, kc = notebook(SANDBOX_KERNEL_TTL="3")
    assert run_cell(kc, "v = 1").status == "ok"
    sid = sandbox_id(kc)
    shut_down(km, kc)
    wait_gone(kernel_env, sid)
    time.sleep(1.5)
    km, kc = notebook()
    run = run_cell(kc, "v", stop_on_error=False)
    assert run.result_text() == "1", "saved by value before its TTL ended it (test_saved_state.py)"
    assert re.search(rf"the sandbox of this notebook \({sid}\) ended \d+s ago: expired \(it was not used within "
                     r"its TTL of 3 s\); this is a new one", run.notes), run.notes
    assert sandbox_id(kc) != sid


def test_the_operator_can_switch_keeping_off(notebook, kernel_env):
    km, kc = notebook(SANDBOX_KERNEL_KEEP_NOTEBOOK_SANDBOX="0")
    first = run_cell(kc, "1")
    assert "this notebook does not keep its sandbox" in first.notes, first  # said, not only logged
    sid = sandbox_id(kc)
    shut_down(km, kc)
    wait_gone(kernel_env, sid, timeout=10)
    assert not (notebook.state / "notebooks").exists() or not list((notebook.state / "notebooks").glob("*.json"))


def test_a_notebook_that_cannot_keep_its_sandbox_is_told_so(notebook, kernel_env):
    """Its binding cannot be written (here `notebooks` is a file; on a shared host it was a
    directory the user could not write): the first cell says so, and the sandbox goes with
    the kernel, as said."""
    notebook.state.mkdir()
    (notebook.state / "notebooks").write_text("not a folder")
    km, kc = notebook()
    first = run_cell(kc, "1")
    assert first.status == "ok" and "this notebook cannot keep its sandbox" in first.notes, first
    assert "is deleted when this kernel ends" in first.notes
    sid = sandbox_id(kc)
    shut_down(km, kc)
    wait_gone(kernel_env, sid, timeout=10)


def test_sandbox_magics_new_attach_list(notebook, kernel_env):
    km, kc = notebook("a.ipynb")
    assert run_cell(kc, "x = 'a'").status == "ok"
    a = sandbox_id(kc)
    run = run_cell(kc, "%sandbox new\nx = 'fresh'")
    assert run.status == "ok", run.errors
    assert f"the old one, {a}, was deleted" in run.stdout
    wait_gone(kernel_env, a, timeout=10)
    b = sandbox_id(kc)
    shut_down(km, kc)

    km, kc = notebook("c.ipynb")
    c = sandbox_id(kc)
    listing = run_cell(kc, "%sandbox list").stdout
    assert f"{b}" in listing and "a.ipynb" in listing and f"{c}" in listing and "this kernel's" in listing
    run = run_cell(kc, f"%sandbox attach {b}\nx")
    assert run.status == "ok", run.errors
    assert run.result_text() == "'fresh'"
    assert "a.ipynb" in run.stdout and c in run.stdout
    assert c in live_ids(kernel_env), "the sandbox left behind is not deleted"
    # Bad input: a readable error, the kernel's sandbox untouched.
    for bad in ("nope-does-not-exist", "../etc"):
        run = run_cell(kc, f"%sandbox attach {bad}", stop_on_error=False)
        assert run.status == "error" and "Traceback" not in "".join(run.errors[0]["traceback"])
    assert sandbox_id(kc) == b
    # A sandbox a live kernel holds is refused.
    km2, kc2 = notebook("d.ipynb")
    d = sandbox_id(kc2)
    run = run_cell(kc, f"%sandbox attach {d}", stop_on_error=False)
    assert run.reply["content"]["ename"] == "SandboxInUse"
    shut_down(km2, kc2)


def test_the_binding_file_is_private_and_a_bad_one_starts_fresh(notebook):
    km, kc = notebook()
    sid = sandbox_id(kc)
    shut_down(km, kc)
    folder = notebook.state / "notebooks"
    assert folder.stat().st_mode & 0o777 == 0o700
    [binding] = folder.glob("*.json")
    assert binding.stat().st_mode & 0o777 == 0o600
    assert json.loads(binding.read_text())["sandbox_id"] == sid
    binding.write_text(json.dumps({"notebook": json.loads(binding.read_text())["notebook"],
                                   "sandbox_id": "../../v1/sandboxes", "bound_at": 0}))
    km, kc = notebook()
    run = run_cell(kc, "1")
    assert run.status == "ok" and run.notes == ""
    assert sandbox_id(kc) != sid


def test_a_server_restart_between_kernels_keeps_the_state(notebook, sandbox_server, kernel_env):
    if sandbox_server.proc is None:
        pytest.skip("the server is not this session's to restart")
    km, kc = notebook()
    assert run_cell(kc, "kept = 7").status == "ok"
    sid = sandbox_id(kc)
    shut_down(km, kc)
    sandbox_server.terminate()
    sandbox_server.start()
    km, kc = notebook()
    run = run_cell(kc, "kept", timeout=120)
    assert run.result_text() == "7" and sid in run.notes



def test_the_server_refuses_a_sandbox_another_live_kernel_holds(start_kernel, sandbox_server, tmp_path):
    """Two kernels never share a sandbox, even where no record of either tells (a console's
    kernel keeps none; on a shared host each user's records are in their own home): over the
    socket the server knows which live kernel holds each sandbox, and refuses another's
    `%sandbox attach`. Once the holder ends, the sandbox is free."""
    sock = f"unix:{sandbox_server.state_dir / 'server.sock'}"
    km_a, kc_a = start_kernel(cwd=tmp_path, SANDBOX_KERNEL_URL=sock)
    a = sandbox_id(kc_a)
    km_b, kc_b = start_kernel(cwd=tmp_path, SANDBOX_KERNEL_URL=sock)
    b = sandbox_id(kc_b)
    run = run_cell(kc_b, f"%sandbox attach {a}")
    assert run.status == "error", run.stdout
    said = run.reply["content"]["evalue"]
    assert "in use by another live process" in said and "two kernels never share" in said, said
    assert sandbox_id(kc_b) == b
    assert run_cell(kc_a, "x = 1").status == "ok"  # the holder's sandbox is untouched
