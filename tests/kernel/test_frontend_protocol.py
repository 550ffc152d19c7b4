"""The rest of the kernel protocol, end to end through jupyter_client: pager and %load
payloads, user_expressions, input() over the stdin channel, and comms (ipywidgets) both
ways. A real kernel process, a real server, a real sandbox."""

from __future__ import annotations

import contextlib
import queue
import re
import time
import typing as t

import pytest
from support import run_cell

from kernel import drive

pytestmark = pytest.mark.slow


def iopub_until_idle(kc: t.Any, msg_id: str, timeout: float = 60) -> list[dict[str, t.Any]]:
    return drive.iopub_until_idle(kc, msg_id, time.monotonic() + timeout)


def reply_of(kc: t.Any, msg_id: str, timeout: float = 60) -> dict[str, t.Any]:
    return drive.wait_reply(kc, msg_id, time.monotonic() + timeout)["content"]


def input_request(kc: t.Any, timeout: float = 60) -> dict[str, t.Any]:
    msg = kc.get_stdin_msg(timeout=timeout)
    assert msg["msg_type"] == "input_request", msg
    return msg["content"]


# --------------------------------------------------------------------------- payloads


def test_help_opens_the_pager(kc):
    run = run_cell(kc, "len?")
    assert run.status == "ok"
    (payload,) = run.reply["content"]["payload"]
    assert payload["source"] == "page"
    assert "Return the number of items in a container" in payload["data"]["text/plain"]


def test_html_help_reaches_the_page_only_framed(kc):
    run = run_cell(kc, "get_ipython().enable_html_pager = True\nlen??")
    assert run.status == "ok", run.errors
    (payload,) = run.reply["content"]["payload"]
    html = payload["data"].get("text/html", "")
    assert html.startswith("<iframe") and 'sandbox="allow-scripts"' in html, html[:200]


def test_load_sets_the_next_input(kc):
    assert run_cell(kc, "open('script.py', 'w').write('print(6 * 7)\\n')").status == "ok"
    run = run_cell(kc, "%load script.py")
    assert run.status == "ok", run.errors
    (payload,) = run.reply["content"]["payload"]
    assert payload["source"] == "set_next_input"
    assert "print(6 * 7)" in payload["text"]


def test_user_expressions_are_evaluated_in_the_sandbox(kc):
    run = run_cell(kc, "x = 21", user_expressions={"double": "x * 2", "broken": "1 / 0",
                                                  "where": "__import__('os').getcwd()"})
    values = run.reply["content"]["user_expressions"]
    assert values["double"] == {"status": "ok", "data": {"text/plain": "42"}, "metadata": {}}
    assert values["broken"]["status"] == "error" and values["broken"]["ename"] == "ZeroDivisionError"
    assert values["where"]["data"]["text/plain"] == "'/workspace'"  # the sandbox's, not the kernel's


def test_only_load_sets_the_next_input_and_never_a_host_cell(kc):
    run = run_cell(kc, "get_ipython().set_next_input('%%host\\nopen(\\'owned\\', \\'w\\')', replace=True)")
    assert run.status == "ok", run.errors
    assert run.reply["content"]["payload"] == []
    assert "only %load may" in run.stdout and "%%host" in run.stdout, "shown as text instead"
    assert run_cell(kc, "open('host.py', 'w').write('%%host\\nprint(1)\\n')").status == "ok"
    assert run_cell(kc, "%load host.py").reply["content"]["payload"] == [], "not even through %load"


def test_completions_cannot_write_a_host_cell(kc):
    # (IPython's own matchers: jedi's first completion can take longer than the server waits.)
    run = run_cell(kc, "get_ipython().Completer.use_jedi = False\nget_ipython().Completer.custom_matchers.append(\n"
                       "    lambda text: ['zzq_ok', 'zzq\\n%%host\\nowned()', '%%host owned()'])")
    assert run.status == "ok", run.errors
    msg_id = kc.complete("zzq", 3)
    matches = reply_of(kc, msg_id)["matches"]
    assert "zzq_ok" in matches, matches
    assert not [m for m in matches if "\n" in m or "host" in m], matches


