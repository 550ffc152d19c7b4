"""Every channel from a sandbox to the page, tried by a hostile notebook in a real JupyterLab
(Debian's Chromium, the "Python (sandbox)" kernel on the session's server): the rows of
docs/security.md's channel table (kernel/channels.py).

One notebook holds one probe per row: a widget whose Label model is drawn by `HTMLView`, an
`HTML` widget, an `Image` with `format="url"`, a widget style with `url(...)`, LaTeX with
`\\style{...url(...)}`, a `set_next_input` that writes a `%%host` cell, a pager payload with
HTML, an `input()` prompt, a stream and an error holding HTML; then the keystroke channels, on
a sandbox whose own completer, inspector and is_complete a cell made hostile: Tab on matches
holding HTML, Shift+Tab on help holding HTML, Shift+Enter in a console on a hostile indent,
`user_expressions` holding HTML, and Tab on a `%%host` match that the user takes and runs;
and, after a save and a reload, the widget control comm's answer. Each probe tries to mark
the top page (`window.top.__owned`), to PUT a file through /api/contents with the page's
token, to get a host cell run (a file it would write), or to make the browser fetch from an
HTTP server of this test that counts hits. With the kernel's rules: nothing, while ordinary
widgets (a slider, `interact`, a `tqdm.notebook` bar, an HTML table, an `Image` from PNG
bytes) and math render.

The control: the same notebook on a second kernelspec whose only difference is
`SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS=1` (the documented pass-through, which sets every
channel rule aside and says so in `%sandbox`): the probes must then notice, row by row, or
the probe proves nothing. Some rows JupyterLab itself keeps harmless, so that they cannot
fire even then and are asserted harmless only:
- streams, errors and input prompts are shown as text;
- completion labels are written as escaped text (the popup shows `<b>` literally);
- the console reads only is_complete's status and indents by itself;
- LaTeX: JupyterLab 4 typesets with MathJax 3's Safe extension, which keeps only listed
  style properties (none that takes a `url()`), links of safe protocols only, classes and
  ids of MathJax's own pattern, and loads no `\\require`: no LaTeX makes it fetch or run.
`user_expressions` are never shown by JupyterLab: the page asks for them on its own kernel
connection and inserts the HTML it got into itself, as a frontend that showed them would.
The kernel's status text carries nothing from the sandbox, so it has no probe.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import pathlib
import re
import shutil
import sys
import tempfile
import threading
import time
import typing as t

import httpx
import pytest

import support
from kernel.install import kernel_spec
from test_browser_jupyterlab import CELL_MS, KERNEL_START_MS, Notebook, lab_page, saved_notebook
from test_browser_jupyterlab import pytestmark as browser_pytestmark
from test_browser_output_isolation import accept_kernel_dialog
from test_browser_widgets import WIDGETS_MISSING

pytestmark = [
    *browser_pytestmark,  # slow, timeout, skip without a browser
    pytest.mark.skipif(WIDGETS_MISSING is not None, reason=f"widget manager missing: {WIDGETS_MISSING}"),
]

CONTROL_KERNEL = "sandbox-unsafe-control"

# Runs wherever it lands: marks the top page and PUTs a file with the page's token.
PAYLOAD = (
    "(function(){var tag='TAG';"
    "try{window.top.__owned=(window.top.__owned||[]).concat([tag])}catch(e){}"
    "var tok='';try{tok=JSON.parse(window.top.document.getElementById('jupyter-config-data').textContent).token}"
    "catch(e){}"
    "try{fetch('/api/contents/owned-'+tag+'.txt',{method:'PUT',headers:{'Content-Type':'application/json',"
    "'Authorization':'token '+tok},body:JSON.stringify({type:'file',format:'text',content:tag})})}catch(e){}"
    "})();"
)


class HitCounter:
    """An HTTP server on loopback that counts the requests for each path (the browser's
    fetches of addresses a sandbox chose)."""

    def __init__(self) -> None:
        hits: dict[str, int] = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                hits[self.path] = hits.get(self.path, 0) + 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: t.Any) -> None:
                pass

        self.hits = hits
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HitCounter:
        self.thread.start()
        return self

    def __exit__(self, *exc: t.Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of(self, run: str) -> dict[str, int]:
        return {path.split("/")[2]: n for path, n in self.hits.items() if path.startswith(f"/{run}/")}


def cells(run: str, fetch_base: str, marker: pathlib.Path) -> list[str]:
    def attack(tag: str) -> str:
        js = PAYLOAD.replace("TAG", f"{run}-{tag}")
        return json.dumps(f'<img src=x onerror="{js}">')

    url = f"{fetch_base}/{run}"
    host_cell = json.dumps(f"%%host\nopen({str(marker)!r}, 'w').write('a host cell ran')\n")
    return [
        "import ipywidgets as w\nfrom IPython.display import display, Math, Latex\n"
        "import traitlets\nclass Lie(w.Label):\n    _view_name = traitlets.Unicode('HTMLView').tag(sync=True)\n"
        f"display(Lie({attack('widget-view-lie')}))",
        f"display(w.HTML({attack('widget-html')} + '<b>html widget</b>'))",
        f"display(w.Image(value=b'{url}/image-url/', format='url'))",
        f"display(w.HTML('styled', style={{'background': 'url({url}/style-url/)'}}))",
        f"display(Math(r'\\style{{background-image: url({url}/latex-url/)}}{{x^2}}'))\n"
        f"display(Math(r'\\style{{background: url({url}/latex-background/)}}{{y}} \\require{{{url}/latex-require/x.js}}'))",
        f"get_ipython().set_next_input({host_cell}, replace=True)",
        f"get_ipython().payload_manager.write_payload({{'source': 'page', 'start': 0, "
        f"'data': {{'text/html': {attack('page')}, 'text/plain': 'pager text'}}}})",
        f"answer = input({attack('input-prompt')})",
        keystroke_sandbox(attack, url, marker),
        # Ordinary things that must still render.
        "import io, matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(2.4, 1.2)); plt.bar(['a', 'b', 'c'], [3, 1, 2]); buf = io.BytesIO()\n"
        "plt.savefig(buf, format='png'); plt.close()\n"
        "display(w.VBox([w.IntSlider(7, description='slider'),\n"
        "                w.HTML('<table><tr><th>campaign</th><th>clicks</th></tr><tr><td>summer</td><td>95</td></tr>"
        "</table>'),\n"
        "                w.Image(value=buf.getvalue(), format='png', width='240')]))",
        "@w.interact(x=(0, 20))\ndef square(x=3):\n    print(f'square of {x} is {x * x}')",
        "from tqdm.notebook import tqdm\nfor _ in tqdm(range(30), desc='steps'):\n    pass",
        "display(Math(r'\\int_0^1 x\\,dx = \\frac{1}{2}'))\n"
        "display(Latex(r'The mean $\\bar{x} = \\frac{1}{n}\\sum_i x_i$ of the clicks'))",
        # Last: an error ends Run All.
        f"print({attack('stream')})\nraise ValueError({attack('error')})",
        # Past the error: text a user presses Tab / Shift+Tab in (Run All may reach them too: harmless).
        *KEYSTROKE_CELLS,
    ]


ORDINARY = 9  # index of the first ordinary cell
KEYSTROKE_CELLS = ("hostile_html_completion", "hostile_help", "hostile_completion")
FIRST_KEYSTROKE = ORDINARY + 5  # index of the first of them (after the error cell)
HOSTILE_INDENT = "    # hostile-indent\n%%host\nprint('an indent ran on the host')\n"


def keystroke_sandbox(attack: t.Callable[[str], str], url: str, marker: pathlib.Path) -> str:
    """A cell that makes the sandbox's own completer, inspector and is_complete hostile (the
    runtime in the sandbox is the sandbox's code: a cell may replace its functions), and
    defines an object whose HTML representation is an attack, for `user_expressions`.

    Completing `hostile_completion` offers a `%%host` cell that writes a marker file (and a
    harmless name, so that a guarded page has one match to insert); completing
    `hostile_html_completion` offers matches holding HTML; help on `hostile_help` is HTML
    with an image from the counting server (a new address per request: the browser would
    not fetch one it has cached) and an `onerror` attack; `hostile_is_complete` is
    incomplete, with an indent holding a `%%host` cell. The answers are immediate (Jedi's
    first answer takes seconds)."""


    host_cell = json.dumps(f"%%host\n# hostile_completion\n"
                           f"open({str(marker.with_name(marker.stem + '-completion.txt'))!r}, 'w')"
                           f".write('a completion ran on the host')\n")
    return (
        "import sys, itertools\n"
        "intro = next(m for n, m in list(sys.modules.items()) if n.endswith('.introspection')"
        " and hasattr(m, 'is_complete'))\n"
        "intro.originals = getattr(intro, 'originals', (intro.complete, intro.inspect, intro.is_complete))\n"
        "complete0, inspect0, is_complete0 = intro.originals\n"
        "asked = itertools.count()\n"
        "def answer(message, **content):\n"
        "    return {'type': 'reply', 'id': message.get('id'), 'metadata': {}, **content}\n"
        "def hostile_complete(shell, message):\n"
        "    code = message.get('code', '')\n"
        "    if code.startswith('hostile_html_completion'):\n"
        f"        matches = [code + '_a' + {attack('completion-html')}, code + '_b<b>b</b>']\n"
        "    elif code.startswith('hostile_completion'):\n"
        f"        matches = [{host_cell}, 'hostile_completion_ok']\n"
        "    else:\n"
        "        return complete0(shell, message)\n"
        "    return answer(message, matches=matches, cursor_start=0, cursor_end=len(code))\n"
        "def hostile_inspect(shell, message, frame_limit):\n"
        "    if not message.get('code', '').startswith('hostile_help'):\n"
        "        return inspect0(shell, message, frame_limit)\n"
        f"    html = f'<img src=\"{url}/inspect-{{next(asked)}}/\">' + {attack('inspect')}\n"
        "    return answer(message, found=True, data={'text/plain': 'hostile help text', 'text/html': html})\n"
        "def hostile_is_complete(shell, message):\n"
        "    if not message.get('code', '').startswith('hostile_is_complete'):\n"
        "        return is_complete0(shell, message)\n"
        f"    return answer(message, status='incomplete', indent={json.dumps(HOSTILE_INDENT)})\n"
        "intro.complete, intro.inspect, intro.is_complete = hostile_complete, hostile_inspect, hostile_is_complete\n"
        "hostile_completion_ok = 1\n"
        "class Expression:\n"
        f"    def _repr_html_(self):\n        return f'<img src=\"{url}/user-expressions/\">' + "
        f"{attack('user-expressions')}\n"
        "hostile_expression = Expression()"
    )


def write_notebook(root: pathlib.Path, name: str, kernel: str, sources: list[str]) -> None:
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                     "source": src} for i, src in enumerate(sources)],
          "metadata": {"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    (root / name).write_text(json.dumps(nb))


def control_kernelspec(data_dir: pathlib.Path) -> None:
    """The sandbox kernel with the pass-through on: the probes' control."""
    _name, spec = kernel_spec(python=sys.executable)
    spec.setdefault("env", {})["SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS"] = "1"
    spec["display_name"] = "Python (sandbox, rules off: test control)"
    target = data_dir / "kernels" / CONTROL_KERNEL
    target.mkdir(parents=True)
    (target / "kernel.json").write_text(json.dumps(spec))


