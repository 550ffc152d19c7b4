"""The request sequences both kernels get: what notebooks, nbclient, papermill and
JupyterLab's consoles send, including the awkward timings (a burst queued behind a
running or failing cell, an interrupt mid-cell, requests before the kernel is ready).

Each scenario drives a `Frontend` and returns when every request is settled; the test
compares the two transcripts. A scenario never looks at which kernel it drives.
"""

from __future__ import annotations

import typing as t

from .frontend import Frontend

SLEEPY = "import time\nprint('started', flush=True)\ntime.sleep({seconds})\n"


def run_all_stops_at_an_error(fe: Frontend) -> None:
    """Run All (stop_on_error, as JupyterLab, nbclient and papermill send it)."""
    for code in ("a = 1", "a / 0", "print('cell 3')", "a + 2", "print('cell 5')"):
        fe.execute(code)
    fe.settle()


def run_all_without_stop_on_error(fe: Frontend) -> None:
    for code in ("a = 1", "a / 0", "print('cell 3')", "a + 2"):
        fe.execute(code, stop_on_error=False)
    fe.settle()


def error_while_the_queue_fills(fe: Frontend) -> None:
    """Requests that arrive while the failing cell still runs are aborted too."""
    first = fe.execute(SLEEPY.format(seconds=1.5) + "1 / 0", label="failing, slow")
    fe.wait(lambda: fe.saw(first, "stream", "started"))
    fe.execute("print('queued 1')")
    fe.is_complete("print(")  # not an execute: answered, never aborted
    fe.execute("print('queued 2')")
    fe.settle()
    fe.execute("print('after the abort')")
    fe.settle()


def silent_and_unstored_cells(fe: Frontend) -> None:
    fe.execute("x = 10")
    fe.execute("x + 1", label="silent", silent=True)
    fe.execute("x + 2", label="not stored", store_history=False)
    fe.execute("x + 3")
    fe.execute("1 / 0", label="silent error", silent=True)  # no abort: the frontend asked for silence
    fe.execute("x + 4")
    fe.settle()


def interrupt_mid_cell(fe: Frontend) -> None:
    first = fe.execute(SLEEPY.format(seconds=60), label="sleeping", stop_on_error=False)
    fe.wait(lambda: fe.saw(first, "stream", "started"))
    fe.interrupt()
    fe.settle()
    fe.execute("print('still here')")
    fe.settle()


def magics(fe: Frontend) -> None:
    fe.execute("%%capture captured\nprint('hidden')")
    fe.execute("captured.stdout")
    fe.execute("%who_ls int", label="%who_ls")
    fe.execute("%nosuchmagic", label="unknown magic", stop_on_error=False)
    fe.execute("!echo shell", label="!echo")
    fe.execute("%%host\nprint('on the host')", label="%%host", stop_on_error=False)
    fe.execute("print('next count')")
    fe.settle()


def displays(fe: Frontend) -> None:
    fe.execute("from IPython.display import display, HTML, Markdown, Math, JSON, Javascript, update_display")
    fe.execute("h = display('first', display_id=True)")
    fe.execute("h.update('second')")
    fe.execute("display('by id', display_id='fixed'); update_display('updated', display_id='fixed')")
    fe.execute("display(HTML('<b>bold</b>'))")
    fe.execute("display(Markdown('*md*'))")
    fe.execute("display(Math(r'x^2'))")
    fe.execute("display({'text/plain': 'p', 'application/json': {'a': 1}}, raw=True, metadata={'application/json': {'expanded': True}})")
    fe.execute("class R:\n    def _repr_html_(self): return '<i>r</i>'\nR()")
    fe.execute("display(Javascript('1'))")
    fe.settle()


def clear_output(fe: Frontend) -> None:
    fe.execute("from IPython.display import clear_output\nprint('one')\nclear_output()\nprint('two')")
    fe.execute("print('a')\nclear_output(wait=True)\nprint('b')")
    fe.settle()


def input_prompts(fe: Frontend) -> None:
    fe.answers[:] = ["Ada", "secret"]
    fe.execute("name = input('name? ')\nprint('hello', name)")
    fe.execute("import getpass\nword = getpass.getpass('password: ')\nlen(word)")
    fe.execute("input('no stdin? ')", label="input without stdin", allow_stdin=False, stop_on_error=False)
    fe.settle()


def comms(fe: Frontend) -> None:
    fe.shell("comm_open", {"comm_id": "c0ffee", "target_name": "no-such-target", "data": {}}, label="comm_open")
    fe.settle()
    fe.execute("print('after the comm')")
    fe.settle()


def introspection(fe: Frontend) -> None:
    # Jedi warmed first: a fresh sandbox's first completion was seen to take over the server's
    # 30 s on a loaded host (then the kernel answers with no matches); compared here are the
    # replies, not jedi's cold start.
    fe.execute("value = 42\nimport jedi\n_ = jedi.Interpreter('val', [{'value': 1}]).complete()")
    fe.settle()
    fe.complete("val")
    fe.complete("import o", 8)
    fe.inspect("len", 3)
    fe.inspect("nosuchname", 5)
    for code in ("x = 1", "for i in range(3):", "def f(:", "%%host"):
        fe.is_complete(code)
    fe.settle()


def history(fe: Frontend) -> None:
    fe.execute("h1 = 1")
    fe.execute("h1 + 1")
    fe.execute("1 / 0", stop_on_error=False)
    fe.settle()
    fe.history(hist_access_type="range", session=0, output=False, raw=True)
    fe.history(hist_access_type="tail", n=2, output=False, raw=True)
    fe.history(hist_access_type="search", pattern="h1*", output=False, raw=True)
    fe.settle()


def shutdown_and_restart(fe: Frontend) -> None:
    fe.execute("kept = 1")
    fe.settle()
    fe.km.restart_kernel(now=False)
    fe.kc.wait_for_ready(timeout=120)
    fe.execute("kept", stop_on_error=False)  # gone: a restart is a fresh interpreter
    fe.execute("'count from 1'")
    fe.settle()
    msg_id = fe.kc.shutdown(restart=False)
    fe._track("shutdown", "shutdown_request", msg_id)
    fe.settle()


def burst_right_after_start(fe: Frontend) -> None:
    """Sent before the kernel said it was ready (a cell typed as the notebook opens, while
    the sandbox is still being claimed); the kernel is started without waiting for it."""
    fe.execute("import sys")
    fe.execute("%%host\nprint('on the host')", label="%%host", stop_on_error=False)  # takes a count too
    for code in ("b = 2", "b * 3", "b / 0", "print('aborted')"):
        fe.execute(code)
    fe.settle(timeout=180)


SCENARIOS: dict[str, t.Callable[[Frontend], None]] = {
    f.__name__: f
    for f in (
        run_all_stops_at_an_error, run_all_without_stop_on_error, error_while_the_queue_fills,
        burst_right_after_start, silent_and_unstored_cells, interrupt_mid_cell, magics, displays,
        clear_output, input_prompts, comms, introspection, history, shutdown_and_restart,
    )
}