def test_a_widget_drawn_by_another_view_is_refused_with_a_note(kc):
    run = run_cell(kc, "import ipywidgets as w\nclass Lie(w.Label):\n    _view_name = __import__('traitlets').Unicode('HTMLView')"
                       ".tag(sync=True)\ndisplay(Lie('<img src=x onerror=top.owned=1>'))")
    assert run.status == "ok", run.errors
    assert not [m for m in run.outputs if m["msg_type"] == "comm_open"
                and m["content"]["data"]["state"].get("_model_name") == "LabelModel"]
    assert "widget not shown: @jupyter-widgets/controls:LabelModel drawn by @jupyter-widgets/controls:HTMLView" \
        in run.notes


# --------------------------------------------------------------------------- stdin


def test_input_is_answered_through_the_stdin_channel(kc):
    msg_id = kc.execute("import getpass\nname = input('name? ')\nsecret = getpass.getpass()\n"
                        "print('hello', name, len(secret))", allow_stdin=True)
    asked = input_request(kc)
    assert asked == {"prompt": "name? ", "password": False}
    kc.input("Ada")
    asked = input_request(kc)
    assert asked["password"] is True
    kc.input("s3cret")
    reply = reply_of(kc, msg_id)
    assert reply["status"] == "ok", reply
    outputs = iopub_until_idle(kc, msg_id)
    assert "hello Ada 6" in "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")


def test_input_without_stdin_raises_as_ipykernel_does(kc):
    run = run_cell(kc, "input('name? ')", allow_stdin=False, stop_on_error=False)
    assert run.status == "error"
    assert run.reply["content"]["ename"] == "StdinNotImplementedError"


def test_an_interrupt_ends_the_wait_for_input(kernel):
    km, kc = kernel
    msg_id = kc.execute("input('never answered? ')", allow_stdin=True, stop_on_error=False)
    input_request(kc)
    km.interrupt_kernel()
    reply = reply_of(kc, msg_id)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
    assert run_cell(kc, "print('still here')").stdout == "still here\n"


def test_waiting_for_input_does_not_count_against_the_timeout(start_kernel):
    _km, kc = start_kernel(SANDBOX_KERNEL_TIMEOUT="3")
    msg_id = kc.execute("import time\nanswer = input('slow? ')\nprint('got', answer)", allow_stdin=True)
    input_request(kc)
    time.sleep(5)  # longer than the cell's timeout: the clock is stopped while it waits
    kc.input("yes")
    reply = reply_of(kc, msg_id)
    assert reply["status"] == "ok", reply


# --------------------------------------------------------------------------- comms


SLIDER_CELL = """
import ipywidgets as w
slider = w.IntSlider(value=1)
out = w.Output()
def recompute(change):
    with out:
        print('value times ten:', change['new'] * 10)
slider.observe(recompute, 'value')
label = w.HTML('<img src=x onerror="top.owned=1">safe <b>text</b>')
display(w.VBox([slider, out, label]))
"""


def comm_opens(outputs: list[dict[str, t.Any]]) -> dict[str, dict[str, t.Any]]:
    return {m["content"]["data"]["state"]["_model_name"]: m["content"]
            for m in outputs if m["msg_type"] == "comm_open"}


