"""The output policy, one test per row of docs/security.md's MIME table: what of a sandbox's display
bundle reaches the notebook page, and in what form. No server needed.

The browser test (tests/browser/test_browser_output_isolation.py) proves the frames hold
in a real JupyterLab; these prove the kernel builds them, for every type and every trick.
"""

from __future__ import annotations

import base64
import html.parser
import logging

import pytest

from kernel import frames
from kernel.config import SandboxSettings
from kernel.lifecycle import SandboxLifecycle
from kernel.output_policy import POLICY, filter_bundle, filter_transient
from kernel.notes import is_note
from kernel.outputs import CellMapper, event_to_messages

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40).decode() + "\n"  # IPython ends it with a newline
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\0" * 40).decode()
GIF = base64.b64encode(b"GIF89a" + b"\0" * 40).decode()


class _Top(html.parser.HTMLParser):
    """The top-level elements of the HTML the page receives, as the page's parser sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def page_view(markup: str) -> _Top:
    parser = _Top()
    parser.feed(markup)
    parser.close()
    return parser


def assert_static_copy_is_inert(tags: list[tuple[str, dict[str, str | None]]]) -> None:
    """What follows the frame, if anything, is the static copy: one marked div of plain
    structure, with no attribute that could run, fetch, navigate or style."""
    if not tags:
        return
    assert tags[0] == ("div", {"class": frames.STATIC_CLASS}), tags[0]
    for tag, attrs in tags[1:]:
        assert tag in frames.STATIC_TAGS and tag not in {"script", "img", "a", "iframe", "style", "svg"}, tag
        assert not attrs, (tag, attrs)


def assert_isolated_frame(markup: str, payload: str) -> str:
    """The page gets exactly one sandboxed frame and our own fixed listener script; the
    payload is only inside the frame's document. Returns that document."""
    view = page_view(markup)
    assert [tag for tag, _ in view.tags[:2]] == ["iframe", "script"], view.tags
    assert_static_copy_is_inert(view.tags[2:])
    attrs = view.tags[0][1]
    assert attrs["sandbox"] == "allow-scripts", "no allow-same-origin, no allow-top-navigation, no allow-popups"
    assert view.scripts == [frames.LISTEN_HEIGHT], "the only script the page runs is our listener"
    doc = attrs["srcdoc"]
    assert payload in doc
    assert doc.index(frames.CSP) < doc.index(payload), "the frame's no-network policy comes before the payload"
    return doc


# --------------------------------------------------------------------------- passive types


def test_text_plain_passes_unchanged():
    text = "<script>alert(1)</script>\n   DataFrame repr  \x1b[0m"
    out = filter_bundle({"text/plain": text}, {})
    assert out.data == {"text/plain": text}
    assert out.notes == []


@pytest.mark.parametrize("mime,value", [("image/png", PNG), ("image/jpeg", JPEG), ("image/gif", GIF)])
def test_valid_images_pass_unchanged(mime, value):
    out = filter_bundle({mime: value, "text/plain": "<Figure>"}, {})
    assert out.data == {mime: value, "text/plain": "<Figure>"}
    assert out.notes == []


@pytest.mark.parametrize(
    "mime,value,why",
    [
        ("image/png", "not base64!", "not valid base64"),
        ("image/png", JPEG, "not a PNG"),
        ("image/jpeg", PNG, "not a JPEG"),
        ("image/gif", base64.b64encode(b"<svg onload=alert(1)>").decode(), "not a GIF"),
        ("image/png", {"src": "x"}, "not base64"),
        ("image/png", PNG.strip()[:-1], "not valid base64"),  # truncated
    ],
)
def test_images_that_are_not_what_they_claim_become_a_note(mime, value, why):
    out = filter_bundle({mime: value, "text/plain": "<Figure>"}, {mime: {"width": 100}})
    assert out.data == {"text/plain": "<Figure>"}, "text/plain stays; the broken image goes"
    assert out.metadata == {}
    assert len(out.notes) == 1 and why in out.notes[0] and mime in out.notes[0]


