"""The kernel's own behaviour, end to end: a real kernel process, a real server."""

from __future__ import annotations

import base64
import os
import pathlib
import re
import signal
import threading
import time
import typing as t
from queue import Empty

import pytest
import support
from support import free_port, run_cell, shell_request

from sandbox.client import Sandbox, SandboxGone, SandboxNotFound, list_sandboxes

pytestmark = pytest.mark.slow


def sandbox_id(kc: t.Any) -> str:
    run = run_cell(kc, "%sandbox")
    assert run.status == "ok", run.errors
    match = re.search(r"^sandbox\s+(\S+)$", run.stdout, re.M)
    assert match, run.stdout
    return match.group(1)


def live_ids(env: dict[str, str]) -> set[str]:
    return {s.id for s in list_sandboxes(url=env["SANDBOX_KERNEL_URL"], token=env["SANDBOX_KERNEL_TOKEN"])}


def wait_gone(env: dict[str, str], sid: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            Sandbox.connect(sid, url=env["SANDBOX_KERNEL_URL"], token=env["SANDBOX_KERNEL_TOKEN"]).close()
        except (SandboxGone, SandboxNotFound):
            return
        time.sleep(0.5)
    raise AssertionError(f"sandbox {sid} still alive after {timeout} s")


# --------------------------------------------------------------------------- protocol


def test_kernel_info(kc):
    info = shell_request(kc, "kernel_info")
    assert info["implementation"] == "sandbox"
    lang = info["language_info"]
    assert lang["name"] == "python"
    assert lang["mimetype"] == "text/x-python"
    assert lang["file_extension"] == ".py"
    assert lang["pygments_lexer"] == "ipython3"
    assert lang["codemirror_mode"] == {"name": "ipython", "version": 3}
    assert "sandbox" in info["banner"]
    # Subshells would run cells concurrently against one sandbox, which runs one at a time:
    # the kernel has no shell-channel thread and must not offer them.
    assert "kernel subshells" not in info.get("supported_features", [])
    # Nor a debugger: the cells run in the sandbox (asking debugpy would also print its
    # "frozen modules" lines into lab's terminal; tests/cli/test_lab_terminal.py).
    assert "debugger" not in info["supported_features"]


def test_state_survives_between_cells(kc):
    assert run_cell(kc, "x = 20").status == "ok"
    assert run_cell(kc, "x * 2 + 2").result_text() == "42"


def test_failing_cell_sends_exactly_one_error_and_status_error(kc):
    run = run_cell(kc, "y = 1\n1/0", stop_on_error=False)
    assert run.status == "error"
    assert run.reply["content"]["ename"] == "ZeroDivisionError"
    assert [e["ename"] for e in run.errors] == ["ZeroDivisionError"]
    assert run.errors[0]["traceback"], "the sandbox's traceback is passed on"
    # The kernel is fine and the state before the error is kept.
    assert run_cell(kc, "y").result_text() == "1"


def test_silent_execution_publishes_nothing(kc):
    run = run_cell(kc, "print('loud'); z = 5; z", silent=True)
    assert run.status == "ok"
    assert run.outputs == []
    failing = run_cell(kc, "print('loud'); 1/0", silent=True)
    assert failing.status == "error"
    assert failing.outputs == []
    # Silent code did run.
    assert run_cell(kc, "z").result_text() == "5"


def test_a_cell_of_magics_only_takes_its_own_number(kc):
    first = run_cell(kc, "%sandbox")
    host = run_cell(kc, "%%host\n'on the host'")
    second = run_cell(kc, "1 + 1")
    counts = [run.reply["content"]["execution_count"] for run in (first, host, second)]
    assert [run.status for run in (first, host, second)] == ["ok"] * 3
    assert counts == [1, 2, 3], counts
    assert host.of_type("execute_result")[0]["content"]["execution_count"] == 2
    assert second.of_type("execute_result")[0]["content"]["execution_count"] == 3
    # The sandbox's IPython numbers the cell as the notebook does.
    assert run_cell(kc, "Out[3], _3").result_text() == "(2, 2)"


def test_execution_counts_follow_ipython(kc):
    first = run_cell(kc, "1")
    second = run_cell(kc, "2")
    n1 = first.reply["content"]["execution_count"]
    n2 = second.reply["content"]["execution_count"]
    assert n2 == n1 + 1
    assert first.of_type("execute_result")[0]["content"]["execution_count"] == n1
    run_cell(kc, "3", store_history=False)
    assert run_cell(kc, "4").reply["content"]["execution_count"] == n2 + 1


def test_output_streams_while_the_cell_runs(kc):
    run = run_cell(kc, "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.7)")
    assert run.status == "ok"
    assert run.stdout.split() == ["0", "1", "2"]
    stamps = [m["header"]["date"] for m in run.of_type("stream")]
    reply_at = run.reply["header"]["date"]
    # The first line was published well before the cell ended, not batched at the end.
    assert (reply_at - stamps[0]).total_seconds() > 1.0


def test_active_outputs_reach_the_page_only_in_isolated_frames(kc):
    """What the sandbox displays goes through the output policy (kernel/output_policy.py):
    HTML becomes a sandboxed frame, metadata loses `trusted`, unknown types are withheld,
    text/plain stays as IPython made it."""
    code = (
        "from IPython.display import display, HTML, Javascript\n"
        "display(HTML('<script>top.owned = 1</script>'), metadata={'trusted': True, 'isolated': False})\n"
        "display(Javascript('top.owned = 2'))\n"
        "display({'application/vnd.test+json': {'a': 1}, 'text/plain': 'plain'}, raw=True,"
        " metadata={'application/vnd.test+json': {'m': 2}})"
    )
    run = run_cell(kc, code)
    assert run.status == "ok", run.errors
    # (the first cell of a kernel may also show "creating the sandbox …" progress)
    shown = [m for m in run.of_type("display_data") if "sandbox-startup" not in str(m["content"]["transient"])]
    html_msg, js_msg, vnd_msg = shown[-3:]
    for msg, payload in ((html_msg, "top.owned = 1"), (js_msg, "top.owned = 2")):
        shown = msg["content"]["data"]["text/html"]
        assert shown.startswith('<iframe class="sandbox-output" sandbox="allow-scripts" '), shown[:200]
        assert payload not in shown.split('srcdoc="')[0], "the payload is only inside the frame's document"
        assert msg["content"]["metadata"] == {}
    assert "application/javascript" not in js_msg["content"]["data"]
    assert html_msg["content"]["data"]["text/plain"] == "<IPython.core.display.HTML object>"
    assert vnd_msg["content"]["data"] == {"text/plain": "plain"}
    assert vnd_msg["content"]["metadata"] == {}


def test_pass_through_when_the_user_opts_in(start_kernel):
    km, kc = start_kernel(SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS="1")
    code = (
        "from IPython.display import display\n"
        "display({'application/vnd.test+json': {'a': 1}, 'text/plain': 'plain'}, raw=True,"
        " metadata={'application/vnd.test+json': {'m': 2}})"
    )
    run = run_cell(kc, code)
    (msg,) = [m for m in run.of_type("display_data") if "application/vnd.test+json" in m["content"]["data"]]
    assert msg["content"]["data"]["application/vnd.test+json"] == {"a": 1}
    assert msg["content"]["metadata"] == {"application/vnd.test+json": {"m": 2}}
    assert "UNFILTERED" in run_cell(kc, "%sandbox").stdout


def test_update_display_data_keeps_display_id(kc):
    code = (
        "from IPython.display import display, update_display\n"
        "display('one', display_id='d1')\n"
        "update_display('two', display_id='d1')"
    )
    run = run_cell(kc, code)

    def with_id(msg_type: str) -> list[dict]:
        return [m for m in run.of_type(msg_type) if m["content"].get("transient", {}).get("display_id") == "d1"]

    (shown,) = with_id("display_data")
    (updated,) = with_id("update_display_data")
    assert shown["content"]["data"]["text/plain"] == "'one'"
    assert updated["content"]["data"]["text/plain"] == "'two'"


def test_clear_output_is_forwarded(kc):
    run = run_cell(kc, "print('a')\nfrom IPython.display import clear_output\nclear_output(wait=True)\nprint('b')")
    assert {"wait": True} in [m["content"] for m in run.of_type("clear_output")]


def test_matplotlib_figure_becomes_png(kc):
    run = run_cell(kc, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()", timeout=120)
    assert run.status == "ok", run.errors
    pngs = [m for m in run.of_type("display_data") if "image/png" in m["content"]["data"]]
    assert pngs
    assert base64.b64decode(pngs[0]["content"]["data"]["image/png"]).startswith(b"\x89PNG")


def test_ipython_magics_other_than_ours_run_in_the_sandbox(kc):
    run = run_cell(kc, "%%capture captured\nprint('inside')")
    assert run.status == "ok", run.errors
    assert run_cell(kc, "captured.stdout").result_text() == "'inside\\n'"


def test_completion_and_inspection_use_the_sandbox_state(kc):
    run_cell(kc, "my_distinctive_variable = 3")
    reply = shell_request(kc, "complete", "my_distinct")
    assert "my_distinctive_variable" in reply["matches"]
    reply = shell_request(kc, "complete", "import os\nos.pa")
    assert "os.path" in reply["matches"] or "path" in reply["matches"]
    reply = shell_request(kc, "inspect", "len")
    assert reply["found"]
    assert "text/plain" in reply["data"]


def test_completion_offers_our_magics(kc):
    reply = shell_request(kc, "complete", "%pu")
    assert {"%push", "%pull"} <= set(reply["matches"])


# --------------------------------------------------------------------------- interrupt


def wait_for_stdout(kc: t.Any, msg_id: str, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except Empty:
            continue
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "stream"
            and text in msg["content"]["text"]
        ):
            return
    raise AssertionError(f"{text!r} never printed")


def test_interrupt_stops_the_cell_and_keeps_state(kernel):
    km, kc = kernel
    assert run_cell(kc, "x = 1").status == "ok"
    msg_id = kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)", stop_on_error=False)
    wait_for_stdout(kc, msg_id, "sleeping")
    began = time.monotonic()
    km.interrupt_kernel()
    while True:
        reply = kc.get_shell_msg(timeout=10)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    elapsed = time.monotonic() - began
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    # The cell sleeps 60 s: a reply well before that is the interrupt's, not the cell ending on its own
    # (how fast an interrupt lands is bench's to measure; a loaded host took 2-8 s here).
    assert elapsed < 30, f"interrupt took {elapsed:.1f} s"
    assert run_cell(kc, "x").result_text() == "1"


def wait_for_display(kc: t.Any, msg_id: str, timeout: float = 60) -> dict[str, t.Any]:
    """The first display_data of a request (the kernel's own progress displays)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "display_data":
            return msg["content"]
    raise AssertionError(f"no display within {timeout} s")


def shell_reply(kc: t.Any, msg_id: str, timeout: float) -> dict[str, t.Any] | None:
    """The request's reply, or None if none came within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        except Empty:
            return None
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]
    return None


