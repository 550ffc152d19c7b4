"""Active sandbox output (HTML, JavaScript, SVG, Markdown, LaTeX as MathML) as an isolated frame.

JupyterLab runs the scripts of every `text/html` and `application/javascript` output of the
session with the page's rights: its origin, its cookies, its token, its terminals. Output
from a sandbox is written by the code in the sandbox, so it must never get those rights.
Colab and VS Code notebooks solve the same problem the same way: untrusted output is shown
inside an `<iframe sandbox="allow-scripts">` *without* `allow-same-origin`. Such a frame
has an opaque origin: its scripts run (an interactive chart keeps working) but cannot read
the page, its storage or cookies, cannot call the Jupyter server with the user's rights,
cannot navigate the page, open windows or submit forms.

What this module builds, as the `text/html` JupyterLab receives:

    <iframe sandbox="allow-scripts" srcdoc="ESCAPED DOCUMENT" ...>fallback text</iframe>
    <script>height listener</script>

- The frame's document starts with a Content-Security-Policy that allows inline scripts and
  styles and `data:`/`blob:` images but no network at all: the sandbox has no network, and
  its output should not get one through the user's browser (a chart that loads its library
  from a CDN must inline it instead). A later policy in the sandbox's document can only
  restrict further, never relax.
- The first script of the document is `frame_prelude`'s: it takes away what CSP does not
  govern (WebRTC's peer connections, and nested frames whose fresh realms would still have
  them), before any byte of the sandbox's runs.
- The document is escaped for a double-quoted attribute (`html.escape(quote=True)`), so
  no byte of sandbox output is ever parsed by the page itself.
- Sizing: a script of ours at the top of the frame posts its content height to the parent.
  The parent's listener (the `<script>` after the frame, our fixed code, no sandbox bytes
  in it) accepts a message only from *that* frame's `contentWindow` and only a finite
  number, clamped to `MAX_HEIGHT`; anything else is ignored. So a table or a chart shows
  without a scrollbar, and a hostile frame can at worst change its own height.
- The text inside `<iframe>…</iframe>` is never shown by a browser that renders the frame.
  When JupyterLab shows a saved notebook as untrusted it sanitizes the HTML, which drops
  the frame (and our script) and keeps that text: the user reads a note instead of a blank.
- For HTML and Markdown (a DataFrame's table, a report) a *static copy* follows the frame:
  the source cleaned by nh3 (an allow-list HTML sanitizer: no scripts, no event handlers,
  no styles, no links, no images, so nothing in it runs or fetches). It is what an
  untrusted view of a saved notebook shows, instead of the note. When the frame itself is
  shown, our listener script (which runs only then) hides the copy, so it is never seen
  twice. A copy larger than `MAX_STATIC_COPY` is left out (the note stays).
"""

from __future__ import annotations

import functools
import html
import re
import typing as t

from .frame_prelude import PRELUDE, without_declarative_shadow_roots

# Frames never grow past this (pixels); taller content scrolls inside its frame.
MAX_HEIGHT = 4000
# Height before the frame reports its own (and if it never does).
INITIAL_HEIGHT = 60
# The static copy for untrusted views is left out past this many characters.
MAX_STATIC_COPY = 256 * 1024
STATIC_CLASS = "sandbox-output-static"

CSP = (
    "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
    "img-src data: blob:; font-src data:; media-src data: blob:; form-action 'none'; base-uri 'none'; "
    # WebRTC is outside `default-src`; no Chromium honours this yet (`frame_prelude` does the work).
    "webrtc 'block'"
)

# Close to JupyterLab's own look for what sandboxes show most: pandas tables.
STYLE = """
html { color-scheme: light; }
body { margin: 0; padding: 2px 0; font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif;
       font-size: 13px; line-height: 1.4; color: rgba(0, 0, 0, 0.87); background: transparent; overflow-y: hidden; }
table { border-collapse: collapse; border: none; font-size: 12px; table-layout: fixed; }
thead { border-bottom: 1px solid rgba(0, 0, 0, 0.25); vertical-align: bottom; }
td, th, tr { text-align: right; vertical-align: middle; padding: 0.5em; line-height: normal; white-space: normal;
             max-width: none; border: none; }
th { font-weight: bold; }
tbody tr:nth-child(odd) { background: #f5f5f5; }
tbody tr:hover { background: rgba(66, 165, 245, 0.2); }
pre, code { font-family: ui-monospace, 'SFMono-Regular', Menlo, monospace; font-size: 12px; }
img, svg, canvas { max-width: 100%; }
"""

# Posts the content's height to the parent whenever it changes, and again whenever the parent
# asks (it asks each time the frame loads, so a report that came before its listener was
# listening is sent once more). `documentElement`'s box is as tall as the content (not the
# viewport), so a frame also shrinks when its content does.
REPORT_HEIGHT = """
(function () {
  var last = -1;
  function send() {
    var root = document.documentElement;
    var h = Math.ceil(root.getBoundingClientRect().height);
    if (root.scrollWidth > root.clientWidth) { h += 18; }
    if (h !== last) { last = h; parent.postMessage({sandboxOutputHeight: h}, '*'); }
  }
  if (typeof ResizeObserver === 'function') { new ResizeObserver(send).observe(document.documentElement); }
  addEventListener('load', send);
  addEventListener('message', function (e) {
    if (e.source === parent && e.data && e.data.sandboxOutputAskHeight === 1) { last = -1; send(); }
  });
  document.addEventListener('DOMContentLoaded', send);
})();
"""