def test_a_slider_moved_on_the_page_recomputes_in_the_sandbox(kc):
    run = run_cell(kc, SLIDER_CELL)
    assert run.status == "ok", run.errors
    opened = comm_opens(run.outputs)
    assert {"IntSliderModel", "OutputModel", "HTMLModel", "VBoxModel"} <= set(opened)
    assert all(c["target_name"] == "jupyter.widget" for c in opened.values())
    # JupyterLab's widget manager refuses a comm_open whose metadata lacks the protocol version.
    assert all(m["metadata"]["version"].startswith("2.") for m in run.outputs if m["msg_type"] == "comm_open")
    (view,) = [m for m in run.outputs if m["msg_type"] == "display_data"  # not the startup progress
               and "application/vnd.jupyter.widget-view+json" in m["content"]["data"]]
    assert view["content"]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] == opened["VBoxModel"]["comm_id"]
    # The HTML widget's value is put into the page as HTML: it arrives sanitized.
    assert opened["HTMLModel"]["data"]["state"]["value"] == "safe <b>text</b>"

    # The page moves the slider: a comm_msg, as JupyterLab's widget manager sends it.
    msg = kc.session.msg("comm_msg", {"comm_id": opened["IntSliderModel"]["comm_id"],
                                      "data": {"method": "update", "state": {"value": 4}, "buffer_paths": []}})
    kc.shell_channel.send(msg)
    outputs = iopub_until_idle(kc, msg["header"]["msg_id"])
    printed = "".join(m["content"]["text"] for m in outputs if m["msg_type"] == "stream")
    assert printed == "value times ten: 40\n"
    # The Output widget captured under the page's message id: its output lands in the widget.
    captured = [m for m in outputs if m["msg_type"] == "comm_msg"
                and m["content"]["comm_id"] == opened["OutputModel"]["comm_id"]]
    assert captured[0]["content"]["data"]["state"]["msg_id"] == msg["header"]["msg_id"]
    # ... and the sandbox holds the new value.
    assert run_cell(kc, "slider.value").of_type("execute_result")[0]["content"]["data"]["text/plain"] == "4"


def test_a_button_click_runs_its_handler(kc):
    run = run_cell(kc, "import ipywidgets as w\nclicks = []\nb = w.Button(description='go')\n"
                       "b.on_click(lambda _: clicks.append(1))\ndisplay(b)")
    button = comm_opens(run.outputs)["ButtonModel"]
    msg = kc.session.msg("comm_msg", {"comm_id": button["comm_id"], "data": {"method": "custom",
                                                                            "content": {"event": "click"}}})
    kc.shell_channel.send(msg)
    iopub_until_idle(kc, msg["header"]["msg_id"])
    assert run_cell(kc, "len(clicks)").of_type("execute_result")[0]["content"]["data"]["text/plain"] == "1"


def test_tqdm_notebook_bar_reaches_its_total(kc):
    run = run_cell(kc, "from tqdm.notebook import tqdm\nfor _ in tqdm(range(20)):\n    pass")
    assert run.status == "ok", run.errors
    progress = comm_opens(run.outputs)["FloatProgressModel"]
    values = [m["content"]["data"]["state"]["value"] for m in run.outputs if m["msg_type"] == "comm_msg"
              and m["content"]["comm_id"] == progress["comm_id"] and "value" in m["content"]["data"].get("state", {})]
    assert values and values[-1] == 20
    texts = [m["content"]["data"]["state"].get("value", "") for m in run.outputs if m["msg_type"] == "comm_msg"]
    assert any(re.search(r"100%", str(v)) for v in texts)


def test_a_comm_message_sent_while_its_cell_runs_waits_for_the_cell(kc):
    """As JupyterLab does when it draws a slider: the comm_msg arrives while the cell that
    made the slider still runs. It is handled after the cell (as ipykernel queues it), and
    the cell still ends with its reply and its idle status."""
    msg_id = kc.execute("import ipywidgets as w, time\ns = w.IntSlider(2)\n"
                        "s.observe(lambda c: print('moved to', c['new']), 'value')\ndisplay(s)\ntime.sleep(3)\n"
                        "print('cell done')")
    deadline = time.monotonic() + 60
    slider = None
    while slider is None:
        msg = kc.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        if msg["msg_type"] == "comm_open" and msg["content"]["data"]["state"].get("_model_name") == "IntSliderModel":
            slider = msg["content"]["comm_id"]
    comm = kc.session.msg("comm_msg", {"comm_id": slider, "data": {"method": "update", "state": {"value": 5},
                                                                  "buffer_paths": []}})
    kc.shell_channel.send(comm)
    assert reply_of(kc, msg_id)["status"] == "ok"
    # Both requests' IOPub messages, each up to its idle: the comm's may start before the
    # cell's idle is out (two requests' statuses interleave; a frontend routes by parent).
    seen: dict[str, list[str]] = {msg_id: [], comm["header"]["msg_id"]: []}
    idle: set[str] = set()
    deadline = time.monotonic() + 60
    while idle != set(seen):
        msg = kc.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        parent = msg["parent_header"].get("msg_id")
        if parent not in seen or parent in idle:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle.add(parent)
        elif msg["msg_type"] == "stream":
            seen[parent].append(msg["content"]["text"])
    assert "cell done" in "".join(seen[msg_id]), seen
    # Its output comes under the page's message, before its idle (which ipywidgets waits for
    # before it sends the model's next update), though ipykernel dispatched it beside the cell.
    assert "moved to 5" in "".join(seen[comm["header"]["msg_id"]]), seen


