"""The Python client against a real server, each test in both flavours (the `client`
fixture: the sync client and the async one)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import pathlib
import threading
import time

import pytest

from sandbox.client import (
    AsyncSandbox,
    InvalidRequest,
    SandboxError,
    SandboxGone,
    SandboxNotFound,
    ServerUnavailable,
    Unauthorized,
    default_state_dir,
    resolve,
)


@pytest.fixture
def sbx(server, client):
    with client.Sandbox.create(url=server.url, token=server.token) as s:
        yield s


def test_health_needs_no_token(server, client):
    assert client.health(url=server.url)["status"] == "ok"


@pytest.mark.slow
def test_create_reports_the_sandbox(server, client):
    with client.Sandbox.create(ttl_seconds=600, url=server.url, token=server.token) as s:
        info = s.info
        assert info.id == s.id and s.id
        assert info.state == "running"
        assert info.ttl_seconds == 600
        assert info.created_at is not None and info.expires_at is not None
        assert info.expires_at > info.created_at
        assert 500 < info.ttl_left() <= 600
        assert info.limits.memory_mb and info.limits.memory_mb > 0
        assert info.isolation.get("backend")
        assert s.id in {i.id for i in client.list_sandboxes(url=server.url, token=server.token)}
        assert s.refresh().id == s.id


@pytest.mark.slow
def test_info_is_what_the_server_last_said(server, client):
    """One behaviour in both flavours: create and connect (both take `config=`) fill
    `info`; a bare constructor has none until `refresh()`, and says so."""
    config = resolve(url=server.url, token=server.token)
    with client.Sandbox.create(config=config) as s:
        assert s.info.id == s.id
        attached = client.Sandbox.connect(s.id, config=config)
        assert attached.info.id == s.id
        attached.close()
        bare = client.Sandbox(s.id, config=config)
        with pytest.raises(RuntimeError, match="refresh"):
            bare.info
        assert bare.refresh().state == "running" and bare.info.state == "running"
        bare.close()


def test_run_code_keeps_state_and_collects_outputs(sbx):
    first = sbx.run_code("x = 20\nprint('out')\nimport sys; print('err', file=sys.stderr)")
    assert first.ok
    assert first.stdout == "out\n"
    assert first.stderr == "err\n"
    second = sbx.run_code("x * 2 + 2")
    assert second.text == "42"
    assert second.results == [{"text/plain": "42"}]
    assert second.execution_count == first.execution_count + 1
    assert second.sandbox_state == "running"
    assert second.expires_at is not None


def test_an_exception_in_the_cell_is_data_not_a_raise(sbx):
    execution = sbx.run_code("1/0")
    assert not execution.ok
    assert execution.status == "error"
    assert execution.error.ename == "ZeroDivisionError"
    assert execution.error.traceback


@pytest.mark.slow
def test_callbacks_see_events_as_they_arrive(sbx):
    seen: list[tuple[float, str]] = []
    kinds: list[str] = []
    began = time.monotonic()
    execution = sbx.run_code(
        "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.5)\n"
        "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))\n'done'",
        on_stdout=lambda text: seen.append((time.monotonic() - began, text)),
        on_display=lambda event: kinds.append(event["type"]),
        on_result=lambda event: kinds.append("result:" + event["data"]["text/plain"]),
        on_event=lambda event: kinds.append("event:" + event["type"]),
    )
    assert "".join(text for _, text in seen).split() == ["0", "1", "2"]
    assert seen[-1][0] - seen[0][0] > 0.7, "stdout arrived in one lump at the end"
    assert "display_data" in kinds
    assert "result:'done'" in kinds
    assert kinds[-1] == "event:done"
    assert execution.display and "text/html" in execution.display[0]


def test_interrupt_from_another_thread(sbx):
    sbx.run_code("kept = 1")
    threading.Timer(1.0, sbx.interrupt).start()
    began = time.monotonic()
    execution = sbx.run_code("import time\ntime.sleep(60)")
    assert time.monotonic() - began < 5
    assert execution.error is not None and execution.error.ename == "KeyboardInterrupt"
    assert execution.reason == "interrupted"
    assert sbx.run_code("kept").text == "1"
    assert sbx.interrupt() is False, "nothing is running now"


@pytest.mark.slow
def test_timeout_interrupts_the_cell(sbx):
    execution = sbx.run_code("import time\ntime.sleep(30)", timeout_seconds=1)
    assert execution.status != "ok"
    assert execution.reason in ("timeout_interrupted", "timeout_killed")


def test_files_round_trip(sbx, tmp_path):
    assert sbx.files.write("a.txt", b"bytes")["size"] == 5
    sbx.files.write("b.txt", "text é")
    local = tmp_path / "local.bin"
    local.write_bytes(b"\x00\x01" * 1000)
    sbx.files.write("dir/c.bin", local)
    sbx.files.write("d.txt", io.BytesIO(b"file object"))
    sbx.files.write("e.txt", (chunk for chunk in [b"gen", b"erat", b"or"]))
    assert sbx.files.read("a.txt") == b"bytes"
    assert sbx.files.read("b.txt") == "text é".encode()
    assert sbx.files.read("/workspace/dir/c.bin") == local.read_bytes()
    assert sbx.files.read("d.txt") == b"file object"
    assert sbx.files.read("e.txt") == b"generator"
    listing = {f.path: f for f in sbx.files.list()}
    assert {"a.txt", "b.txt", "dir/c.bin", "d.txt", "e.txt"} <= set(listing)
    assert listing["dir/c.bin"].size == 2000
    # The code inside sees the same files.
    assert sbx.run_code("open('/workspace/e.txt').read()").text == "'generator'"
    sbx.files.delete("a.txt")
    with pytest.raises(SandboxNotFound):
        sbx.files.read("a.txt")


def test_large_upload_and_download_stream(sbx, tmp_path):
    size = 24 * 1024 * 1024
    chunk = os.urandom(1024 * 1024)
    digest = hashlib.sha256(chunk * 24).hexdigest()
    progress: list[tuple[int, int | None]] = []
    sbx.files.write("big.bin", (chunk for _ in range(24)), progress=lambda done, total: progress.append((done, total)))
    assert progress[-1][0] == size
    assert sbx.run_code(
        "import hashlib\nhashlib.sha256(open('/workspace/big.bin','rb').read()).hexdigest()"
    ).text == repr(digest)
    dest = tmp_path / "copy.bin"
    seen: list[int] = []
    assert sbx.files.download("big.bin", dest, progress=lambda done, total: seen.append(done)) == size
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == digest
    assert len(seen) > 2, "the download was not streamed in chunks"
    assert not list(tmp_path.glob(".*.part")), "temporary file left behind"


@pytest.mark.slow
@pytest.mark.parametrize("path", ["../escape.txt", "a/../../escape.txt", "/etc/passwd", "a/\x00b"])
def test_paths_outside_the_workspace_are_refused(sbx, path):
    with pytest.raises(InvalidRequest):
        sbx.files.write(path, b"x")


def test_errors_are_exceptions_with_the_servers_message(server, client):
    with pytest.raises(SandboxNotFound) as info:
        client.Sandbox.connect("sbx-does-not-exist", url=server.url, token=server.token)
    assert info.value.status == 404 and info.value.message
    with pytest.raises(Unauthorized) as info:
        client.Sandbox.create(url=server.url, token="wrong-token")
    assert info.value.status == 401
    with pytest.raises(InvalidRequest) as info:
        client.Sandbox.create(cpus="lots", url=server.url, token=server.token)  # type: ignore[arg-type]
    assert info.value.status in (400, 422)


def test_unreachable_server_says_how_to_start_one(client):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerUnavailable) as info:
        client.Sandbox.create(url=f"http://127.0.0.1:{port}", token="x")
    assert "sandbox-kernel serve" in str(info.value)
    assert info.value.sent is False


@pytest.mark.slow
def test_context_manager_deletes_and_gone_says_why(server, client):
    with client.Sandbox.create(url=server.url, token=server.token) as s:
        sid = s.id
        s.run_code("1")
    assert sid not in {i.id for i in client.list_sandboxes(url=server.url, token=server.token)}
    with pytest.raises(SandboxGone) as info:
        client.Sandbox.connect(sid, url=server.url, token=server.token)
    assert info.value.status == 410
    assert "deleted" in info.value.message
    attached = client.Sandbox(sid, url=server.url, token=server.token)
    with pytest.raises(SandboxGone):
        attached.run_code("1")
    attached.delete()  # deleting what is already gone is not an error
    attached.close()


def test_context_manager_deletes_on_error_too(server, client):
    with pytest.raises(RuntimeError):
        with client.Sandbox.create(url=server.url, token=server.token) as s:
            sid = s.id
            raise RuntimeError("boom")
    assert sid not in {i.id for i in client.list_sandboxes(url=server.url, token=server.token)}


@pytest.mark.slow
def test_renew_pushes_expiry_back(server, client):
    with client.Sandbox.create(ttl_seconds=60, url=server.url, token=server.token) as s:
        info = s.renew(300)
        assert 240 < info.ttl_left() <= 300
        assert s.info.expires_at == info.expires_at


def test_short_ttl_expires(server, client):
    s = client.Sandbox.create(ttl_seconds=2, url=server.url, token=server.token)
    try:
        deadline = time.monotonic() + 30
        while s.is_running():
            assert time.monotonic() < deadline, "a 2 s TTL sandbox still alive after 30 s"
            time.sleep(0.5)
        with pytest.raises(SandboxGone) as info:
            s.run_code("1")
        assert "expired" in info.value.message
    finally:
        s.delete()
        s.close()


@pytest.mark.slow
def test_complete_inspect_is_complete(sbx):
    sbx.run_code("distinctive_name = 1")
    assert "distinctive_name" in sbx.complete("distinct")["matches"]
    assert sbx.inspect("len", 3)["found"] is True
    assert sbx.is_complete("def f():")["status"] == "incomplete"
    assert sbx.is_complete("x = 1")["status"] == "complete"


def test_async_sandbox_has_the_same_surface(server, tmp_path):
    async def main() -> None:
        printed: list[str] = []

        async def on_stdout(text: str) -> None:
            printed.append(text)

        async with await AsyncSandbox.create(url=server.url, token=server.token) as s:
            sid = s.id
            execution = await s.run_code("y = 6\nprint('hi')\ny * 7", on_stdout=on_stdout)
            assert execution.text == "42"
            assert "".join(printed) == "hi\n"
            local = tmp_path / "up.txt"
            local.write_text("async upload")
            await s.files.write("up.txt", local)
            assert await s.files.read("up.txt") == b"async upload"
            assert [f.path for f in await s.files.list()] == ["up.txt"]
            assert (await s.is_complete("for i in x:"))["status"] == "incomplete"
            assert (await s.refresh()).state == "running"
        with pytest.raises(SandboxGone):
            await AsyncSandbox.connect(sid, url=server.url, token=server.token)

    asyncio.run(main())


def test_resolve_finds_url_and_token(tmp_path, monkeypatch):
    monkeypatch.delenv("SANDBOX_KERNEL_URL", raising=False)
    monkeypatch.delenv("SANDBOX_KERNEL_TOKEN", raising=False)
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(tmp_path))
    config = resolve()
    # The state directory's own server, on its socket: no token needed there.
    assert config.url == f"unix:{tmp_path}/server.sock" and config.socket == f"{tmp_path}/server.sock"
    assert config.token is None
    other = tmp_path / "other"
    assert resolve(state_dir=other).socket == f"{other}/server.sock"
    config = resolve(url="http://127.0.0.1:9")
    assert config.token is None and str(tmp_path / "token") in config.token_source
    (tmp_path / "token").write_text("from-file\n")
    assert resolve(url="http://127.0.0.1:9").token == "from-file"
    assert resolve(url="unix:///run/x.sock").socket == "/run/x.sock"
    with pytest.raises(InvalidRequest, match="unix:/path"):
        resolve(url="ftp://nowhere")
    monkeypatch.setenv("SANDBOX_KERNEL_TOKEN", "from-env")
    monkeypatch.setenv("SANDBOX_KERNEL_URL", "http://example.invalid:1/")
    config = resolve()
    assert config.token == "from-env" and config.url == "http://example.invalid:1"
    assert resolve(url="http://h:2", token="explicit").token == "explicit"
    assert "from-env" not in repr(config), "the token must not leak into logs via repr"


def test_default_state_dir_follows_the_server_rule(monkeypatch):
    monkeypatch.delenv("SANDBOX_KERNEL_STATE_DIR", raising=False)
    expected = (
        pathlib.Path("/var/lib/sandbox-kernel")
        if os.geteuid() == 0
        else pathlib.Path.home() / ".local/share/sandbox-kernel"
    )
    assert default_state_dir() == expected


def test_error_hierarchy():
    for cls in (SandboxNotFound, SandboxGone, Unauthorized, InvalidRequest, ServerUnavailable):
        assert issubclass(cls, SandboxError)
