"""Two allowed things composed, tried in a real JupyterLab (Debian's Chromium, the "Python
(sandbox)" kernel on the session's server): widget links, and a framed output's WebRTC.

Widget links (kernel/widget_links.py): each widget below passes the kernel's rules alone, and a
`jsdlink` then asks the page to copy one into another after the kernel filtered both: a `Text`
holding an `<img onerror>` into an `HTML` widget's value, `'HTMLView'` into a `Label`'s
`_view_name`, `url(...)` into an HTML widget's style `background`, `'url'` into an `Image`'s
`format`. The probes look where the effect lands: a file PUT through `/api/contents` with the
page's token (looked for on disk), `window.__owned` in the page, and requests counted by a
local HTTP server. A link between plain values (a slider into an integer field) still works.

WebRTC (kernel/frame_prelude.py): framed outputs open an `RTCPeerConnection` whose STUN server
is a UDP socket of this test, directly, from a nested `srcdoc` frame, and from one written by
`innerHTML`; the socket counts the packets the browser sends.

Controls: the same notebook on a kernelspec with the documented pass-through on (every rule
off), where every probe must fire; and, in the guarded page, the same WebRTC frame as the
kernel builds it but without its prelude, which must send packets.
"""

from __future__ import annotations

import html
import json
import pathlib
import re
import shutil
import socket
import tempfile
import threading
import time
import typing as t

import httpx
import pytest

import support
from kernel import frames
from kernel.frame_prelude import PRELUDE
from test_browser_channels import CONTROL_KERNEL, PAYLOAD, HitCounter, control_kernelspec, open_notebook, wait_idle, \
    write_notebook
from test_browser_jupyterlab import CELL_MS, lab_page
from test_browser_jupyterlab import pytestmark as browser_pytestmark
from test_browser_widgets import WIDGETS_MISSING

pytestmark = [
    *browser_pytestmark,  # slow, timeout, skip without a browser
    pytest.mark.skipif(WIDGETS_MISSING is not None, reason=f"widget manager missing: {WIDGETS_MISSING}"),
]

LINK_PROBES = ("link-html", "link-view")  # run script in the page
FETCH_PROBES = ("link-style", "link-image")  # make the browser fetch


class StunCounter:
    """A UDP socket on loopback that counts the datagrams it receives (a browser's STUN
    binding requests to the address a sandbox chose)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self.running = True
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        while self.running:
            try:
                self.sock.recvfrom(4096)
                self.count += 1
            except socket.timeout:
                continue
            except OSError:
                return

    def close(self) -> None:
        self.running = False
        self.thread.join(timeout=5)
        self.sock.close()


def rtc_attack(port: int) -> str:
    """JavaScript that makes the browser send STUN packets to 127.0.0.1:`port`."""
    return (f"var pc = new RTCPeerConnection({{iceServers: [{{urls: 'stun:127.0.0.1:{port}'}}]}});"
            "pc.createDataChannel('x');"
            "pc.createOffer().then(function (o) { return pc.setLocalDescription(o); });")


def script_in_js_string(markup: str) -> str:
    """`markup` as a JavaScript string literal that may sit inside a `<script>` element."""
    return json.dumps(markup).replace("</", "<\\/")


def rtc_outputs(port: int) -> dict[str, str]:
    """HTML outputs that try WebRTC: directly, from a nested `srcdoc` frame, and from one a
    script writes with `innerHTML`."""
    rtc = rtc_attack(port)
    nested = f'<iframe srcdoc="{html.escape(f"<script>{rtc}</script>", quote=True)}"></iframe>'
    written = f"<div id=d></div><script>document.getElementById('d').innerHTML = {script_in_js_string(nested)}</script>"
    return {"direct": f"<script>{rtc}</script>", "nested": nested, "written": written}


def cells(run: str, fetch_base: str, stun_port: int) -> list[str]:
    def attack(tag: str) -> str:
        return f'<img src=x onerror="{PAYLOAD.replace("TAG", f"{run}-{tag}")}">'

    url = f"{fetch_base}/{run}"
    return [
        "import time\nimport ipywidgets as w\nfrom IPython.display import display, HTML\n"
        f"text = w.Text({json.dumps(attack('link-html'))})\nshown = w.HTML('an html widget')\n"
        "display(text, shown)\nw.jsdlink((text, 'value'), (shown, 'value'))",
        f"label = w.Label({json.dumps(attack('link-view'))})\nview = w.Text('HTMLView')\n"
        "w.jsdlink((view, 'value'), (label, '_view_name'))\ntime.sleep(1)\ndisplay(label)",
        f"styled = w.HTML('styled by a link')\nbackground = w.Text('url({url}/link-style/)')\n"
        "w.jsdlink((background, 'value'), (styled.style, 'background'))\ndisplay(styled)",
        f"image = w.Image(value=b'{url}/link-image/', format='png')\nfmt = w.Text('url')\n"
        "w.jsdlink((fmt, 'value'), (image, 'format'))\ndisplay(image)",
        # A link between plain values: still carried.
        "slider = w.IntSlider(7)\nfield = w.IntText(0)\nw.jslink((slider, 'value'), (field, 'value'))\n"
        "display(w.HBox([slider, field]))",
        "".join(f"display(HTML({json.dumps(output)}))\n" for output in rtc_outputs(stun_port).values()),
        "print('done')",
    ]


ALLOWED_LINK = 4  # index of the plain-value link's cell


class Effects(t.NamedTuple):
    owned: list[str]  # tags that ran script in the page
    written: list[str]  # files PUT through /api/contents, found on disk
    hits: dict[str, int]  # fetches of addresses a sandbox chose
    stun: int  # STUN packets sent


def effects(page: t.Any, lab: t.Any, counter: HitCounter, run: str, stun: StunCounter) -> Effects:
    owned = sorted(o for o in page.evaluate("() => window.__owned || []") if o.startswith(f"{run}-"))
    written = sorted(p.name for p in lab.root.glob(f"owned-{run}-*"))
    return Effects(owned, written, counter.of(run), stun.count)


def probe(page: t.Any, lab: t.Any, counter: HitCounter, run: str, kernel: str, stun: StunCounter) -> Effects:
    sources = cells(run, counter.base, stun.port)
    write_notebook(lab.root, f"{run}.ipynb", kernel, sources)
    nb = open_notebook(page, lab, f"{run}.ipynb")
    run_all_cells(page, nb, len(sources))
    page.wait_for_timeout(5_000)  # ICE gathering, fetches and handlers a probe started
    seen = effects(page, lab, counter, run, stun)
    print(f"{run}: {seen}", flush=True)
    if run == "guarded":
        from playwright.sync_api import expect

        assert seen == Effects([], [], {}, 0), seen
        for index in range(4):
            expect(nb.output(index)).to_contain_text("was not carried")
        field = nb.output(ALLOWED_LINK).locator(".widget-text input").first
        expect(field).to_have_value("7", timeout=30_000)
    return seen


def run_all_cells(page: t.Any, nb: t.Any, n_cells: int) -> None:
    """Run All. The last cell's `done` (or its count) is the sign that every cell ran (they
    run in order): a prompt may stay at ``[*]`` after its cell ran, the last one's too (the
    control's page, which the probes' scripts own with the rules off, kept cell 3's and
    cell 7's at ``[*]`` with cells 4-6 counted and the kernel idle; and, on
    this loaded machine, once the WebRTC cell's with the rules on)."""
    nb.click_run_all()
    before = nb.prompt(n_cells - 1)
    last_output = nb.cells.nth(n_cells - 1).locator(".jp-Cell-outputArea")

    def last_cell_ran() -> bool:
        prompt = nb.prompt(n_cells - 1)
        counted = re.fullmatch(r"\[\d+\]:", prompt) is not None and prompt != before
        return counted or any(text.strip() == "done" for text in last_output.all_inner_texts())

    deadline = time.monotonic() + CELL_MS / 1000 * 4
    while not last_cell_ran():
        assert time.monotonic() < deadline, f"Run All did not reach the last cell: {nb.prompt(n_cells - 1)}"
        page.wait_for_timeout(500)
    print(f"Run All reached the last cell: its prompt {nb.prompt(n_cells - 1)}, its output "
          f"{[text.strip() for text in last_output.all_inner_texts()]}", flush=True)
    wait_idle(page)


