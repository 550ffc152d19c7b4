"""Widgets in a real JupyterLab, driven by a real Chromium: moving an `interact` slider on the
page makes the sandbox recompute and the output change, and a `tqdm.notebook` bar reaches
100 %. JupyterLab's widget manager (jupyterlab_widgets) draws the widgets from the state the
kernel relays; the slider's move goes back to the sandbox as a comm message.

Prints the slider's round trip: from the key press on the page to the recomputed output shown.
Needs what tests/browser/test_browser_jupyterlab.py needs, plus jupyterlab_widgets.
"""

from __future__ import annotations

import time
import typing as t

import pytest

import support
from test_browser_jupyterlab import lab_page, open_from_launcher
from test_browser_jupyterlab import pytestmark as browser_pytestmark


def _widgets_missing() -> str | None:
    try:
        import jupyterlab_widgets  # noqa: F401
    except ImportError:
        return "jupyterlab_widgets is not installed (pip install -e '.[lab]')"
    return None


WIDGETS_MISSING = _widgets_missing()
pytestmark = [
    *browser_pytestmark,  # slow, timeout, skip without a browser
    pytest.mark.skipif(WIDGETS_MISSING is not None, reason=f"widget manager missing: {WIDGETS_MISSING}"),
]

INTERACT_CELL = """import ipywidgets as w
@w.interact(x=(0, 20))
def square(x=3):
    print(f"square of {x} is {x * x}")"""

TQDM_CELL = """from tqdm.notebook import tqdm
import time
for _ in tqdm(range(40), desc="steps"):
    time.sleep(0.02)"""


def test_a_slider_recomputes_in_the_sandbox_and_a_tqdm_bar_completes(sandbox_server: support.Server) -> None:
    from playwright.sync_api import expect

    with lab_page(sandbox_server, "widgets", console=True) as (page, lab):
        run_widgets(page, lab, expect)


def run_widgets(page: t.Any, lab: t.Any, expect: t.Any) -> None:
    nb = open_from_launcher(page, lab, expect)

    # interact: the widget manager draws the slider; its output area shows the first value.
    nb.type_cell(0, INTERACT_CELL)
    nb.wait_done(0)
    out = nb.output(0)
    slider = out.locator(".widget-slider").first
    expect(slider).to_be_visible(timeout=30_000)
    expect(out).to_contain_text("square of 3 is 9", timeout=30_000)
    nb.shot("widgets-01-slider.png")

    # Moving the slider (keyboard on its handle, as a user can): the sandbox recomputes.
    handle = out.locator(".noUi-handle").first
    handle.focus()
    rounds = []
    for expected in (4, 5, 6):
        pressed = time.monotonic()
        page.keyboard.press("ArrowRight")
        expect(out).to_contain_text(f"square of {expected} is {expected * expected}", timeout=30_000)
        rounds.append(time.monotonic() - pressed)
    expect(out).not_to_contain_text("square of 3 is 9")  # interact cleared the old output
    print("slider round trip (key press -> recomputed output shown): "
          + ", ".join(f"{r * 1000:.0f} ms" for r in rounds), flush=True)
    nb.shot("widgets-02-slider-moved.png")

    # tqdm.notebook: a widget progress bar that reaches 100 %.
    nb.type_cell(1, TQDM_CELL)
    nb.wait_done(1)
    bar = nb.output(1)
    expect(bar.locator(".widget-hprogress, .progress").first).to_be_visible(timeout=30_000)
    expect(bar).to_contain_text("100%", timeout=30_000)
    expect(bar).to_contain_text("40/40")
    nb.shot("widgets-03-tqdm.png")