def test_an_image_only_bundle_with_bad_bytes_becomes_plain_text():
    out = filter_bundle({"image/png": "AAAA"}, {})
    assert list(out.data) == ["text/plain"] and "image/png" in out.data["text/plain"]


# --------------------------------------------------------------------------- active types


@pytest.mark.parametrize(
    "mime,payload",
    [
        ("text/html", '<img src=x onerror="top.owned=1"><script>top.owned=2</script>'),
        ("text/html", '<iframe srcdoc="<script>top.owned=3</script>"></iframe>'),
        ("application/javascript", "top.owned = 4; fetch('/api/contents')"),
        ("image/svg+xml", '<svg xmlns="http://www.w3.org/2000/svg"><script>top.owned=5</script></svg>'),
    ],
)
def test_active_types_reach_the_page_only_inside_an_isolated_frame(mime, payload):
    out = filter_bundle({mime: payload, "text/plain": "repr"}, {})
    assert set(out.data) == {"text/html", "text/plain"}
    assert out.data["text/plain"] == "repr"
    assert_isolated_frame(out.data["text/html"], payload)


def test_markdown_is_rendered_inside_the_frame_raw_html_included():
    payload = "# Title\n\n<img src=x onerror=top.owned=6>\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    out = filter_bundle({"text/markdown": payload}, {})
    doc = page_view(out.data["text/html"]).tags[0][1]["srcdoc"]
    assert "<h1>Title</h1>" in doc and "<td>1</td>" in doc
    assert "onerror=top.owned=6" in doc  # raw HTML stays, but only in the frame
    assert_isolated_frame(out.data["text/html"], "<h1>Title</h1>")


def test_untrusted_views_get_a_sanitized_static_copy_of_html_and_markdown():
    table = ('<table class="dataframe" style="x"><tr><th>campaign</th></tr>'
             '<tr><td onclick="top.owned=8">summer<script>top.owned=9</script></td></tr></table>'
             '<img src="http://example.invalid/x" onerror="top.owned=10"><a href="javascript:top.owned=11">l</a>'
             '<style>body{display:none}</style>')
    view = page_view(filter_bundle({"text/html": table}, {}).data["text/html"])
    copy = view.tags[2:]
    assert [tag for tag, _ in copy] == ["div", "table", "tbody", "tr", "th", "tr", "td"], copy
    assert_static_copy_is_inert(copy)
    assert not view.scripts[1:], "nothing of the payload's scripts is outside the frame"
    # Markdown: rendered, then cleaned the same way.
    md = page_view(filter_bundle({"text/markdown": "# Title\n\n<img src=x onerror=top.owned=12>"}, {}).data["text/html"])
    assert [tag for tag, _ in md.tags[2:]] == ["div", "h1", "p"], md.tags  # the p held the img
    # The listener, which runs only where the frame does, hides the copy.
    assert f"classList.contains('{frames.STATIC_CLASS}')" in frames.LISTEN_HEIGHT


@pytest.mark.parametrize("mime, payload", [
    ("application/javascript", "document.title = 'x'"),
    ("image/svg+xml", '<svg xmlns="http://www.w3.org/2000/svg"><text>x</text></svg>'),
    ("text/html", "<p>" + "x" * (frames.MAX_STATIC_COPY + 1) + "</p>"),
    ("text/html", "<script>only a script</script>"),
])
def test_no_static_copy_where_there_is_nothing_static_to_show(mime, payload):
    view = page_view(filter_bundle({mime: payload}, {}).data["text/html"])
    assert [tag for tag, _ in view.tags] == ["iframe", "script"], view.tags


def test_javascript_gets_an_element_to_draw_into_and_cannot_close_its_script():
    out = filter_bundle({"application/javascript": "element.textContent = '</script><b>x</b>';"}, {})
    doc = assert_isolated_frame(out.data["text/html"], "element.textContent")
    assert "var element = document.getElementById('output')" in doc
    assert "</script><b>" not in doc