def frames_without_prelude(page: t.Any) -> dict[str, int]:
    """The control for the prelude: each WebRTC output's frame exactly as the kernel builds it,
    less the prelude, put into the page; the STUN packets each sent."""
    sent = {}
    prelude = html.escape(f"<script>{PRELUDE}</script>", quote=True)
    for name in rtc_outputs(0):
        stun = StunCounter()
        try:
            framed = frames.framed_html("text/html", rtc_outputs(stun.port)[name])
            assert prelude in framed
            page.evaluate("(markup) => { const d = document.createElement('div'); d.innerHTML = markup;"
                          " document.body.appendChild(d); }", framed.replace(prelude, ""))
            page.wait_for_timeout(5_000)
        finally:
            stun.close()
        sent[name] = stun.count
    return sent


@pytest.mark.slow
def test_links_and_frames_give_the_sandbox_neither_the_page_nor_a_network(sandbox_server: support.Server) -> None:
    started = time.monotonic()
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="sbk-browser-composition-data-"))
    stuns = {name: StunCounter() for name in ("guarded", "control")}
    try:
        control_kernelspec(data_dir)
        with HitCounter() as counter, lab_page(sandbox_server, "composition",
                                                extra_env={"JUPYTER_PATH": str(data_dir)}) as (page, lab):
            probe(page, lab, counter, "guarded", "sandbox", stuns["guarded"])  # asserts nothing fired
            without_prelude = frames_without_prelude(page)
            print(f"frames without their prelude sent STUN packets: {without_prelude}", flush=True)
            control = probe(page, lab, counter, "control", CONTROL_KERNEL, stuns["control"])
            listing = httpx.get(f"{lab.base}/api/contents", params={"token": lab.token}, timeout=10).json()
            print(f"files in the notebook's folder: {sorted(i['name'] for i in listing['content'])}", flush=True)
    finally:
        for stun in stuns.values():
            stun.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    assert all(without_prelude.values()), f"a WebRTC probe misses a frame without the prelude: {without_prelude}"
    for tag in LINK_PROBES:
        assert f"control-{tag}" in control.owned, f"the {tag} probe does not notice: {control}"
        assert f"owned-control-{tag}.txt" in control.written, f"the {tag} probe's PUT does not notice: {control}"
    for tag in FETCH_PROBES:
        assert control.hits.get(tag), f"the {tag} probe does not notice: {control}"
    assert control.stun > 0, f"the WebRTC probe does not notice the pass-through: {control}"
    print(f"composition browser test: {time.monotonic() - started:.0f} s", flush=True)
