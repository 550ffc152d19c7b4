"""The ADK code executor and function tools, driven by ADK itself on the session's server.

The agents are real ADK `LlmAgent`s run by ADK's `InMemoryRunner`; only the model is a
scripted stand-in (adk_support.ScriptedModel: no model is reachable here). The analyst's
questions are notebooks 01 and 03's, over the same three May weeks.
"""

from __future__ import annotations

import asyncio
import base64
import csv
import pathlib
import re
import threading
import time
import typing as t

import pytest

pytest.importorskip("google.adk", reason="the adk extra is not installed: pip install -e '.[test]'")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.code_executors.code_execution_utils import CodeExecutionInput, File  # noqa: E402
from google.adk.runners import InMemoryRunner  # noqa: E402
from google.genai import types  # noqa: E402

import support  # noqa: E402
from adk_support import ScriptedModel, code  # noqa: E402
from sandbox.agents.adk import SandboxCodeExecutor, sandbox_tools  # noqa: E402
from sandbox.client import AsyncSandbox, Sandbox  # noqa: E402

CSV = support.REPO / "notebooks" / "data" / "campaign_weeks.csv"
APP = "analyst"
USER = "analyst-1"


def host_figures() -> tuple[float, str, float]:
    """CTR from the totals, and the cheapest CPM week with its CPM, recomputed on the host
    from the CSV rows with the csv module: the check the sandbox cannot fake."""
    with open(CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    ctr = round(sum(int(r["clicks"]) for r in rows) / sum(int(r["impressions"]) for r in rows) * 100, 2)
    cpms = {r["week_start"]: float(r["media_spend_eur"]) / int(r["impressions"]) * 1000 for r in rows}
    week = min(cpms, key=cpms.get)
    return ctr, week, round(cpms[week], 2)


def check_answer(answer: str, expected: float) -> str | None:
    """The agent's own host-side check: None if the answer's last figure is the host's."""
    numbers = re.findall(r"\d+(?:\.\d+)?", answer)
    if not numbers:
        return "the answer contains no number"
    if abs(float(numbers[-1]) - expected) > 0.005:
        return f"{numbers[-1]} does not match the figure recomputed from the CSV rows on the host"
    return None


@pytest.fixture
def executor(sandbox_server: support.Server) -> t.Iterator[SandboxCodeExecutor]:
    ex = SandboxCodeExecutor(url=sandbox_server.url, token=sandbox_server.token, ttl_seconds=300)
    yield ex
    ex.close()


def is_running(server: support.Server, sandbox_id: str) -> bool:
    with server.client() as c:
        r = c.get(f"/v1/sandboxes/{sandbox_id}")
    return r.status_code == 200 and r.json()["state"] == "running"


async def ask(runner: InMemoryRunner, session_id: str, text: str, csv_bytes: bytes | None = None) -> str:
    parts = [types.Part(text=text)]
    if csv_bytes is not None:
        parts.insert(0, types.Part(inline_data=types.Blob(mime_type="text/csv", data=csv_bytes)))
    final = ""
    async for event in runner.run_async(user_id=USER, session_id=session_id,
                                        new_message=types.Content(role="user", parts=parts)):
        if event.is_final_response() and event.content and event.content.parts:
            final = "".join(p.text or "" for p in event.content.parts)
    return final


# The analyst's questions, as notebooks 01 and 03 ask them; the model is scripted.
LOAD = code("import pandas as pd\ndf = pd.read_csv('data_1_1.csv')\nprint(df[['week_start', 'impressions', 'clicks']].to_string(index=False))")
CTR_SLIP = code("ctr = df['clicks'].sum() / df['impressions'].sum() * 100\nprint(round(ctr * 100, 2))")  # x100 twice
CTR_FIX = code("print(round(ctr, 2))")  # `ctr` from the earlier run: the same sandbox
CPM = code("cpm = df['media_spend_eur'] / df['impressions'] * 1000\n"
           "best = cpm.idxmin()\nprint(df.loc[best, 'week_start'], round(cpm[best], 2))")


def answer(template: str) -> t.Callable[[str], str]:
    """A final answer quoting the last line the sandbox printed."""
    def reply(output: str) -> str:
        lines = [line for line in output.strip().splitlines() if line.strip()]
        return template.format(lines[-1] if lines else "(nothing)")
    return reply


@pytest.mark.slow
def test_agent_answers_the_analysts_questions_in_one_sandbox(sandbox_server: support.Server,
                                                             executor: SandboxCodeExecutor) -> None:
    ctr, week, cpm = host_figures()
    assert (ctr, week, cpm) == (1.01, "2026-05-18", 4.35)
    executor.optimize_data_file = True  # ADK's own path for a CSV attached to the message
    model = ScriptedModel(model="scripted-stand-in", replies=[
        LOAD, CTR_SLIP, answer("The campaign's CTR is {} %."),
        CTR_FIX, answer("The campaign's CTR is {} %."),
        CPM, answer("The cheapest CPM week: {} EUR."),
    ])
    agent = LlmAgent(name="analyst", model=model, code_executor=executor,
                     instruction="Answer with figures computed in the sandbox.")

    async def conversation() -> tuple[list[str], str, str]:
        runner = InMemoryRunner(agent=agent, app_name=APP)
        session = await runner.session_service.create_session(app_name=APP, user_id=USER)
        log = []
        first = await ask(runner, session.id, "What was the click-through rate of the campaign?", CSV.read_bytes())
        log.append(first)
        problem = check_answer(first, ctr)
        assert problem is not None, f"the host check accepted a wrong answer: {first!r}"
        log.append(problem)
        second = await ask(runner, session.id, f"Rejected: {problem}. Check the computation and answer again.")
        log.append(second)
        third = await ask(runner, session.id, "Which week had the cheapest CPM?")
        log.append(third)
        sandbox_id = executor.sandbox_id(session.id)
        await runner.close()
        return log, session.id, sandbox_id

    log, session_id, sandbox_id = asyncio.run(conversation())
    first, problem, second, third = log
    assert first == "The campaign's CTR is 101.29 %.", log       # the slip, as the sandbox computed it
    assert "101.29 does not match" in problem
    assert second == "The campaign's CTR is 1.01 %.", log        # `ctr` was still in the sandbox
    assert check_answer(second, ctr) is None
    assert third == "The cheapest CPM week: 2026-05-18 4.35 EUR.", log  # `df` was too: not reloaded
    assert check_answer(third, cpm) is None and week in third
    # The code the model saw run: the CSV went in once, through ADK's input files.
    sent = [r for r in model.requests if "data_1_1.csv" in str(r.contents)]
    assert sent, "the CSV never reached the sandbox through ADK's input files"
    assert sandbox_id and is_running(sandbox_server, sandbox_id)
    assert executor.end_session(session_id) is True
    assert not is_running(sandbox_server, sandbox_id)


@pytest.mark.slow
def test_each_session_gets_its_own_sandbox(sandbox_server: support.Server, executor: SandboxCodeExecutor) -> None:
    def run(session: str, source: str):
        return executor.execute_code(None, CodeExecutionInput(code=source, execution_id=session))  # type: ignore[arg-type]

    assert run("s1", "x = 'one'").exit_code == 0
    assert run("s2", "x = 'two'").exit_code == 0
    assert run("s1", "print(x)").stdout.strip() == "one"
    assert run("s2", "print(x)").stdout.strip() == "two"
    ids = {executor.sandbox_id("s1"), executor.sandbox_id("s2")}
    assert len(ids) == 2 and None not in ids
    executor.close()
    assert not any(is_running(sandbox_server, i) for i in ids)


@pytest.mark.slow
def test_stateless_runs_share_nothing(sandbox_server: support.Server) -> None:
    ex = SandboxCodeExecutor(url=sandbox_server.url, token=sandbox_server.token, stateful=False)
    try:
        assert ex.execute_code(None, CodeExecutionInput(code="x = 1", execution_id="s")).exit_code == 0  # type: ignore[arg-type]
        again = ex.execute_code(None, CodeExecutionInput(code="x", execution_id="s"))  # type: ignore[arg-type]
        assert again.exit_code == 1 and "NameError" in again.stderr
        assert ex.sandbox_id("s") is None
    finally:
        ex.close()


def test_stderr_only_for_real_errors(executor: SandboxCodeExecutor) -> None:
    def run(source: str):
        return executor.execute_code(None, CodeExecutionInput(code=source, execution_id="e"))  # type: ignore[arg-type]

    warned = run("import sys, warnings\nprint('before')\nwarnings.warn('careful')\nprint('noted', file=sys.stderr)\n6 * 7")
    assert warned.stderr == "" and warned.exit_code == 0, warned
    assert "before" in warned.stdout and "careful" in warned.stdout and "noted" in warned.stdout
    assert warned.stdout.rstrip().endswith("42")  # the value of the last expression, as a REPL echoes it
    failed = run("print('partial')\n1 / 0")
    assert failed.exit_code == 1
    assert "ZeroDivisionError" in failed.stderr and "partial" in failed.stderr  # ADK shows only stderr then
    assert "\x1b[" not in failed.stderr


@pytest.mark.slow
def test_input_files_pushed_once_and_outputs_returned(executor: SandboxCodeExecutor) -> None:
    data = File(name="weeks.csv", content=base64.b64encode(CSV.read_bytes()).decode(), mime_type="text/csv")

    def run(source: str, files: list[File]):
        return executor.execute_code(None, CodeExecutionInput(code=source, input_files=files, execution_id="f"))  # type: ignore[arg-type]

    first = run("open('weeks.csv', 'a').write('edited in the sandbox\\n')", [data])
    assert first.exit_code == 0, first
    # ADK sends the same file again on every run: not pushed again, so the edit stays.
    second = run("print(open('weeks.csv').read().splitlines()[-1])", [data])
    assert second.stdout.strip() == "edited in the sandbox", second
    assert [f.name for f in second.output_files] == []  # nothing changed in this run
    changed = File(name="weeks.csv", content=b"week_start\n2026-05-25\n", mime_type="text/csv")
    third = run("print(open('weeks.csv').read().splitlines()[-1])", [changed])
    assert third.stdout.strip() == "2026-05-25", third  # new content: pushed

    made = run(
        "import matplotlib.pyplot as plt\n"
        "open('summary.txt', 'w').write('CTR 1.01 %')\n"
        "plt.plot([1, 2, 3]); plt.show()",
        [changed],
    )
    assert made.exit_code == 0, made
    names = {f.name: f for f in made.output_files}
    assert set(names) == {"summary.txt", "figure_1.png"}, names
    assert names["summary.txt"].content == b"CTR 1.01 %"
    assert names["figure_1.png"].mime_type == "image/png"
    assert names["figure_1.png"].content[:8] == b"\x89PNG\r\n\x1a\n"
    assert "weeks.csv" not in names  # an input file is not an output


@pytest.mark.slow
def test_timeout_and_interrupt_keep_the_interpreter(sandbox_server: support.Server) -> None:
    ex = SandboxCodeExecutor(url=sandbox_server.url, token=sandbox_server.token, timeout_seconds=2)
    try:
        def run(source: str):
            return ex.execute_code(None, CodeExecutionInput(code=source, execution_id="t"))  # type: ignore[arg-type]

        assert run("kept = 'still here'").exit_code == 0
        # The first exception in a fresh sandbox loads IPython's traceback formatting, which
        # can take longer than the supervisor's interrupt grace on a loaded host (the
        # sandbox is then killed, not interrupted): have it loaded before the timeout.
        assert run("1 / 0").exit_code == 1
        timed_out = run("import time\ntime.sleep(60)")
        assert timed_out.exit_code == 1 and "TimeoutError" in timed_out.stderr, timed_out
        assert run("print(kept)").stdout.strip() == "still here"

        ex.timeout_seconds = None
        box: dict[str, t.Any] = {}
        worker = threading.Thread(target=lambda: box.setdefault("r", run("import time\nwhile True: time.sleep(0.1)")))
        worker.start()
        assert support.wait_for(lambda: ex.interrupt("t"), 30), "nothing was running to interrupt"
        worker.join(60)
        assert not worker.is_alive()
        assert box["r"].exit_code == 1 and "KeyboardInterrupt" in box["r"].stderr, box["r"]
        assert run("print(kept)").stdout.strip() == "still here"
    finally:
        ex.close()


def test_a_run_does_not_block_adks_event_loop(sandbox_server: support.Server, executor: SandboxCodeExecutor) -> None:
    """While the agent's code runs, the agent's own event loop stays free: the application
    interrupts that run from it, with the async method, and the agent goes on."""
    model = ScriptedModel(model="scripted-stand-in", replies=[
        code("import time\nn = 0\nwhile True:\n    n += 1\n    time.sleep(0.05)"),
        answer("Stopped: {}"),
    ])
    agent = LlmAgent(name="looper", model=model, code_executor=executor)

    async def main() -> tuple[str, bool]:
        runner = InMemoryRunner(agent=agent, app_name=APP)
        session = await runner.session_service.create_session(app_name=APP, user_id=USER)
        task = asyncio.create_task(ask(runner, session.id, "Count forever."))
        interrupted = False
        for _ in range(600):
            await asyncio.sleep(0.1)
            if executor.sandbox_id(session.id) and await executor.ainterrupt(session.id):
                interrupted = True
                break
        final = await asyncio.wait_for(task, 120)
        await runner.close()
        return final, interrupted

    final, interrupted = asyncio.run(main())
    assert interrupted
    assert "KeyboardInterrupt" in final, final


@pytest.mark.slow
def test_expired_session_sandbox_is_replaced_and_said(sandbox_server: support.Server) -> None:
    ex = SandboxCodeExecutor(url=sandbox_server.url, token=sandbox_server.token, ttl_seconds=2)
    try:
        def run(source: str):
            return ex.execute_code(None, CodeExecutionInput(code=source, execution_id="x"))  # type: ignore[arg-type]

        assert run("v = 1").exit_code == 0
        old = ex.sandbox_id("x")
        assert support.wait_for(lambda: not is_running(sandbox_server, old), 30)
        after = run("print('fresh')")
        assert after.exit_code == 0, after
        assert "had ended" in after.stdout and "variables and files from earlier runs are gone" in after.stdout
        assert after.stdout.rstrip().endswith("fresh")
        assert ex.sandbox_id("x") not in (None, old)
    finally:
        ex.close()


def test_function_tools_drive_one_sandbox(sandbox_server: support.Server) -> None:
    """An agent with the function tools (no code executor): write, run, list, read, and
    what the sandbox uses (its memory below its limit)."""
    call = types.FunctionCall
    model = ScriptedModel(model="scripted-stand-in", replies=[
        call(name="write_file", args={"path": "notes/q.txt", "content": "clicks,impressions\n244658,24153312\n"}),
        call(name="run_code", args={"code": "import pandas as pd\nq = pd.read_csv('notes/q.txt')\n"
                                            "print(round(q.clicks[0] / q.impressions[0] * 100, 2))"}),
        call(name="run_code", args={"code": "open('notes/a.txt', 'w').write(str(round(q.clicks[0] / q.impressions[0] * 100, 2)))"}),
        call(name="list_files", args={}),
        call(name="read_file", args={"path": "notes/a.txt"}),
        call(name="sandbox_usage", args={}),
        call(name="save_state", args={"label": "adk-task"}),
        lambda output: f"Done: {output}",
    ])

    async def main() -> tuple[str, list[dict]]:
        async with await AsyncSandbox.create(url=sandbox_server.url, token=sandbox_server.token) as sbx:
            tools = sandbox_tools(sbx)
            assert {tl.name for tl in tools} >= {"run_code", "read_file", "write_file", "list_files", "sandbox_usage",
                                                 "save_state"}
            agent = LlmAgent(name="tooluser", model=model, tools=tools)
            runner = InMemoryRunner(agent=agent, app_name=APP)
            session = await runner.session_service.create_session(app_name=APP, user_id=USER)
            final = await ask(runner, session.id, "CTR of notes/q.txt, saved in notes/a.txt?")
            responses = [p.function_response.response for c in model.requests[-1].contents
                         for p in (c.parts or []) if p.function_response]
            await runner.close()
            return final, responses

    final, responses = asyncio.run(main())
    assert len(responses) == 7, responses
    assert responses[6]["save_id"].startswith("sv-") and "q" in responses[6]["saved"], responses[6]
    with sandbox_server.client() as c:
        assert c.get(f"/v1/saves/{responses[6]['save_id']}").json()["label"] == "adk-task"
        c.delete(f"/v1/saves/{responses[6]['save_id']}")
    assert responses[1]["exit_code"] == 0 and responses[1]["stdout"].strip() == "1.01", responses
    assert responses[2]["exit_code"] == 0, responses
    assert {"path": "notes/a.txt", "size": 4, "type": "file"} in responses[3]["files"], responses
    assert responses[4]["content"] == "1.01"
    usage = responses[5]  # pandas is loaded: tens of MB, below the sandbox's limit
    assert 10 * 2**20 < usage["memory_bytes"] < usage["memory_limit_bytes"], usage
    assert usage["cpu_seconds"] > 0, usage
    assert final.startswith("Done: ") and "save_id" in final  # the last answer reached the model


@pytest.mark.slow
def test_run_command_tool_follows_the_client(sandbox_server: support.Server) -> None:
    """run_command is offered exactly when the client can run commands; then an agent's call
    returns the exit code and both streams of a command run in the sandbox's /workspace."""

    async def main() -> tuple[set[str], bool, list[dict]]:
        async with await AsyncSandbox.create(url=sandbox_server.url, token=sandbox_server.token) as sbx:
            names = {tl.name for tl in sandbox_tools(sbx)}
            if not hasattr(sbx, "commands"):
                return names, False, []
            model = ScriptedModel(model="scripted-stand-in", replies=[
                types.FunctionCall(name="write_file", args={"path": "in.txt", "content": "three\nlines\nhere\n"}),
                types.FunctionCall(name="run_command", args={"command": "wc -l < in.txt; echo oops >&2; exit 3"}),
                lambda output: f"Done: {output}",
            ])
            runner = InMemoryRunner(agent=LlmAgent(name="shell", model=model, tools=sandbox_tools(sbx)), app_name=APP)
            session = await runner.session_service.create_session(app_name=APP, user_id=USER)
            await ask(runner, session.id, "Count the lines of in.txt.")
            responses = [p.function_response.response for c in model.requests[-1].contents
                         for p in (c.parts or []) if p.function_response]
            await runner.close()
            return names, True, responses

    names, has_commands, responses = asyncio.run(main())
    assert ("run_command" in names) == has_commands, names
    if not has_commands:
        pytest.skip("the client has no commands yet (sbx.commands, issue 16 item 1): run_command is not offered")
    result = responses[1]
    assert result["exit_code"] == 3 and result["timed_out"] is False, result
    assert result["stdout"].strip() == "3" and result["stderr"].strip() == "oops", result
