"""Every channel from a sandbox to the page, tried by a hostile notebook in a real JupyterLab
(Debian's Chromium, the "Python (sandbox)" kernel on the session's server): the rows of
README's channel table (kernel/channels.py).

One notebook holds one probe per row: a widget whose Label model is drawn by `HTMLView`, an
`HTML` widget, an `Image` with `format="url"`, a widget style with `url(...)`, LaTeX with
`\\style{...url(...)}`, a `set_next_input` that writes a `%%host` cell, a pager payload with
HTML, an `input()` prompt, a stream and an error holding HTML, and, after a save and a reload, the widget control
comm's answer. Each probe tries to mark the top page (`window.top.__owned`), to PUT a file
through /api/contents with the page's token, to get a host cell run by the next Run All (a
file it would write), or to make the browser fetch from an HTTP server of this test that
counts hits. With the kernel's rules: nothing, while ordinary widgets (a slider, `interact`,
a `tqdm.notebook` bar, an HTML table, an `Image` from PNG bytes) and math render.

The control: the same notebook on a second kernelspec whose only difference is
`SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS=1` (the documented pass-through, which sets every
channel rule aside and says so in `%sandbox`): the probes must then notice, row by row, or
the probe proves nothing. Rows JupyterLab itself already renders as text (streams, errors,
input prompts) cannot fire even then, nor did the LaTeX probe (JupyterLab's MathJax did not
fetch `\\style`'s url here): they are asserted harmless only.
Completions, inspection, `is_complete` and `user_expressions` are requests the page makes
on a user's keystroke, not on Run All: tests/kernel/test_frontend_protocol.py drives them.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import pathlib
import re
import sys
import tempfile
import threading
import time
import typing as t

import httpx
import pytest

import support
from kernel.install import kernel_spec
from test_browser_jupyterlab import CELL_MS, KERNEL_START_MS, Notebook, lab_page
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
        f"display(Math(r'\\style{{background-image: url({url}/latex-url/)}}{{x^2}}'))",
        f"get_ipython().set_next_input({host_cell}, replace=True)",
        f"get_ipython().payload_manager.write_payload({{'source': 'page', 'start': 0, "
        f"'data': {{'text/html': {attack('page')}, 'text/plain': 'pager text'}}}})",
        f"answer = input({attack('input-prompt')})",
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
    ]


ORDINARY = 8  # index of the first ordinary cell


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


def run_all(page: t.Any, nb: Notebook, n_cells: int) -> None:
    before = [nb.prompt(i) for i in range(n_cells)]
    page.locator(".lm-MenuBar-item").filter(has_text="Run").first.click()
    page.locator(".lm-Menu-item").filter(
        has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^\s*Run All Cells\s*$"))
    ).first.click()
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
        assert time.monotonic() < deadline, f"Run All did not finish: {prompts}"
        stdin = nb.panel.locator(".jp-Stdin-input")
        if stdin.count():  # the input() probe asks: answer, as a user would
            with contextlib.suppress(Exception):  # (answered meanwhile: the box is gone)
                stdin.first.fill("an answer", timeout=3_000)
                stdin.first.press("Enter", timeout=3_000)
        page.wait_for_timeout(300)
    # The kernel's status in the status bar (the toolbar's indicator stays busy after a
    # Run All that ended in an error).
    page.wait_for_function("() => /\\|\\s*Idle/.test((document.querySelector('#jp-main-statusbar') || {}).innerText"
                           " || '')", timeout=CELL_MS)
    page.wait_for_timeout(3_000)  # let fetches and handlers a probe started land


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
        r = httpx.get(f"{lab.base}/api/contents/{name}", params={"token": lab.token}, timeout=10)
        return r.status_code == 200 and bool(r.json()["content"]["cells"][ORDINARY]["outputs"])

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
            page.wait_for_function(f"() => (window.__owned || []).includes('{run}-widget-view-lie')",
                                   timeout=60_000)
    else:
        nb.output(ORDINARY).locator(".widget-slider").first.wait_for(state="visible", timeout=60_000)
    page.wait_for_timeout(3_000)
    return nb


def probe(page: t.Any, lab: t.Any, counter: HitCounter, run: str, kernel: str) -> tuple[Seen, Seen, Notebook]:
    """Run All twice (the second runs a host cell if the first wrote one), then save and
    reload; what the probes achieved after each."""
    marker = lab.root / f"host-ran-{run}.txt"
    sources = cells(run, counter.base, marker)
    write_notebook(lab.root, f"{run}.ipynb", kernel, sources)
    nb = open_notebook(page, lab, f"{run}.ipynb")
    run_all(page, nb, len(sources))
    run_all(page, nb, len(sources))
    first = seen(page, lab, counter, run, marker)
    nb = save_and_reload(page, lab, f"{run}.ipynb", len(sources), run)
    return first, seen(page, lab, counter, run, marker), nb


def test_no_channel_gives_the_sandbox_the_page(sandbox_server: support.Server) -> None:
    from playwright.sync_api import expect

    started = time.monotonic()
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="sbk-browser-channels-data-"))
    control_kernelspec(data_dir)
    with HitCounter() as counter, lab_page(sandbox_server, "channels", full_page=True,
                                            extra_env={"JUPYTER_PATH": str(data_dir)}) as (page, lab):
        first, reloaded, nb = probe(page, lab, counter, "guarded", "sandbox")
        print(f"with the rules: {first}; after reload: {reloaded}", flush=True)
        assert first == reloaded == Seen([], [], {}, False), (first, reloaded)
        check_ordinary_renders(page, nb, expect)

        control, control_reloaded, _ = probe(page, lab, counter, "control", CONTROL_KERNEL)
        print(f"control (rules off): {control}; after reload: {control_reloaded}", flush=True)
        for row in ("widget-view-lie", "widget-html", "page"):
            assert f"control-{row}" in control.owned, f"the {row} probe does not notice: {control}"
            assert f"owned-control-{row}.txt" in control.written, f"the {row} probe's PUT does not notice: {control}"
        assert control.hits.get("image-url") and control.hits.get("style-url"), control.hits
        assert control.host_ran, "the set_next_input probe does not notice"
        assert "control-widget-view-lie" in control_reloaded.owned, "the control comm's probe does not notice"
    with contextlib.suppress(OSError):
        for path in sorted(data_dir.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        data_dir.rmdir()
    print(f"channels browser test: {time.monotonic() - started:.0f} s", flush=True)


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
    nb.shot("channels-01-ordinary-widgets-and-math.png")  # README's docs/widgets-and-math.png
