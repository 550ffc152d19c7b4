"""What the sandbox kernel's outputs look like in a real JupyterLab (headless Chromium),
beside "Python 3 (ipykernel)" on the same page:

- a traceback's text is as readable as ipykernel's: the WCAG contrast ratio of every
  coloured span of the error output (its computed colour against the background it is
  drawn on) is at least ipykernel's lowest, or 4.5, on JupyterLab's light and dark themes;
- math keeps its LaTeX source in the bundle (for exports) and the page still never
  typesets it: a `\\href` and a `\\style` aimed at a counting server on this machine never
  become a link or a request, where the same LaTeX in a Markdown cell (which the page does
  typeset: the control) becomes a link whose click the counter sees.

Fixtures and helpers are the main browser test's (test_browser_jupyterlab.py).
"""

from __future__ import annotations

import http.server
import json
import pathlib
import threading
import typing as t

import support
from test_browser_jupyterlab import CELL_MS, KERNEL_START_MS, Notebook, lab_page
from test_browser_jupyterlab import pytestmark  # noqa: F401  (slow, timeout, skip without a browser)
from test_browser_output_isolation import accept_kernel_dialog

ERROR_CELL = "total = 10\ncount = 0\nshare = total / count"
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}

# The contrast ratio (WCAG 2) of each text-bearing element of the cell's error output against
# the first opaque background behind it; the lowest one, and the colours it was found with.
CONTRASTS = """
output => {
  const rgb = s => { const m = s.match(/[\\d.]+/g).map(Number); return {r: m[0], g: m[1], b: m[2], a: m.length > 3 ? m[3] : 1}; };
  const lum = c => { const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
                     return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const background = el => {
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.a > 0.5) { return c; }
    }
    return {r: 255, g: 255, b: 255, a: 1};
  };
  const pre = output.querySelector('pre');
  if (!pre) { return null; }
  const found = [];
  for (const el of [pre, ...pre.querySelectorAll('span')]) {
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('');
    if (!/[A-Za-z0-9]/.test(own)) { continue; }
    const fg = rgb(getComputedStyle(el).color), bg = background(el);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    found.push({ratio: (hi + 0.05) / (lo + 0.05), text: own.slice(0, 40), color: getComputedStyle(el).color,
                background: `rgb(${bg.r}, ${bg.g}, ${bg.b})`});
  }
  found.sort((a, b) => a.ratio - b.ratio);
  return found;
}
"""