def run_all(page: t.Any, nb: Notebook, n_cells: int, required: int | None = None) -> None:
    """Run All, and wait until its cells have run. ``required``: the first cells that must
    have run; the rest may stay unrun when the deadline comes (the control's page, which the
    hostile widgets own with the rules off, once stopped queueing after the probes)."""
    required = n_cells if required is None else required
    before = [nb.prompt(i) for i in range(n_cells)]
    nb.click_run_all()
    deadline = time.monotonic() + CELL_MS / 1000 * 4  # 13 cells on a loaded 2-core machine
    # Cells run in order: the probes have all run when one of the last two cells has a new
    # count and no earlier one is still queued. (On this loaded machine JupyterLab was seen
    # to leave one cell's prompt at [ ] after it ran, and once the last cell at [*] with the
    # kernel idle: the wait depends on neither alone.)
    while True:
        prompts = [nb.prompt(i) for i in range(n_cells)]
        done = [re.fullmatch(r"\[\d+\]:", p) is not None and p != b for p, b in zip(prompts[-2:], before[-2:])]
        if any(done) and "[*]:" not in prompts[:-1]:
            break
        if time.monotonic() >= deadline:
            ran = [re.fullmatch(r"\[\d+\]:", p) is not None and p != b for p, b in zip(prompts, before)]
            assert required < n_cells and all(ran[:required]), f"Run All did not finish: {prompts}"
            print(f"Run All left cells {required}-{n_cells - 1} unrun (not needed here): {prompts}", flush=True)
            break
        stdin = nb.panel.locator(".jp-Stdin-input")
        if stdin.count():  # the input() probe asks: answer, as a user would
            with contextlib.suppress(Exception):  # (answered meanwhile: the box is gone)
                stdin.first.fill("an answer", timeout=3_000)
                stdin.first.press("Enter", timeout=3_000)
        page.wait_for_timeout(300)
    wait_idle(page)
    page.wait_for_timeout(3_000)  # let fetches and handlers a probe started land


