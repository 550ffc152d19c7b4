"""The first script of every isolated frame (kernel/frame_prelude.py) and the markup around it:
what the browser test (tests/browser/test_browser_composition.py) relies on, checked in the
document the kernel builds."""

from __future__ import annotations

from kernel import frames
from kernel.frame_prelude import PRELUDE, without_declarative_shadow_roots


def test_the_prelude_runs_before_any_byte_of_the_sandbox():
    payload = "<script>new RTCPeerConnection()</script>"
    doc = frames.html_document(payload)
    assert doc.index(frames.CSP) < doc.index(PRELUDE) < doc.index(frames.REPORT_HEIGHT) < doc.index(payload)
    assert doc.count("<script>") == 3, "the prelude, the height report, the sandbox's"


def test_the_prelude_takes_webrtc_and_nested_frames_away():
    assert "RTC" in PRELUDE and "delete w[names[i]]" in PRELUDE
    for element in ("iframe", "frame", "object", "embed", "fencedframe"):
        assert element in PRELUDE
    assert "MutationObserver" in PRELUDE and "attachShadow" in PRELUDE
    assert "webrtc 'block'" in frames.CSP


def test_no_declarative_shadow_root_reaches_the_parser():
    markup = '<div><template ShadowRootMode="closed"><iframe></iframe></template></div><p shadowroot=open>'
    cleaned = without_declarative_shadow_roots(markup)
    assert "shadowroot" not in cleaned.lower().replace("data-no-shadow-root", "")
    assert "shadowrootmode" not in frames.html_document(markup).lower()
    assert frames.html_document("<p>a table</p>").endswith("<body><p>a table</p></body></html>")