def test_the_frame_document_survives_any_quoting():
    payload = "\"'&quot;&amp;</iframe><script>top.owned=7</script>\x00<!--"
    out = filter_bundle({"text/html": payload}, {})
    doc = assert_isolated_frame(out.data["text/html"], payload)
    assert doc == frames.html_document(payload), "the page's parser gives the frame exactly our document"


def test_html_wins_over_svg_and_images_as_in_jupyterlab():
    out = filter_bundle({"image/svg+xml": "<svg/>", "text/html": "<b>t</b>", "image/png": PNG}, {})
    assert_isolated_frame(out.data["text/html"], "<b>t</b>")
    assert out.data["image/png"] == PNG


def test_latex_is_mathml_in_a_frame_and_its_plain_text_unchanged():
    out = filter_bundle({"text/latex": r"$\displaystyle \int_0^1 x\,dx$ and $\href{javascript:top.owned=8}{y}$",
                         "text/plain": "Integral(x, (x, 0, 1))"}, {})
    assert out.data["text/plain"] == "Integral(x, (x, 0, 1))", "recorded notebooks keep validating"
    doc = assert_isolated_frame(out.data["text/html"], "<math")
    assert "<msubsup><mo>&#x0222B;</mo>" in doc and " and <math" in doc
    assert "<code>" not in doc
    unreadable = filter_bundle({"text/latex": r"$\frac{$"}, {})
    assert "<code>\\frac{</code>" in page_view(unreadable.data["text/html"]).tags[0][1]["srcdoc"]


def test_latex_source_stays_beside_its_frame_for_exports():
    source = r"$\displaystyle \int_0^1 x\,dx$"
    out = filter_bundle({"text/latex": source, "text/plain": "Integral(x, (x, 0, 1))"}, {})
    assert out.data["text/latex"] == source, "nbconvert --to latex reads it"
    assert "text/html" in out.data, "the page shows the frame: JupyterLab prefers text/html to text/latex"
    # A bundle with HTML of its own frames the HTML, and still keeps the LaTeX for exports.
    both = filter_bundle({"text/html": "<b>x</b>", "text/latex": source}, {})
    assert both.data["text/latex"] == source and "&lt;b&gt;x" in both.data["text/html"]
    # A LaTeX value that is not text is not kept.
    assert "text/latex" not in filter_bundle({"text/latex": 1, "text/plain": "x"}, {}).data


# --------------------------------------------------------------------------- withheld types


@pytest.mark.parametrize(
    "mime,value",
    [
        ("application/vnd.jupyter.widget-view+json", {"model_id": "<img src=x onerror=alert(1)>"}),
        ("application/vnd.jupyter.widget-view+json", "not an object"),
        ("application/vnd.plotly.v1+json", {"data": []}),
        ("application/vnd.evil+html", "<script>top.owned=9</script>"),
        ("application/json", {"a": 1}),
        ("x-unknown/type", "<script>top.owned=10</script>"),
        ("text/html", {"not": "a string"}),
    ],
)
def test_other_types_never_reach_the_page(mime, value):
    out = filter_bundle({mime: value, "text/plain": "repr"}, {})
    assert out.data == {"text/plain": "repr"}
    alone = filter_bundle({mime: value}, {})
    assert list(alone.data) == ["text/plain"] and mime in alone.data["text/plain"], "a plain note says what was withheld"


def test_a_widget_view_passes_as_its_model_id_and_versions_only():
    view = {"model_id": "3f2a9c", "version_major": 2, "version_minor": 0, "html": "<script>top.owned=11</script>"}
    out = filter_bundle({"application/vnd.jupyter.widget-view+json": view, "text/plain": "IntSlider(value=3)"}, {})
    assert out.data == {"application/vnd.jupyter.widget-view+json": {"model_id": "3f2a9c", "version_major": 2,
                                                                      "version_minor": 0},
                        "text/plain": "IntSlider(value=3)"}