def test_interrupt_while_the_cell_waits_for_the_server_gives_keyboardinterrupt(start_kernel, spawn_server, tmp_path):
    """While a cell waits for its sandbox to be created, or for an upload, no code runs
    in a sandbox, so there is nothing to interrupt there: the kernel cancels its own part
    of the cell (the fallback cancel). The server is stopped (SIGSTOP) so that the cell
    really waits; the KeyboardInterrupt must come while it still is, and the kernel must
    work as usual once the server goes on."""
    server = spawn_server()
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 64)

    def interrupted_while_stopped(km: t.Any, kc: t.Any, code: str) -> None:
        os.kill(server.proc.pid, signal.SIGSTOP)  # (again, for the first cell: see below)
        try:
            msg_id = kc.execute(code, stop_on_error=False)
            # a progress display: the cell is waiting (for the sandbox, for the upload)
            wait_for_display(kc, msg_id)
            km.interrupt_kernel()
            reply = shell_reply(kc, msg_id, timeout=30)
            assert reply is not None, "no reply to the interrupted cell while the server was stopped"
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)

    # Stopped before the kernel starts: the kernel claims its sandbox as it starts, and a
    # quick server (a warm pool, a pinned root already built) had it ready before the first
    # cell, which then waited for an execute instead of the creation (no progress display).
    os.kill(server.proc.pid, signal.SIGSTOP)
    km, kc = start_kernel(cwd=tmp_path, **server.env)
    interrupted_while_stopped(km, kc, "x = 41")  # the sandbox is still being created
    assert run_cell(kc, "x = 41\nx + 1", timeout=120).result_text() == "42"
    interrupted_while_stopped(km, kc, "%push big.bin")  # the upload is under way
    run = run_cell(kc, "import os\nx, os.path.exists('big.bin')", timeout=60)
    assert run.status == "ok" and run.result_text() == "(41, False)", (run.errors, run.result_text())