def wait_idle(page: t.Any) -> None:
    """The kernel's status in the status bar (the toolbar's indicator stays busy after a
    Run All that ended in an error)."""
    page.wait_for_function("() => /\\|\\s*Idle/.test((document.querySelector('#jp-main-statusbar') || {}).innerText"
                           " || '')", timeout=CELL_MS)


class Seen(t.NamedTuple):
    owned: list[str]
    written: list[str]
    hits: dict[str, int]
    host_ran: bool


def seen(page: t.Any, lab: t.Any, counter: HitCounter, run: str, marker: pathlib.Path) -> Seen:
    owned = page.evaluate("() => window.__owned || []")
    listing = httpx.get(f"{lab.base}/api/contents", params={"token": lab.token}, timeout=10).json()
    written = sorted(item["name"] for item in listing["content"] if item["name"].startswith(f"owned-{run}-"))
    return Seen(sorted(o for o in owned if o.startswith(f"{run}-")), written, counter.of(run), marker.exists())


def open_notebook(page: t.Any, lab: t.Any, name: str) -> Notebook:
    page.goto(f"{lab.base}/lab/tree/{name}?token={lab.token}", wait_until="domcontentloaded")
    nb = Notebook(page)
    nb.panel.wait_for(state="visible", timeout=120_000)
    accept_kernel_dialog(page)
    nb.wait_status("idle", KERNEL_START_MS)
    return nb


