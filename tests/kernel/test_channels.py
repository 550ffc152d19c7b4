"""The rule of each channel from a sandbox to the page (kernel/channels.py), fed what a
hostile sandbox could send. The widget channel has its own file (test_widget_policy.py),
the output table too (test_output_policy.py); the browser tests run each row in JupyterLab."""

from __future__ import annotations

import pathlib
import re

import pytest

from kernel import channels as C

SECURITY_PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "security.md"


@pytest.mark.parametrize("text", ["%%host\nopen('x', 'w')", "x = 1\n%%host\n", "  %%host", "%host import os",
                                  "%push data.csv", "%sandbox", "%pull x"])
def test_set_next_input_never_carries_a_line_the_kernel_runs(text):
    for code in ("get_ipython().set_next_input(t)", "%load script.py"):
        payload, note = C.next_input({"source": "set_next_input", "text": text, "replace": True}, code, False)
        assert payload is None and text in note


def test_only_load_sets_the_next_input():
    item = {"source": "set_next_input", "text": "print(6 * 7)\n", "replace": True}
    assert C.next_input(item, "%load script.py", False) == ({**item}, None)
    assert C.next_input(item, "x = 1\n%load script.py\n", False)[0] is not None
    payload, note = C.next_input(item, "get_ipython().set_next_input('print(6 * 7)')", False)
    assert payload is None and "only %load may" in note
    assert C.next_input(item, "# %loads\n", False)[0] is None
    assert C.next_input({**item, "text": "%%host\n"}, "x", True)[0] is not None, "pass-through sets the rule aside"


def test_the_reply_payload_keeps_pager_text_through_the_output_table_and_owes_notes():
    payloads = [{"source": "page", "data": {"text/html": "<script>top.owned=1</script>", "text/plain": "help"},
                 "start": True},
                {"source": "set_next_input", "text": "%%host\nowned()", "replace": True},
                {"source": "ask_exit"}, "junk"]
    kept, notes = C.reply_payload(payloads, "len?")
    assert [p["source"] for p in kept] == ["page"]
    assert kept[0]["data"]["text/html"].startswith('<iframe class="sandbox-output" sandbox="allow-scripts"')
    assert kept[0]["start"] == 0
    assert [m for m, _ in notes] == ["stream"] and "%%host" in notes[0][1]["text"]


def test_user_expressions_go_through_the_output_table():
    values = {"a": {"status": "ok", "data": {"text/html": "<img src=x onerror=top.owned=1>", "text/plain": "a"},
                    "metadata": {"trusted": True}},
              "b": {"status": "error", "ename": "E", "evalue": "<b>v</b>"}, "c": "junk"}
    kept = C.reply_user_expressions(values)
    assert kept["a"]["data"]["text/html"].startswith("<iframe") and kept["a"]["metadata"] == {}
    assert kept["b"]["status"] == "error" and kept["b"]["evalue"] == "<b>v</b>"
    assert "c" not in kept


def test_completions_are_one_line_continuations_that_make_no_kernel_line():
    code = "x = 1\nprint(ab"
    pos = len(code)
    reply = {"matches": ["abs", "ab\n%%host\nowned()", "abc\x1b[0m", 42, "a" * 600],
             "cursor_start": pos - 2, "cursor_end": pos,
             "metadata": {"_jupyter_types_experimental": [
                 {"text": "abs", "type": "function", "signature": "(x, /)", "start": 0, "end": 99},
                 {"text": "ab\n%%host\nowned()", "type": "<img src=x onerror=1>"}], "other": "<b>x</b>"}}
    kept = C.complete_reply(reply, code, pos)
    assert kept["matches"] == ["abs"]
    assert kept["metadata"] == {"_jupyter_types_experimental": [
        {"start": pos - 2, "end": pos, "text": "abs", "type": "function", "signature": "(x, /)"}]}
    line = "%pu"
    assert C.complete_reply({"matches": ["%pushd", "%push x"], "cursor_start": 0, "cursor_end": 3}, line, 3
                            )["matches"] == ["%pushd"], "IPython's %pushd is the sandbox's; %push is the kernel's"


@pytest.mark.parametrize("start, end", [(0, 14), (2, 3), (-1, 14), (None, 14), (True, 14), (6, 99)])
def test_completions_never_reach_outside_the_current_line(start, end):
    code = "x = 1\nprint(ab"
    kept = C.complete_reply({"matches": ["abs"], "cursor_start": start, "cursor_end": end}, code, len(code))
    assert kept["matches"] == [] and kept["cursor_start"] == kept["cursor_end"] == len(code)


def test_inspection_is_plain_text_only():
    reply = {"found": True, "data": {"text/html": "<img src=x onerror=1>", "text/plain": "Docstring"},
             "metadata": {"x": 1}}
    assert C.inspect_reply(reply) == {"status": "ok", "found": True, "data": {"text/plain": "Docstring"},
                                      "metadata": {}}
    assert C.inspect_reply(None)["found"] is False
    assert C.inspect_reply(reply, passthrough=True)["data"] == reply["data"]


def test_is_complete_indents_are_whitespace_only():
    assert C.is_complete_reply({"status": "incomplete", "indent": "    "}) == {"status": "incomplete", "indent": "    "}
    assert C.is_complete_reply({"status": "incomplete", "indent": "\n%%host\n"})["indent"] == ""
    assert C.is_complete_reply({"status": "weird"}) is None


def test_input_prompts_are_text_capped():
    prompt, password = C.input_prompt({"prompt": "x" * 10_000, "password": 1})
    assert len(prompt) == C.PROMPT_MAX and password is True
    assert C.input_prompt({"prompt": None}) == ("None", False)


def test_every_channel_is_a_row_of_the_security_pages_table():
    page = SECURITY_PAGE.read_text()
    section = page[page.index("## Every channel from the sandbox to the page"):]
    rows = re.findall(r"^\| (.+) \|$", section.split("\n## ")[0], re.MULTILINE)
    assert [row.split(" | ") for row in rows[2:]] == [list(channel) for channel in C.CHANNELS], \
        "docs/security.md's channel table is CHANNELS, every column"