# --------------------------------------------------------------------------- lifecycle


def test_shutdown_deletes_the_sandbox(start_kernel, kernel_env):
    km, kc = start_kernel()
    sid = sandbox_id(kc)
    assert sid in live_ids(kernel_env)
    kc.stop_channels()
    km.shutdown_kernel(now=False)
    assert sid not in live_ids(kernel_env)
    with pytest.raises((SandboxGone, SandboxNotFound)):
        Sandbox.connect(sid, url=kernel_env["SANDBOX_KERNEL_URL"], token=kernel_env["SANDBOX_KERNEL_TOKEN"])


def test_shutdown_before_any_cell_still_deletes_the_sandbox(start_kernel, kernel_env):
    km, kc = start_kernel()
    pid = km.provisioner.pid

    def ours() -> set[str]:
        sandboxes = list_sandboxes(url=kernel_env["SANDBOX_KERNEL_URL"], token=kernel_env["SANDBOX_KERNEL_TOKEN"])
        return {s.id for s in sandboxes if s.metadata.get("kernel_pid") == pid}

    deadline = time.monotonic() + 60
    while not ours():
        assert time.monotonic() < deadline, "the kernel did not create its sandbox at start"
        time.sleep(0.2)
    created = ours()
    kc.stop_channels()
    km.shutdown_kernel(now=False)
    assert not created & live_ids(kernel_env)