def save_and_reload(page: t.Any, lab: t.Any, name: str, n_cells: int, run: str) -> Notebook:
    """As a user reopening the notebook: the widget manager then asks the kernel for every
    model's state on the control comm.

    The wait for that answer differs by run. With the rules, the ordinary slider comes back.
    Without them (the control), the hostile models come back too and their scripts own the
    page, which may leave the ordinary views undrawn (seen once in CI): there the sign that
    the answer arrived is the view-name lie firing again, which is what the control asserts."""
    # The toolbar's save button (a key press may land in a frame or the stdin box).
    nb = Notebook(page)
    nb.panel.locator('.jp-NotebookPanel-toolbar [data-command="docmanager:save"]').first.click()

    def saved() -> bool:
        on_disk = saved_notebook(lab, name)
        return bool(on_disk and on_disk["cells"][ORDINARY]["outputs"])

    assert support.wait_for(saved, 60, interval=0.5), f"{name} was not saved with its outputs"
    page.reload(wait_until="domcontentloaded")
    nb = Notebook(page)
    nb.panel.wait_for(state="visible", timeout=120_000)
    accept_kernel_dialog(page)
    nb.cells.nth(n_cells - 1).wait_for(state="attached", timeout=60_000)
    nb.wait_status("idle", KERNEL_START_MS)
    # The widgets are back (from the control comm's answer) before the probes are read.
    if run == "control":
        with contextlib.suppress(Exception):  # (not firing is what the control's assertion reports)
            # (150 s: on a loaded host the reloaded page's kernel and its comm answer came
            # later than 60 s once, and the control then reported nothing)
            page.wait_for_function(f"() => (window.__owned || []).includes('{run}-widget-view-lie')",
                                   timeout=150_000)
    else:
        nb.output(ORDINARY).locator(".widget-slider").first.wait_for(state="visible", timeout=60_000)
    page.wait_for_timeout(3_000)
    return nb