# The parent's side: our fixed code, run by JupyterLab in the page for a trusted output. It
# finds its own frame (the element just before it) and listens to that frame alone. While the
# frame is out of the page (a cell scrolled out under JupyterLab's "full" windowing, a cell
# moved) it stops listening; the frame's element fires `load` each time it is back and its
# document loaded again, and that starts the listening again and asks for the height.
LISTEN_HEIGHT = (
    "(function () {"
    "var s = document.currentScript, f = s && s.previousElementSibling;"
    "if (!f || f.tagName !== 'IFRAME') { return; }"
    "var c = s.nextElementSibling;"
    f"if (c && c.classList.contains('{STATIC_CLASS}')) {{ c.style.display = 'none'; }}"
    "var listening = false;"
    "function on(e) {"
    "if (!f.isConnected) { removeEventListener('message', on); listening = false; return; }"
    "if (e.source !== f.contentWindow) { return; }"
    "var d = e.data;"
    "if (d === null || typeof d !== 'object') { return; }"
    "var h = d.sandboxOutputHeight;"
    "if (typeof h !== 'number' || !isFinite(h)) { return; }"
    f"f.style.height = Math.max(8, Math.min({MAX_HEIGHT}, Math.ceil(h))) + 'px';"
    "}"
    "function listen() { if (!listening) { addEventListener('message', on); listening = true; } }"
    "f.addEventListener('load', function () {"
    "listen();"
    "if (f.contentWindow) { f.contentWindow.postMessage({sandboxOutputAskHeight: 1}, '*'); }"
    "});"
    "listen();"
    "})();"
)

FALLBACK = (
    "[{kind} output from the sandbox: shown only in an isolated frame, which this view does not "
    "display (the notebook is not trusted here). Run the cell again to see it.]"
)


def _script_text(code: str) -> str:
    """JavaScript made safe to sit inside a `<script>` element (correctness only: the
    frame is the security boundary, this just keeps `</script>` in a string from ending
    the element early)."""
    code = re.sub(r"</(script)", r"<\\/\1", code, flags=re.IGNORECASE)
    return code.replace("<!--", "<\\!--")


def document(body: str, *, head: str = "") -> str:
    """The frame's whole document around `body`, which is sandbox output."""
    body = without_declarative_shadow_roots(body)
    head = without_declarative_shadow_roots(head)
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
        f"<script>{PRELUDE}</script>"
        f"<style>{STYLE}</style><script>{REPORT_HEIGHT}</script>{head}</head>"
        f"<body>{body}</body></html>"
    )


def html_document(source: str) -> str:
    return document(source)


def javascript_document(source: str) -> str:
    """As JupyterLab runs `application/javascript`: with `element`, the output's node."""
    return document(
        '<div id="output"></div>'
        f"<script>var element = document.getElementById('output');\n{_script_text(source)}\n</script>"
    )


def svg_document(source: str) -> str:
    return document(source)


def markdown_document(source: str) -> str:
    """Markdown rendered here (CommonMark plus tables, raw HTML kept: it stays in the frame)."""
    from markdown_it import MarkdownIt

    return document(MarkdownIt("commonmark", {"html": True}).enable("table").render(source))


@functools.cache
def static_tags() -> frozenset[str]:
    """What the static copy may hold: text structure and tables. No `a`, `img`, `area` or
    `map`: in the page they would fetch or navigate with the page's origin.

    nh3 is imported here, not with the module: only HTML output needs it, and every kernel
    process would otherwise hold it (about 1.5 MiB) from its start."""
    import nh3

    return frozenset(nh3.ALLOWED_TAGS - {"a", "img", "area", "map"})


def __getattr__(name: str) -> t.Any:
    if name == "STATIC_TAGS":  # the module's constant, computed when first asked for
        return static_tags()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def sanitized_html(source: str) -> str:
    """HTML that may sit in the page itself: `STATIC_TAGS` with no attribute at all, so
    nothing in it runs, fetches, navigates or styles. The one sanitizer for sandbox HTML
    outside a frame (static copies, the value of HTML widgets)."""
    import nh3

    return nh3.clean(source, tags=set(static_tags()), attributes={}, strip_comments=True)


def latex_document(source: str) -> str:
    """LaTeX as MathML (`mathml`), drawn by the browser inside the frame."""
    from .mathml import latex_to_html

    return document(latex_to_html(source))


def static_copy(mime: str, source: str) -> str:
    """What an untrusted view shows for this output: sanitized HTML, or '' when there is
    none to give (JavaScript and SVG have no static form; a copy past the cap is dropped)."""
    if mime == "text/markdown":
        from markdown_it import MarkdownIt

        source = MarkdownIt("commonmark", {"html": True}).enable("table").render(source)
    elif mime != "text/html":
        return ""
    cleaned = sanitized_html(source)
    if not cleaned.strip() or len(cleaned) > MAX_STATIC_COPY:
        return ""
    return f'<div class="{STATIC_CLASS}">{cleaned}</div>'


BUILDERS = {
    "application/javascript": javascript_document,
    "text/html": html_document,
    "text/markdown": markdown_document,
    "text/latex": latex_document,
    "image/svg+xml": svg_document,
}


def framed_html(mime: str, source: str) -> str:
    """The `text/html` that shows `source` (of type `mime`) in an isolated frame."""
    doc = BUILDERS[mime](source)
    copy = static_copy(mime, source)
    fallback = "" if copy else html.escape(FALLBACK.format(kind=mime))
    return (
        f'<iframe class="sandbox-output" sandbox="allow-scripts" referrerpolicy="no-referrer" '
        f'title="{html.escape(mime)} output from the sandbox" '
        f'style="width: 100%; height: {INITIAL_HEIGHT}px; border: 0; display: block;" '
        f'srcdoc="{html.escape(doc, quote=True)}">{fallback}</iframe>'
        f"<script>{LISTEN_HEIGHT}</script>"
        f"{copy}"
    )