def test_a_cell_queued_behind_a_slow_comm_message_gets_its_own_idle(kc):
    """JupyterLab shows `[*]` until a cell's reply *and* the idle status under its own
    msg_id have come. Here a comm message (a slider moved) is dispatched beside a running
    cell and is still handled in the sandbox (its observer sleeps) when the next cell
    starts: when the comm message ends, it must not leave its parent behind for the next
    cell, whose idle would then go out under the earlier cell's msg_id (the stuck `[*]` of
    a notebook opened while ipywidgets' messages wait for the sandbox claim)."""
    made = run_cell(kc, "import ipywidgets as w, time\ns = w.IntSlider(2)\n"
                        "s.observe(lambda c: time.sleep(3), 'value')\nprint(s.comm.comm_id)")
    assert made.status == "ok", made.errors
    slider = made.stdout.strip()
    running = kc.execute("time.sleep(2)")
    comm = kc.session.msg("comm_msg", {"comm_id": slider, "data": {"method": "update", "state": {"value": 5},
                                                                  "buffer_paths": []}})
    kc.shell_channel.send(comm)  # beside the running cell; its handler sleeps after it
    queued = kc.execute("print('queued ran')")
    assert reply_of(kc, queued)["status"] == "ok"
    idles: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while queued not in idles:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            break
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            parent = msg["parent_header"].get("msg_id")
            idles[parent] = idles.get(parent, 0) + 1
    assert idles.get(queued) == 1, f"no idle under the queued cell's msg_id: {idles}"
    assert idles.get(running) == 1, f"the running cell's idle twice: {idles}"


def test_a_cell_run_as_jupyterlab_opens_the_notebook_gets_its_reply_and_idle(start_kernel):
    """What JupyterLab sends when it opens a notebook (kernel_info, then ipywidgets' control
    comm and its request for states), and a cell at once, while the kernel still claims its
    sandbox (the comm messages wait for the claim): the cell's reply, count 1 and its idle
    under its own msg_id arrive, a few fresh kernels in a row (a notebook whose first cell
    lacks that idle stays at `[*]` in JupyterLab)."""
    for _ in range(3):
        _km, kc = start_kernel()
        control = {"comm_id": f"control-{time.monotonic_ns()}"}
        opened = kc.session.msg("comm_open", {**control, "target_name": "jupyter.widget.control", "data": {}})
        states = kc.session.msg("comm_msg", {**control, "data": {"method": "request_states"}})
        kc.shell_channel.send(opened)
        kc.shell_channel.send(states)
        cell = kc.execute("print('first')")
        reply = reply_of(kc, cell)
        assert (reply["status"], reply["execution_count"]) == ("ok", 1), reply
        idles: list[str] = []
        deadline = time.monotonic() + 60
        while cell not in idles and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                msg = kc.get_iopub_msg(timeout=1)
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    idles.append(msg["parent_header"].get("msg_id"))
        assert idles.count(cell) == 1, f"the cell's idle: {idles}"
        assert idles.count(opened["header"]["msg_id"]) <= 1, f"an idle twice under the comm_open: {idles}"