class Probed(t.NamedTuple):
    run_all: Seen  # after Run All, twice
    keystrokes: Seen  # what the keystroke probes added
    reloaded: Seen  # after a save and a reload
    nb: Notebook
    shown: dict[str, t.Any]  # what the keystroke probes showed


def probe(page: t.Any, lab: t.Any, counter: HitCounter, run: str, kernel: str) -> Probed:
    """Run All twice (the second runs a host cell if the first wrote one), the keystroke
    probes, then save and reload; what the probes achieved after each."""
    marker = lab.root / f"host-ran-{run}.txt"
    sources = cells(run, counter.base, marker)
    write_notebook(lab.root, f"{run}.ipynb", kernel, sources)
    nb = open_notebook(page, lab, f"{run}.ipynb")
    # The control needs its probes run (the cells before the ordinary ones), the guarded run all.
    required = ORDINARY if run == "control" else FIRST_KEYSTROKE
    run_all(page, nb, FIRST_KEYSTROKE, required)
    run_all(page, nb, FIRST_KEYSTROKE, required)
    first = seen(page, lab, counter, run, marker)
    keys = keystrokes(page, lab, nb, run)
    after_keys = seen(page, lab, counter, run, marker.with_name(f"{marker.stem}-completion.txt"))
    added = Seen(sorted(set(after_keys.owned) - set(first.owned)), sorted(set(after_keys.written) - set(first.written)),
                 {k: n for k, n in after_keys.hits.items() if k not in first.hits}, after_keys.host_ran)
    print(f"{run} keystroke probes showed: {keys}", flush=True)
    nb = save_and_reload(page, lab, f"{run}.ipynb", len(sources), run)
    return Probed(first, added, seen(page, lab, counter, run, marker), nb, keys)


def focus_end(nb: Notebook, index: int) -> None:
    """The cursor at the end of cell `index`'s text, in edit mode, as a user's click puts it."""
    nb.cells.nth(index).locator(".cm-content").first.click()
    nb.page.keyboard.press("Control+End")


def editor_text(nb: Notebook, index: int) -> str:
    return nb.cells.nth(index).locator(".cm-content").first.inner_text().replace("\u00a0", " ").strip()


