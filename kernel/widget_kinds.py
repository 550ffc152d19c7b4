"""Which widgets may reach the page, and what each kind of widget state may hold there.

JupyterLab's widget manager picks the *view* that draws a model from the state's
``_view_module``/``_view_name``, and the model class from ``_model_module``/``_model_name``:
all four are chosen by the sandbox. So a widget is judged by all four together, and only a
combination that the default image's ipywidgets ships passes (``resources/widgets-allow-list.json``,
made by ``scripts/widget_allow_list.py`` from ipywidgets 8.1; the script's docstring says
how to refresh it when the image's pin moves). A ``LabelModel`` drawn by ``HTMLView`` is not
in the list, whatever the sandbox calls it.

For an allowed combination, its view decides which state is dangerous in the page (read from
the widget manager's bundle: every place that sets ``innerHTML``, a ``src``, or a style):

- ``HTMLView``/``HTMLMathView`` set ``innerHTML`` from ``value``: it goes through the same
  nh3 allow-list as the static copy of a ``text/html`` output (tables, text, no attributes);
- ``description`` becomes HTML when ``description_allow_html`` is true: forced false;
- ``LabelView``, ``HTMLMathView`` and every description are typeset by MathJax, whose
  ``\\href``, ``\\style``, ``\\class`` … make links and styles: those commands lose their backslash;
- ``ImageView``/``VideoView``/``AudioView`` with ``format="url"`` make the browser fetch
  ``value``: such a format becomes ``png`` (the bytes are then shown as an image, i.e. not);
- ``LayoutView`` and ``StyleView`` state becomes CSS in the page: a value with ``url(``,
  ``image-set(``, ``@``, ``\\`` or any CSS function other than colours and arithmetic is dropped;
- binary buffers only for the ``value`` of the media and file-upload widgets.
"""

from __future__ import annotations

import json
import pathlib
import re
import typing as t

Spec = t.Tuple[t.Optional[str], t.Optional[str], t.Optional[str], t.Optional[str]]
NAME_KEYS = ("_model_module", "_model_name", "_view_module", "_view_name")

_LIST = pathlib.Path(__file__).with_name("resources") / "widgets-allow-list.json"


def _load() -> tuple[str, frozenset[Spec]]:
    data = json.loads(_LIST.read_text())
    return data["ipywidgets"], frozenset(tuple(entry) for entry in data["widgets"])  # type: ignore[misc]


IPYWIDGETS_VERSION, ALLOWED = _load()

HTML_VIEWS = frozenset({"HTMLView", "HTMLMathView"})
TYPESET_VIEWS = frozenset({"LabelView", "HTMLMathView"})
MEDIA_VIEWS = frozenset({"ImageView", "VideoView", "AudioView"})
CSS_VIEWS = frozenset({"LayoutView", "StyleView"})
OUTPUT_VIEW = "OutputView"
BINARY_VIEWS = MEDIA_VIEWS | {"FileUploadView"}

# MathJax commands that make links, styles, classes, ids, loads or raw characters.
_TEX_ACTIVE = re.compile(r"\\(?=(?:href|url|style|class|cssId|require|unicode|data|html|attr|includegraphics)\b)")
_MEDIA_FORMAT = re.compile(r"[a-z0-9][a-z0-9.+-]{0,31}")
# CSS: plain words, numbers, colours, quotes and these functions only.
_CSS_CHARS = re.compile(r"[A-Za-z0-9 #%.,()_+*/'\"!-]*")
_CSS_FUNCTION = re.compile(r"([A-Za-z-]+)\s*\(")
CSS_FUNCTIONS = frozenset({"rgb", "rgba", "hsl", "hsla", "hwb", "calc", "min", "max", "clamp", "var", "repeat",
                           "minmax", "fit-content", "span"})


def spec_of(state: dict[str, t.Any]) -> Spec:
    """The four names a state claims (None where it claims none)."""
    return tuple(state.get(k) if isinstance(state.get(k), str) else None for k in NAME_KEYS)  # type: ignore[return-value]


def describe(spec: Spec) -> str:
    model_module, model, view_module, view = spec
    return f"{model_module}:{model} drawn by {view_module}:{view}"


def allowed(spec: Spec) -> bool:
    return spec in ALLOWED


def plain_tex(text: str) -> str:
    """Text that MathJax typesets, with its active commands made inert."""
    return _TEX_ACTIVE.sub("", text)


def media_format(value: t.Any) -> bool:
    """Whether an Image/Video/Audio ``format`` makes a blob of the bytes (not a fetch)."""
    return isinstance(value, str) and value != "url" and bool(_MEDIA_FORMAT.fullmatch(value))


def css_value(value: t.Any) -> bool:
    """Whether a Layout/Style value is CSS that cannot make the browser fetch anything."""
    if not isinstance(value, str):
        return True
    if not _CSS_CHARS.fullmatch(value):
        return False
    return all(name.lower() in CSS_FUNCTIONS for name in _CSS_FUNCTION.findall(value))


def binary_key(spec: Spec, key: t.Any) -> bool:
    """Whether a buffer may be put at this state key (the first step of a buffer path)."""
    return spec[3] in BINARY_VIEWS and key == "value"