def test_restart_gives_a_fresh_sandbox(kernel, kernel_env):
    km, kc = kernel
    assert run_cell(kc, "secret = 42").status == "ok"
    old = sandbox_id(kc)
    km.restart_kernel(now=False)
    kc.wait_for_ready(timeout=60)
    run = run_cell(kc, "secret", stop_on_error=False)
    assert run.status == "error"
    assert run.reply["content"]["ename"] == "NameError"
    assert sandbox_id(kc) != old
    assert old not in live_ids(kernel_env)


def test_expired_sandbox_is_explained_and_the_cell_runs_in_a_new_one(start_kernel, kernel_env, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    km, kc = start_kernel(cwd=tmp_path, SANDBOX_KERNEL_TTL="3")
    assert run_cell(kc, "%push notes.txt\nv = 1").status == "ok"
    old = sandbox_id(kc)
    wait_gone(kernel_env, old)
    run = run_cell(kc, "print('after')\nv", stop_on_error=False)
    notice = run.notes
    assert run.stderr == "", "a note is not an error: never on stderr"
    assert old in notice
    assert "expired" in notice.lower()
    assert "variables" in notice.lower()
    assert "notes.txt" in notice
    assert "after" in run.stdout, "the cell ran in the new sandbox"
    assert run.reply["content"]["ename"] == "NameError", "the old variables are gone"
    assert sandbox_id(kc) != old
    # Said once, not on every cell.
    again = run_cell(kc, "1")
    assert again.notes == "" and again.stderr == ""


def test_sandbox_that_died_is_replaced_at_the_next_cell(kc, kernel_env):
    old = sandbox_id(kc)
    run = run_cell(kc, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", timeout=120, stop_on_error=False)
    assert run.status == "error"
    assert len(run.errors) == 1
    nxt = run_cell(kc, "print('alive')")
    assert nxt.status == "ok", nxt.errors
    assert "alive" in nxt.stdout
    assert old in nxt.notes and "new sandbox" in nxt.notes
    assert sandbox_id(kc) != old


def test_sandbox_deleted_behind_the_kernels_back(kc, kernel_env):
    old = sandbox_id(kc)
    sbx = Sandbox(old, url=kernel_env["SANDBOX_KERNEL_URL"], token=kernel_env["SANDBOX_KERNEL_TOKEN"])
    sbx.delete()
    sbx.close()
    run = run_cell(kc, "print('still works')")
    assert run.status == "ok", run.errors
    assert "still works" in run.stdout
    assert old in run.notes and "deleted" in run.notes.lower()


def test_unreachable_server_gives_a_short_readable_error(start_kernel):
    port = free_port()
    km, kc = start_kernel(SANDBOX_KERNEL_URL=f"http://127.0.0.1:{port}", SANDBOX_KERNEL_RECONNECT_TIMEOUT="2")
    began = time.monotonic()
    run = run_cell(kc, "print(1)", timeout=60, stop_on_error=False)
    assert time.monotonic() - began < 30
    assert run.status == "error"
    assert run.reply["content"]["ename"] == "ServerUnavailable"
    assert "sandbox-kernel serve" in run.reply["content"]["evalue"]
    assert len(run.errors) == 1
    traceback = "\n".join(run.errors[0]["traceback"])
    assert "Traceback" not in traceback and 'File "' not in traceback
    assert "unreachable, retrying" in run.notes
    # The kernel itself is still alive and answers.
    assert km.is_alive()
    assert run_cell(kc, "print(2)", timeout=60, stop_on_error=False).status == "error"


def test_server_restart_mid_session_keeps_the_sandbox(kc, sandbox_server):
    if sandbox_server.proc is None:
        pytest.skip("the server is not this session's to restart")
    assert run_cell(kc, "kept = 7").status == "ok"
    sandbox_server.terminate()
    restart = threading.Timer(3.0, sandbox_server.start)
    restart.start()
    try:
        run = run_cell(kc, "kept", timeout=120)
    finally:
        restart.join()
    assert "unreachable, retrying" in run.notes
    assert run.status == "ok", run.errors
    assert run.result_text() == "7", "the sandbox outlived the server and the kernel found it again"


# --------------------------------------------------------------------------- airlock


def test_push_and_pull_round_trip(start_kernel, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("x,y\n1,2\n")
    (data / "b.csv").write_text("x,y\n3,4\n")
    (data / "skip.txt").write_text("not a csv")
    big = os.urandom(6 * 1024 * 1024)
    (tmp_path / "big.bin").write_bytes(big)
    km, kc = start_kernel(cwd=tmp_path)

    run = run_cell(
        kc,
        "%push data/*.csv\n%push big.bin blobs/\nimport os\n"
        "sorted(os.listdir('/workspace/data')), os.path.getsize('/workspace/blobs/big.bin')",
        timeout=120,
    )
    assert run.status == "ok", run.errors
    assert run.result_text() == f"(['a.csv', 'b.csv'], {len(big)})"
    assert "pushed data/a.csv → /workspace/data/a.csv" in run.stdout
    assert "pushed big.bin → /workspace/blobs/big.bin" in run.stdout
    # The big file drew a progress bar that updated in place and ended full.
    bars = run.of_type("update_display_data")
    assert bars, "no progress bar for a 6 MiB upload"
    assert "100%" in bars[-1]["content"]["data"]["text/plain"]

    run = run_cell(
        kc,
        "os.makedirs('/workspace/out', exist_ok=True)\n"
        "open('/workspace/out/result.txt', 'w').write(open('/workspace/data/a.csv').read().upper())",
    )
    assert run.status == "ok", run.errors
    run = run_cell(kc, "%pull out/result.txt\n%pull blobs/big.bin copies/\n%pull data/*.csv fetched/", timeout=120)
    assert run.status == "ok", run.errors
    assert (tmp_path / "out" / "result.txt").read_text() == "X,Y\n1,2\n"
    assert (tmp_path / "copies" / "big.bin").read_bytes() == big
    assert sorted(p.name for p in (tmp_path / "fetched").iterdir()) == ["a.csv", "b.csv"]
    assert "pulled /workspace/out/result.txt → out/result.txt" in run.stdout


def test_pull_with_a_glob_copes_with_names_that_are_not_text(start_kernel, tmp_path):
    """The sandbox names its files: bytes that are not UTF-8 and a backslash must not break
    %pull's listing; such a file lands under its escaped spelling (listed by GET /files)."""
    km, kc = start_kernel(cwd=tmp_path)
    run = run_cell(kc, "import os\nos.makedirs('/workspace/odd', exist_ok=True)\n"
                       "for name in (b'bad-\\xff-name.txt', b'back\\\\slash.txt', b'plain.txt'):\n"
                       "    open(b'/workspace/odd/' + name, 'wb').write(b'from ' + name)")
    assert run.status == "ok", run.errors
    run = run_cell(kc, "%pull odd/*.txt fetched/", timeout=120)
    assert run.status == "ok", (run.errors, run.stdout)
    fetched = {p.name: p.read_bytes() for p in (tmp_path / "fetched").iterdir()}
    assert fetched == {"bad-\\xff-name.txt": b"from bad-\xff-name.txt", "back\\\\slash.txt": b"from back\\slash.txt",
                       "plain.txt": b"from plain.txt"}, fetched
    assert "3 files" in run.stdout


def test_pull_of_sparse_files_is_bounded_by_their_apparent_size(start_kernel, tmp_path):
    """Red team: sparse files use nothing of the sandbox's quota, but %pull would write every
    byte of their apparent size to the host. With SANDBOX_KERNEL_PULL_MAX_BYTES at 8 MiB, a
    glob over three 5 MiB sparse files is refused before anything is written, and one such
    file (under the cap) is pulled whole; a 1 GB one is refused by the server (its apparent
    size is over file_max_bytes). Control: the same glob with the default cap (1 GiB) writes
    all 15 MiB, so the probe would notice a cap that stopped counting."""
    km, kc = start_kernel(cwd=tmp_path, SANDBOX_KERNEL_PULL_MAX_BYTES=str(8 << 20))
    make = ("import os\nos.makedirs('/workspace/sparse', exist_ok=True)\n"
            "for i in range(3):\n    open(f'/workspace/sparse/z{i}.bin', 'wb').truncate(5 << 20)\n"
            "open('/workspace/huge.bin', 'wb').truncate(1 << 30)")
    assert run_cell(kc, make, timeout=180).status == "ok"
    run = run_cell(kc, "%pull sparse/*.bin got/", timeout=120)
    assert run.status == "error" and "pull_max_bytes" in run.errors[0]["evalue"], (run.errors, run.stdout)
    assert "nothing was written" in run.errors[0]["evalue"] and not (tmp_path / "got").exists()
    run = run_cell(kc, "%pull huge.bin", timeout=120)
    assert run.status == "error" and "1073741824 bytes" in run.errors[0]["evalue"], run.errors
    assert not (tmp_path / "huge.bin").exists() and not list(tmp_path.glob(".huge.bin*"))
    run = run_cell(kc, "%pull sparse/z0.bin one/", timeout=120)
    assert run.status == "ok" and (tmp_path / "one" / "z0.bin").stat().st_size == 5 << 20, run.errors
    # Control: the default cap lets the glob through, and 15 MiB of zeros land on the host.
    km, kc = start_kernel(cwd=tmp_path / "one")
    assert run_cell(kc, make, timeout=180).status == "ok"
    run = run_cell(kc, "%pull sparse/*.bin all/", timeout=120)
    assert run.status == "ok", run.errors
    assert sum(p.stat().st_size for p in (tmp_path / "one" / "all").iterdir()) == 15 << 20


def test_push_of_a_missing_file_fails_the_cell_before_its_code(kc):
    run = run_cell(kc, "%push no-such-file.csv\nprint('should not run')")
    assert run.status == "error"
    assert run.reply["content"]["ename"] == "FileNotFoundError"
    assert len(run.errors) == 1
    assert "should not run" not in run.stdout


def test_pull_of_a_missing_file_fails_readably(kc, tmp_path):
    run = run_cell(kc, "%pull nothing/here.txt")
    assert run.status == "error"
    assert run.reply["content"]["ename"] == "FileNotFoundError"
    assert "Traceback" not in "".join(run.errors[0]["traceback"])


def test_airlock_stays_in_the_notebooks_folder_with_host_cells_off(start_kernel, tmp_path):
    """The attacks of issue 13, through a real kernel and sandbox: with host cells off a cell
    can neither write outside the folder (absolute path, '..', a planted symlink) nor read
    a host file through a symlink, and existing files are replaced only with --force."""
    folder = tmp_path / "nb"
    folder.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    secret.chmod(0o600)
    (folder / "stolen.txt").symlink_to(secret)
    (folder / "notes.txt").symlink_to(tmp_path / "planted.txt")
    (folder / "kept.txt").write_text("mine")
    km, kc = start_kernel(cwd=folder, SANDBOX_KERNEL_HOST_CELLS="0")
    assert run_cell(kc, "open('/workspace/payload.py', 'w').write('evil')").status == "ok"

    attempts = {
        f"%pull payload.py {tmp_path}/abs.py": "absolute paths are not allowed",
        "%pull payload.py ../dotdot.py": "'..' is not allowed",
        "%pull payload.py notes.txt": "symlink",
        "%pull payload.py sitecustomize.py": "--allow-code",
        "%pull payload.py kept.txt": "--force",
        "%push stolen.txt": "symlink",
        f"%push {secret}": "absolute paths are not allowed",
    }
    for line, why in attempts.items():
        run = run_cell(kc, line, stop_on_error=False)
        assert run.status == "error", line
        assert why in run.reply["content"]["evalue"], (line, run.reply["content"]["evalue"])
        assert "Traceback" not in "".join(run.errors[0]["traceback"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb", "secret.txt"], "nothing written outside the folder"
    assert (folder / "kept.txt").read_text() == "mine"
    assert run_cell(kc, "import os; os.listdir('/workspace')").result_text() == "['payload.py']"

    run = run_cell(kc, "%pull --force payload.py kept.txt")
    assert run.status == "ok", run.errors
    assert (folder / "kept.txt").read_text() == "evil"


def test_sandbox_magic_shows_status_limits_and_isolation(kc):
    run = run_cell(kc, "%sandbox")
    assert run.status == "ok"
    for label in ("sandbox", "state", "image", "TTL", "limits", "isolation", "airlock", "outputs", "server"):
        assert re.search(rf"^{label}\s", run.stdout, re.M), f"{label} missing:\n{run.stdout}"
    assert "running" in run.stdout
    assert "memory" in run.stdout


def test_ttl_shows_and_renews(kc, kernel_env):
    run = run_cell(kc, "%ttl")
    assert run.status == "ok"
    assert "left" in run.stdout
    sid = sandbox_id(kc)

    def info():
        return Sandbox.connect(sid, url=kernel_env["SANDBOX_KERNEL_URL"], token=kernel_env["SANDBOX_KERNEL_TOKEN"]).info

    ttl = info().ttl_seconds
    # extend: expiry pushed far out once; the TTL each cell renews to is unchanged, and a
    # later cell does not pull expiry back in.
    run = run_cell(kc, f"%ttl extend {ttl + 7200}")
    assert run.status == "ok", run.errors
    assert "extended once" in run.stdout and "each cell still renews to" in run.stdout, run.stdout
    assert run_cell(kc, "1").status == "ok"
    now = info()
    assert now.ttl_seconds == ttl and now.ttl_left() > ttl + 7000, now
    # set: the sliding TTL itself changes, and the extension is dropped.
    run = run_cell(kc, "%ttl set 120")
    assert run.status == "ok", run.errors
    assert "TTL set to 2m 00s" in run.stdout and "every later cell" in run.stdout, run.stdout
    now = info()
    assert now.ttl_seconds == 120 and 60 < now.ttl_left() <= 121, now
    # renew N: what it always meant (sets the TTL), and it says so
    run = run_cell(kc, "%ttl renew 300")
    assert "TTL set to 5m 00s" in run.stdout and "%ttl extend" in run.stdout, run.stdout
    assert info().ttl_seconds == 300
    assert run_cell(kc, "%ttl extend").status == "error"


def test_magic_lines_then_code_in_one_cell_keep_line_numbers(kc):
    run = run_cell(kc, "%ttl\n\n1/0")
    assert run.status == "error"
    tb = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(run.errors[0]["traceback"]))
    assert "line 3" in tb, tb


# --------------------------------------------------------------------------- notebooks


def execute_notebook(nb: t.Any, folder: pathlib.Path) -> None:
    """nbclient's run of `nb` with kernel "sandbox" in `folder`, the kernel's stderr kept.

    The kernel's channels are Unix sockets (`support.kernel_manager`), so no other process
    can take a port between jupyter_client's choice and the kernel's bind; a kernel that
    dies before its kernel_info reply fails with its own last words in the message.
    """
    from nbclient import NotebookClient

    log = folder / "kernel-stderr.txt"
    km = support.kernel_manager("sandbox")  # nbclient shuts down only a kernel manager it made
    with open(log, "wb") as stderr:
        try:
            NotebookClient(nb, km=km, timeout=120, resources={"metadata": {"path": str(folder)}}).execute(stderr=stderr)
        except RuntimeError as e:
            if "Kernel died" not in str(e):
                raise
            raise AssertionError(f"the kernel died at start; its stderr:\n{log.read_text(errors='replace')[-4000:]}") from e
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=False)


def test_nbclient_runs_a_notebook(kernel_env, tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import math\nvalue = math.sqrt(16)\nvalue"),
        nbformat.v4.new_code_cell("print('value is', value)"),
        nbformat.v4.new_code_cell("from IPython.display import HTML\nHTML('<i>ok</i>')"),
    ]
    execute_notebook(nb, tmp_path)
    assert nb.cells[0].outputs[0]["data"]["text/plain"] == "4.0"
    assert "".join(o.get("text", "") for o in nb.cells[1].outputs) == "value is 4.0\n"
    # HTML from the sandbox reaches the notebook only inside a frame with an opaque origin,
    # its document escaped into srcdoc (kernel/frames.py); text/plain is unchanged.
    html = nb.cells[2].outputs[0]["data"]["text/html"]
    assert html.startswith("<iframe") and 'sandbox="allow-scripts"' in html, html[:300]
    assert "allow-same-origin" not in html and "&lt;i&gt;ok&lt;/i&gt;" in html, html[:300]
    assert [c.execution_count for c in nb.cells] == [1, 2, 3]


def test_nbclient_stops_at_a_failing_cell(kernel_env, tmp_path):
    import nbformat
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("1/0"), nbformat.v4.new_code_cell("print('never')")]
    with pytest.raises(CellExecutionError, match="ZeroDivisionError"):
        execute_notebook(nb, tmp_path)
    assert nb.cells[1].outputs == []


def test_host_cells_run_on_the_host_in_their_own_namespace(kc):
    """%%host runs in the kernel process: it sees the host (not /workspace), keeps its own
    variables, streams a line per message, and reports its errors like any cell."""
    run_cell(kc, "inside = 'sandbox'")
    first = run_cell(kc, "%%host\nimport os\nkept = 41\nprint('on', 'host', os.path.exists('/workspace'))\nkept + 1")
    assert first.status == "ok", first.errors
    streams = [m["content"]["text"] for m in first.of_type("stream")]
    assert streams == ["on host False\n"]
    assert first.of_type("execute_result")[0]["content"]["data"]["text/plain"] == "42"
    second = run_cell(kc, "%%host\nprint(kept, 'inside' in globals())")
    assert second.stdout == "41 False\n"
    failing = run_cell(kc, "%%host\n1/0", stop_on_error=False)
    assert failing.status == "error"
    assert [e["ename"] for e in failing.errors] == ["ZeroDivisionError"]
    assert run_cell(kc, "inside").result_text() == "'sandbox'"


def test_host_cells_can_be_switched_off(start_kernel):
    km, kc = start_kernel(SANDBOX_KERNEL_HOST_CELLS="0")
    run = run_cell(kc, "%%host\nprint('should not run')", stop_on_error=False)
    assert run.status == "error"
    assert [e["ename"] for e in run.errors] == ["HostCellsDisabled"]
    assert "should not run" not in run.stdout