def keystrokes(page: t.Any, lab: t.Any, nb: Notebook, run: str) -> dict[str, t.Any]:
    """The channels a user's keystroke asks for, on the sandbox made hostile by
    `keystroke_sandbox`; what the page showed (the probes' effects are read by `seen`)."""
    shown: dict[str, t.Any] = {}
    wait_idle(page)  # (Run All may have gone past the error into the cells below)
    completer = page.locator(".jp-Completer:visible")
    # Tab: matches holding HTML. JupyterLab writes completion labels as escaped text.
    focus_end(nb, FIRST_KEYSTROKE)
    page.keyboard.press("Tab")
    completer.first.wait_for(state="visible", timeout=CELL_MS)
    shown["completion-html"] = completer.first.inner_text()
    page.keyboard.press("Escape")
    # Shift+Tab: the tooltip renders the inspect reply's preferred type (HTML, sanitized,
    # whose images it fetches) from whatever the kernel sent.
    focus_end(nb, FIRST_KEYSTROKE + 1)
    page.keyboard.press("Shift+Tab")
    tooltip = page.locator(".jp-Tooltip:visible").first
    tooltip.wait_for(state="visible", timeout=CELL_MS)
    page.wait_for_function("() => { const t = document.querySelector('.jp-Tooltip');"
                           " return t && (t.innerText.includes('hostile help text') || t.querySelector('img')); }",
                           timeout=CELL_MS)
    shown["tooltip"] = tooltip.inner_html()
    page.keyboard.press("Escape")
    # user_expressions: JupyterLab never shows them, so the page asks on its own kernel
    # connection and puts the HTML it got into the page, as a frontend that showed them would.
    shown["user-expressions"] = ask_user_expressions(page, lab, run)
    shown["console"] = console_is_complete(page)
    # Tab where the sandbox offers a `%%host` cell, which the user takes and runs.
    focus_end(nb, FIRST_KEYSTROKE + 2)
    page.keyboard.press("Tab")
    page.wait_for_function(f"() => document.querySelector('.jp-Completer:not(.lm-mod-hidden)') || "
                           f"[...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')]"
                           f"[{FIRST_KEYSTROKE + 2}].querySelector('.cm-content').innerText.trim() !== 'hostile_completion'",
                           timeout=CELL_MS)
    if completer.count():
        offered = completer.first.locator(".jp-Completer-item").filter(has_text="%%host")
        shown["completion-offered"] = completer.first.inner_text()
        # The user takes the `%%host` match if offered, else the first.
        offered.first.click() if offered.count() else page.keyboard.press("Enter")
        completer.first.wait_for(state="hidden", timeout=30_000)
        focus_end(nb, FIRST_KEYSTROKE + 2)
    shown["completion-taken"] = editor_text(nb, FIRST_KEYSTROKE + 2)
    before = nb.prompt(FIRST_KEYSTROKE + 2)  # (Run All may have reached the cell, past the error)
    page.keyboard.press("Shift+Enter")
    page.wait_for_function("([i, before]) => { const p = [...document.querySelectorAll("
                           "'.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')][i].querySelector('.jp-InputPrompt')"
                           ".innerText.trim(); return /^\\[\\d+\\]:$/.test(p) && p !== before; }",
                           arg=[FIRST_KEYSTROKE + 2, before], timeout=CELL_MS)
    wait_idle(page)
    page.wait_for_timeout(3_000)  # let fetches and handlers a probe started land
    return shown