def test_every_table_row_is_tested():
    tested = {"text/plain", "image/png", "image/jpeg", "image/gif", "text/html", "application/javascript",
              "image/svg+xml", "text/markdown", "text/latex", "application/vnd.jupyter.widget-view+json",
              "application/json"}
    assert set(POLICY) == tested, "a new row in POLICY needs a test here and a row in docs/security.md"


# --------------------------------------------------------------------------- metadata and transient


def test_metadata_is_rebuilt_from_an_allow_list():
    meta = {
        "trusted": True,
        "isolated": False,
        "text/html": {"isolated": False, "trusted": True},
        "image/png": {"width": 640, "height": 480.5, "unconfined": True, "needs_background": "light", "x": 1},
        "image/jpeg": {"width": "100%", "height": True},
        "image/gif": {"width": float("inf"), "height": -3},
    }
    out = filter_bundle({"text/html": "<b>x</b>", "image/png": PNG, "image/jpeg": JPEG, "image/gif": GIF}, meta)
    assert out.metadata == {"image/png": {"width": 640, "height": 480.5, "needs_background": "light"}}


def test_transient_keeps_only_a_display_id():
    assert filter_transient({"display_id": "d1", "trusted": True}) == {"display_id": "d1"}
    assert filter_transient({"display_id": 5}) == {}
    assert filter_transient("x") == {}


# --------------------------------------------------------------------------- the kernel's use of it


def test_cell_mapper_filters_every_display_message_kind():
    m = CellMapper(execution_count=1)
    event = {"data": {"application/javascript": "top.owned=1", "text/plain": "js"}, "metadata": {"trusted": True}}
    for kind in ("display_data", "execute_result"):
        (msg_type, content), = m.feed({"type": kind, **event, "transient": {"display_id": "d"}})
        assert msg_type == kind and content["metadata"] == {}
        assert_isolated_frame(content["data"]["text/html"], "top.owned=1")
    (_, content), = m.feed({"type": "update_display_data", **event, "transient": {"display_id": "d", "x": 1}})
    assert content["transient"] == {"display_id": "d"}
    assert_isolated_frame(content["data"]["text/html"], "top.owned=1")


def test_a_refused_image_is_noted_as_a_note_not_on_stderr():
    messages = event_to_messages({"type": "display_data", "data": {"image/png": JPEG, "text/plain": "<Figure>"}})
    assert [kind for kind, _ in messages] == ["display_data", "display_data"]
    assert is_note(messages[1][1]) and "not a PNG" in messages[1][1]["data"]["text/plain"]


def test_pass_through_sends_bundles_as_they_came():
    event = {"type": "display_data", "data": {"text/html": "<script>1</script>", "x/y": 1},
             "metadata": {"trusted": True}, "transient": {"display_id": "d", "k": 1}}
    (_, content), = CellMapper(passthrough=True).feed(event)
    assert content == {"data": event["data"], "metadata": event["metadata"], "transient": event["transient"]}


def test_pass_through_is_off_by_default_and_ignored_with_host_cells_off(monkeypatch):
    monkeypatch.delenv("SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS", raising=False)
    monkeypatch.delenv("SANDBOX_KERNEL_HOST_CELLS", raising=False)
    log = logging.getLogger("test")
    assert not SandboxLifecycle(SandboxSettings(), log).outputs_passthrough

    monkeypatch.setenv("SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS", "1")
    life = SandboxLifecycle(SandboxSettings(), log)
    assert life.outputs_passthrough and "UNFILTERED" in life.outputs_mode

    monkeypatch.setenv("SANDBOX_KERNEL_HOST_CELLS", "0")
    life = SandboxLifecycle(SandboxSettings(), log)
    assert not life.outputs_passthrough
    assert "isolated" in life.outputs_mode and "ignored" in life.outputs_mode
