"""`sbx.commands.run` in the sync and async clients (the `client` fixture), against a real server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sandbox.client import AsyncSandbox, CommandResult, InvalidRequest


@pytest.fixture(scope="module")
def sbx(sandbox_server, client):
    with client.Sandbox.create(url=sandbox_server.url, token=sandbox_server.token) as s:
        yield s


@pytest.mark.slow
def test_run_returns_exit_code_and_output(sbx):
    result = sbx.commands.run(["sh", "-c", "echo out; echo err >&2; exit 5"])
    assert isinstance(result, CommandResult)
    assert (result.exit_code, result.stdout, result.stderr) == (5, "out\n", "err\n")
    assert result.timed_out is False and result.ok is False
    assert isinstance(result.duration, float) and 0 <= result.duration < 60
    assert result.command_id

    # a str is a shell line, a list an argv
    assert sbx.commands.run("echo $HOME | tr a-z A-Z").stdout == "/TMP\n"
    assert sbx.commands.run(["echo", "$HOME"]).stdout == "$HOME\n"
    assert sbx.commands.run(["true"]).ok


def test_cwd_env_and_stdin(sbx):
    sbx.commands.run("mkdir -p work/here")
    assert sbx.commands.run(["pwd"], cwd="work/here").stdout == "/workspace/work/here\n"
    assert sbx.commands.run("echo $NAME", env={"NAME": "agent"}).stdout == "agent\n"
    assert sbx.commands.run(["tr", "a-z", "A-Z"], stdin="text\n").stdout == "TEXT\n"
    assert sbx.commands.run(["wc", "-c"], stdin=b"\x00\xff" * 10).stdout.strip() == "20"


def test_on_stdout_sees_output_before_the_command_ends(sbx):
    seen: list[tuple[float, str]] = []
    errors: list[str] = []
    started: list[str] = []
    result = sbx.commands.run(
        "echo early; sleep 2; echo late; echo oops >&2",
        on_stdout=lambda text: seen.append((time.monotonic(), text)),
        on_stderr=errors.append,
        on_start=started.append,
    )
    returned_at = time.monotonic()
    assert result.exit_code == 0 and result.stdout == "early\nlate\n"
    assert "".join(text for _, text in seen) == result.stdout and "".join(errors) == "oops\n"
    assert returned_at - seen[0][0] >= 1.0, "on_stdout saw 'early' only when the command ended"
    assert started == [result.command_id]


def test_timeout_and_interrupt_leave_the_sandbox_usable(sbx):
    sbx.run_code("state = 'kept'")
    result = sbx.commands.run(["sleep", "60"], timeout=1)
    assert result.timed_out is True and result.exit_code is None and result.reason == "timeout"
    assert result.duration < 30

    ids: list[str] = []
    worker_result: list[CommandResult] = []
    worker = threading.Thread(target=lambda: worker_result.append(
        sbx.commands.run(["sleep", "60"], on_start=ids.append)))
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not ids and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ids, "the command did not start"
        assert [c["command_id"] for c in sbx.commands.list()] == ids
        assert sbx.commands.interrupt(ids[0]) is True
    finally:
        worker.join(60)
    assert worker_result[0].reason == "interrupted" and worker_result[0].signal == 2
    assert sbx.commands.interrupt(ids[0]) is False
    assert sbx.run_code("state").text == "'kept'"


def test_bad_arguments(sbx):
    with pytest.raises(TypeError):
        sbx.commands.run(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as info:
        sbx.commands.run(["true"], cwd="../outside")
    assert "outside /workspace" in str(info.value)


def test_async_commands_have_the_same_surface(sandbox_server):
    async def main() -> None:
        seen: list[tuple[float, str]] = []

        async def on_stdout(text: str) -> None:
            seen.append((time.monotonic(), text))

        async with await AsyncSandbox.create(url=sandbox_server.url, token=sandbox_server.token) as s:
            result = await s.commands.run("echo early; sleep 2; echo late; exit 2", on_stdout=on_stdout)
            returned_at = time.monotonic()
            assert (result.exit_code, result.stdout, result.stderr) == (2, "early\nlate\n", "")
            assert returned_at - seen[0][0] >= 1.0
            assert (await s.commands.run(["cat"], stdin=b"bytes in")).stdout == "bytes in"
            assert (await s.commands.run(["pwd"], cwd="/workspace")).stdout == "/workspace\n"
            timed = await s.commands.run(["sleep", "60"], timeout=1, env={"X": "1"})
            assert timed.timed_out and timed.exit_code is None
            assert await s.commands.list() == []
            assert await s.commands.interrupt("c0") is False

    asyncio.run(main())