def console_is_complete(page: t.Any) -> str:
    """Shift+Enter in a console on the notebook's kernel, on code the sandbox calls
    incomplete with an indent holding a `%%host` cell: JupyterLab 4 reads only the status
    (its editor indents by itself), so the indent cannot reach the page even in the control.
    What the console's editors hold after."""
    page.keyboard.press("Escape")
    page.keyboard.press("Control+Shift+C")  # the command palette
    palette = page.locator(".lm-CommandPalette-input:visible").first
    palette.fill("New Console for Notebook")
    page.locator(".lm-CommandPalette-item:visible").filter(has_text="New Console for Notebook").first.click()
    console = page.locator(".jp-CodeConsole:visible").first
    prompt = console.locator(".jp-CodeConsole-promptCell .cm-content").first
    prompt.wait_for(state="visible", timeout=CELL_MS)
    wait_idle(page)
    prompt.click()
    page.keyboard.insert_text("hostile_is_complete")
    page.keyboard.press("Shift+Enter")
    # Incomplete: a new line in the prompt. (JupyterLab runs the code instead if the answer
    # takes over its 250 ms: either way the indent is not used.)
    page.wait_for_function("() => { const c = document.querySelector('.jp-CodeConsole');"
                           " return c.querySelectorAll('.jp-CodeConsole-promptCell .cm-line').length > 1"
                           " || c.querySelectorAll('.jp-CodeConsole-content .jp-Cell').length > 0; }",
                           timeout=CELL_MS)
    page.wait_for_timeout(1_000)
    held = console.locator(".cm-content").all_inner_texts()
    page.keyboard.press("Alt+W")  # close the console (the notebook keeps the kernel)
    with contextlib.suppress(Exception):
        page.locator(".jp-Dialog .jp-mod-reject").first.click(timeout=3_000)
    console.wait_for(state="detached", timeout=30_000)
    return "\n".join(held)


def ask_user_expressions(page: t.Any, lab: t.Any, run: str) -> t.Any:
    sessions = httpx.get(f"{lab.base}/api/sessions", params={"token": lab.token}, timeout=10).json()
    (kernel_id,) = [s["kernel"]["id"] for s in sessions if s["path"] == f"{run}.ipynb"]
    url = f"ws://127.0.0.1:{lab.port}/api/kernels/{kernel_id}/channels?token={lab.token}"
    return page.evaluate("""async (url) => {
        const ws = new WebSocket(url);
        await new Promise((ok, bad) => { ws.onopen = ok; ws.onerror = bad; });
        const id = 'user-expressions-' + Math.random().toString(16).slice(2);
        const reply = new Promise(ok => { ws.onmessage = ev => {
            const m = JSON.parse(ev.data);
            if (m.msg_type === 'execute_reply' && m.parent_header.msg_id === id) ok(m.content);
        }; });
        ws.send(JSON.stringify({channel: 'shell', buffers: [], metadata: {}, parent_header: {},
            header: {msg_id: id, msg_type: 'execute_request', username: 'probe', session: id, version: '5.3',
                     date: new Date().toISOString()},
            content: {code: 'pass', silent: true, store_history: false, allow_stdin: false, stop_on_error: false,
                      user_expressions: {probe: 'hostile_expression'}}}));
        const content = await reply;
        ws.close();
        const value = (content.user_expressions || {}).probe || {};
        const shown = document.createElement('div');
        shown.innerHTML = (value.data || {})['text/html'] || '';
        document.body.appendChild(shown);
        return value;
    }""", url)


def test_no_channel_gives_the_sandbox_the_page(sandbox_server: support.Server) -> None:
    from playwright.sync_api import expect

    started = time.monotonic()
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="sbk-browser-channels-data-"))
    try:
        probe_both(sandbox_server, data_dir, expect)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"channels browser test: {time.monotonic() - started:.0f} s", flush=True)