def notebook_json(kernel: str, display: str, cells: list[tuple[str, str]]) -> str:
    return json.dumps({
        "cells": [{"cell_type": kind, "id": f"c{i}", "metadata": {}, "source": src,
                   **({"execution_count": None, "outputs": []} if kind == "code" else {})}
                  for i, (kind, src) in enumerate(cells)],
        "metadata": {"kernelspec": {"name": kernel, "display_name": display, "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    })


def set_theme(lab: t.Any, theme: str) -> None:
    """JupyterLab's theme, as a user's settings file holds it (read at the next page load)."""
    target = lab.root.parent / "settings" / "@jupyterlab" / "apputils-extension"
    target.mkdir(parents=True, exist_ok=True)
    (target / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))


def open_and_run(page: t.Any, lab: t.Any, name: str) -> Notebook:
    page.goto(f"{lab.base}/lab/tree/{name}?token={lab.token}", wait_until="domcontentloaded")
    nb = Notebook(page)
    nb.panel.wait_for(state="visible", timeout=120_000)
    accept_kernel_dialog(page)
    nb.wait_status("idle", KERNEL_START_MS)
    nb.cells.nth(0).click()
    page.keyboard.press("Shift+Enter")
    nb.wait_done(0, CELL_MS)
    nb.output(0).locator("pre").first.wait_for(state="visible", timeout=CELL_MS)
    return nb


def lowest_contrast(nb: Notebook) -> dict[str, t.Any]:
    found = nb.output(0).locator(".jp-OutputArea-output").last.evaluate(CONTRASTS)
    assert found, "no traceback text was found in the output"
    return found[0]


def test_traceback_text_is_as_readable_as_ipykernels_on_light_and_dark(sandbox_server: support.Server) -> None:
    with lab_page(sandbox_server, "tracebacks") as (page, lab):
        (lab.root / "sandbox.ipynb").write_text(notebook_json("sandbox", "Python (sandbox)", [("code", ERROR_CELL)]))
        (lab.root / "ipykernel.ipynb").write_text(notebook_json("python3", "Python 3 (ipykernel)", [("code", ERROR_CELL)]))
        seen: dict[str, dict[str, t.Any]] = {}
        texts: dict[str, str] = {}
        for theme_key, theme in THEMES.items():
            set_theme(lab, theme)
            for name in ("ipykernel", "sandbox"):
                nb = open_and_run(page, lab, f"{name}.ipynb")
                assert "ZeroDivisionError" in nb.output_text(0) and "share" in nb.output_text(0)
                seen[f"{theme_key}/{name}"] = lowest_contrast(nb)
                texts[name] = nb.output_text(0)
                nb.shot(f"traceback-{theme_key}-{name}.png")
            # The same structure: line for line the text ipykernel shows.
            assert texts["sandbox"].splitlines() == texts["ipykernel"].splitlines(), texts
        print(json.dumps(seen, indent=1))
        for theme_key in THEMES:
            ours, theirs = seen[f"{theme_key}/sandbox"], seen[f"{theme_key}/ipykernel"]
            assert ours["ratio"] >= min(theirs["ratio"], 4.5) - 0.01, (theme_key, ours, theirs)


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).hits.append(self.path)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: t.Any) -> None:
        pass


def test_math_keeps_its_latex_and_the_page_never_typesets_it(sandbox_server: support.Server) -> None:
    counter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Hits", (_Counter,), {"hits": []}))
    port = counter.server_address[1]
    threading.Thread(target=counter.serve_forever, daemon=True).start()

    def probe(tag: str) -> str:
        """LaTeX that, typeset by the page's MathJax, becomes a link and a fetch to the counter."""
        return (r"\href{http://127.0.0.1:%d/%s-href}{x} + \style{background-image: url(http://127.0.0.1:%d/%s-style)}{y}"
                % (port, tag, port, tag))
    try:
        with lab_page(sandbox_server, "math") as (page, lab):
            cells = [
                ("code", "from IPython.display import Math, Latex, display\n"
                         f"display(Math(r'{probe('math')}'))\n"
                         f"display(Latex(r'${probe('latex')}$'))"),
                # The control: the page typesets the math of Markdown cells itself.
                ("markdown", f"Control: ${probe('control')}$"),
            ]
            (lab.root / "math.ipynb").write_text(notebook_json("sandbox", "Python (sandbox)", cells))
            page.goto(f"{lab.base}/lab/tree/math.ipynb?token={lab.token}", wait_until="domcontentloaded")
            nb = Notebook(page)
            nb.panel.wait_for(state="visible", timeout=120_000)
            accept_kernel_dialog(page)
            nb.wait_status("idle", KERNEL_START_MS)
            nb.cells.nth(0).click()
            page.keyboard.press("Shift+Enter")  # runs the code cell, renders the Markdown cell
            nb.wait_done(0, CELL_MS)
            page.keyboard.press("Shift+Enter")
            # The control fires: the page's MathJax made the Markdown's \href a link.
            control = page.locator("a[href*='control-href']")
            control.first.wait_for(state="attached", timeout=60_000)
            # ... and a click on that link reaches the counter (its 204 leaves the page where it is).
            control.first.click()
            page.wait_for_function("() => true")  # a turn of the page's loop
            for _ in range(50):
                if "/control-href" in _hits(counter):
                    break
                page.wait_for_timeout(200)
            assert "/control-href" in _hits(counter), _hits(counter)
            page.wait_for_timeout(3_000)  # any typesetting of the outputs would have happened
            assert page.locator("a[href*='math-href'], a[href*='latex-href']").count() == 0
            assert nb.output(0).locator("mjx-container, .MathJax").count() == 0, "the page typeset an output"
            assert not [h for h in _hits(counter) if h.startswith(("/math", "/latex"))], _hits(counter)
            frames = nb.output(0).locator("iframe.sandbox-output")
            assert frames.count() == 2, "both formulas are shown, each in its frame"
            # The bundle the page received, as the notebook stores it, has the LaTeX.
            page.keyboard.press("Control+s")
            page.wait_for_timeout(2_000)
            saved = json.loads((lab.root / "math.ipynb").read_text())
            outputs = saved["cells"][0]["outputs"]
            assert [sorted(o["data"]) for o in outputs] == [["text/html", "text/latex", "text/plain"]] * 2, outputs
            assert "math-href" in "".join(outputs[0]["data"]["text/latex"])
            print("requests seen by the counting server:", _hits(counter))
    finally:
        counter.shutdown()
        counter.server_close()


def _hits(server: http.server.HTTPServer) -> list[str]:
    return list(server.RequestHandlerClass.hits)  # type: ignore[attr-defined]
