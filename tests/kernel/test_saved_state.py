"""A notebook's variables by value (kernel/saved_state.py): the notebook's next kernel brings
them back when the sandbox it kept has ended, and says what came back, what did not and how
old it is; `%sandbox save`, `restore` and `forget` on demand."""

from __future__ import annotations

import re

import pytest
from support import run_cell

from test_kernel import sandbox_id, wait_gone
from test_notebook_sandbox import notebook, shut_down  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slow,
              pytest.mark.bwrap_only("state by value is the default tier's way to outlive a sandbox")]


def test_the_next_kernel_brings_back_what_the_ended_sandbox_held(notebook, kernel_env):  # noqa: F811
    km, kc = notebook(SANDBOX_KERNEL_TTL="3")
    cell = ("import pandas as pd\nframe = pd.DataFrame({'a': range(1000)})\nsquare = lambda v: v * v\n"
            "notes = open('/workspace/notes.txt', 'w')")
    assert run_cell(kc, cell).status == "ok"
    sid = sandbox_id(kc)
    shut_down(km, kc)
    wait_gone(kernel_env, sid, timeout=60)
    km, kc = notebook()
    run = run_cell(kc, "int(frame['a'].sum()), square(7), 'notes' in dir()")
    assert run.status == "ok", run.errors
    assert run.result_text() == "(499500, 49, False)"
    note = run.notes
    assert f"the sandbox of this notebook ({sid}) ended" in note
    assert re.search(r"restored this notebook's variables saved \d+s ago \(sv-[0-9a-f]{16}\): frame \(pandas\.[\w.]*"
                     r"DataFrame\), square \(function\)", note), note
    assert "imported again: pd" in note
    assert "not restored: notes (_io.TextIOWrapper: an open file" in note
    assert run_cell(kc, "1").notes == "", "said once, on the first cell"


def test_sandbox_save_restore_and_forget(notebook):  # noqa: F811
    km, kc = notebook()
    assert run_cell(kc, "kept = [1, 2, 3]").status == "ok"
    saved = run_cell(kc, "%sandbox save")
    assert saved.status == "ok", saved.errors
    assert re.match(r"saved 1 variables by value as sv-[0-9a-f]{16} \([\d.]+ MiB\): kept\n$", saved.stdout), saved.stdout
    assert run_cell(kc, "del kept").status == "ok"
    restored = run_cell(kc, "%sandbox restore\nkept")
    assert restored.result_text() == "[1, 2, 3]"
    assert re.match(r"restored this notebook's variables saved \d+s ago \(sv-[0-9a-f]{16}\): kept \(list\)\n$",
                    restored.stdout), restored.stdout
    forgot = run_cell(kc, "%sandbox forget")
    assert re.match(r"forgot 1 save\(s\): sv-[0-9a-f]{16}\n$", forgot.stdout), forgot.stdout
    assert run_cell(kc, "%sandbox restore").stdout.startswith("no saved variables for this notebook")
    bad = run_cell(kc, "%sandbox restore sv-0000000000000000", stop_on_error=False)
    assert bad.reply["content"]["ename"] == "SaveNotFound" and "no save" in bad.reply["content"]["evalue"]
    assert run_cell(kc, "kept").result_text() == "[1, 2, 3]", "the sandbox stays"


def test_a_save_that_failed_before_the_sandbox_ended_is_said(notebook, kernel_env):  # noqa: F811
    km, kc = notebook(SANDBOX_KERNEL_TTL="3")
    refuse = ("import sandbox_runtime.saving as saving\n"
              "def refuse(*args):\n    raise saving.SaveRefused('planted refusal')\n"
              "saving.save = refuse\nv = 1")
    assert run_cell(kc, refuse).status == "ok"
    sid = sandbox_id(kc)
    shut_down(km, kc)
    wait_gone(kernel_env, sid, timeout=60)
    km, kc = notebook()
    run = run_cell(kc, "v", stop_on_error=False)
    assert run.reply["content"]["ename"] == "NameError"
    assert "this notebook's variables could not be saved before its sandbox ended: the save was refused " \
           "(nothing else was touched): planted refusal" in run.notes, run.notes