def probe_both(sandbox_server: support.Server, data_dir: pathlib.Path, expect: t.Any) -> None:
    """The guarded run, then the control (the rules off, through a kernelspec in `data_dir`)."""
    control_kernelspec(data_dir)
    with HitCounter() as counter, lab_page(sandbox_server, "channels", full_page=True,
                                            extra_env={"JUPYTER_PATH": str(data_dir)}) as (page, lab):
        guarded = probe(page, lab, counter, "guarded", "sandbox")
        print(f"with the rules: {guarded.run_all}; keystrokes: {guarded.keystrokes}; "
              f"after reload: {guarded.reloaded}", flush=True)
        assert guarded.run_all == guarded.keystrokes == guarded.reloaded == Seen([], [], {}, False), guarded[:3]
        check_keystrokes_shown(guarded.shown, "guarded")
        check_ordinary_renders(page, guarded.nb, expect)

        control = probe(page, lab, counter, "control", CONTROL_KERNEL)
        print(f"control (rules off): {control.run_all}; keystrokes: {control.keystrokes}; "
              f"after reload: {control.reloaded}", flush=True)
        first, keys = control.run_all, control.keystrokes
        for row in ("widget-view-lie", "widget-html", "page"):
            assert f"control-{row}" in first.owned, f"the {row} probe does not notice: {first}"
            assert f"owned-control-{row}.txt" in first.written, f"the {row} probe's PUT does not notice: {first}"
        assert first.hits.get("image-url") and first.hits.get("style-url"), first.hits
        assert first.host_ran, "the set_next_input probe does not notice"
        assert "control-widget-view-lie" in control.reloaded.owned, "the control comm's probe does not notice"
        # The keystroke rows: the tooltip fetched the inspect reply's image, the completion
        # wrote a host cell that ran, the user_expressions HTML ran in the page.
        assert any(k.startswith("inspect-") for k in keys.hits), f"the inspection probe does not notice: {keys}"
        assert keys.host_ran, f"the completion probe does not notice: {keys}"
        check_keystrokes_shown(control.shown, "control")
        assert "control-user-expressions" in keys.owned and "owned-control-user-expressions.txt" in keys.written \
            and keys.hits.get("user-expressions"), f"the user_expressions probe does not notice: {keys}"


def check_keystrokes_shown(shown: dict[str, t.Any], run: str) -> None:
    """What the keystroke probes showed, in both runs: completion labels and the console's
    editor are JupyterLab's own text (harmless only); the rest by run."""
    assert "_b<b>b</b>" in shown["completion-html"], shown  # the label as text, not as markup
    assert "hostile-indent" not in shown["console"], shown
    if run == "guarded":
        assert shown["completion-taken"] == "hostile_completion_ok", shown
        assert "hostile help text" in shown["tooltip"] and "<img" not in shown["tooltip"], shown
        assert shown["user-expressions"]["data"]["text/html"].startswith("<iframe"), shown
    else:
        assert shown["completion-taken"].startswith("%%host"), shown


def check_ordinary_renders(page: t.Any, nb: Notebook, expect: t.Any) -> None:
    """What the hostile cells left visible, and the ordinary widgets and math."""
    expect(nb.output(0)).to_contain_text("widget not shown")
    expect(nb.output(2)).to_contain_text("fetch an address chosen by the sandbox")
    expect(nb.output(3)).to_contain_text("dropped")
    expect(nb.output(5)).to_contain_text("only %load may")
    widgets = nb.output(ORDINARY)
    expect(widgets.locator(".widget-slider").first).to_be_visible(timeout=30_000)
    expect(widgets.locator(".widget-html-content table")).to_contain_text("summer")
    image = widgets.locator("img.widget-image, .widget-image img, img").first
    expect(image).to_be_visible()
    page.wait_for_function("el => el.naturalWidth > 100", arg=image.element_handle(), timeout=30_000)
    expect(nb.output(ORDINARY + 1)).to_contain_text("square of 3 is 9", timeout=30_000)
    expect(nb.output(ORDINARY + 2)).to_contain_text("30/30", timeout=30_000)
    math = nb.output(ORDINARY + 3).locator("iframe.sandbox-output")
    expect(math).to_have_count(2)
    frame = math.first.element_handle().content_frame()
    expect(frame.locator("math msubsup")).to_have_count(1)
    assert frame.evaluate("() => document.querySelector('math').getBoundingClientRect().width") > 20
    nb.cells.nth(ORDINARY).evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(500)
    nb.shot("channels-01-ordinary-widgets-and-math.png")  # docs/widgets-and-math.png
