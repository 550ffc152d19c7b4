"""Widgets whose model makes the page itself copy state from one widget into another, and
when the kernel carries them.

The kernel filters each widget's state by the view that draws it (`widget_kinds`). A few
models of ipywidgets 8.1 have no view but make JupyterLab's widget manager *act* after that
filter, in the page:

- ``LinkModel`` and ``DirectionalLinkModel`` (``jslink``, ``jsdlink``): whenever
  ``source = [model, attribute]`` changes, the page writes its value into
  ``target = [model, attribute]`` (and back, for ``LinkModel``). The kernel filtered each
  value for the widget it came in, not for the one the page writes it into: a `Text` value
  linked into an `HTML` widget's ``value``, or ``'HTMLView'`` into a `Label`'s ``_view_name``,
  would put script into the page. So a link is carried only when *both* ends are a
  (model, attribute) pair in `LINKABLE`: attributes that the kernel passes unchanged whatever
  they hold and that the view only ever writes as a DOM property or as text (a number, a
  boolean, a text field's value, a selection's index). Never a ``_``-prefixed name, an
  HTML-rendering or typeset value, a ``format``, a ``description*``, a style or layout
  key, a media value. Each end must name a model whose open this kernel carried.
- ``ControllerModel``: the page writes gamepad readings (numbers, booleans) into the models
  its ``buttons`` and ``axes`` name, and closes them on disconnect. Carried only when those
  name `ControllerButton`/`ControllerAxis` models this kernel carried.
- ``PlayModel`` (the page adds ``step`` to its own ``value`` on a timer) writes only into
  itself: nothing to judge beyond `widget_kinds`.

The judgement is made at the open and again on every later message that sets these keys
(``update``, ``echo_update``, the control comm's answer): a link carried once may not be
re-pointed later. A comm id is carried once only (`widgets.CommRelay`), so an end always
names the model that was judged.
"""

from __future__ import annotations

import typing as t

from . import widget_kinds as K

CONTROLS = "@jupyter-widgets/controls"
LINK_MODELS = frozenset({"LinkModel", "DirectionalLinkModel"})
LINK_KEYS = ("source", "target")
MODEL_REFERENCE = "IPY_MODEL_"

# (model name, attribute): the page may write any value there (see the docstring).
_VALUE = ("IntSliderModel", "FloatSliderModel", "FloatLogSliderModel", "IntRangeSliderModel",
          "FloatRangeSliderModel", "IntTextModel", "FloatTextModel", "BoundedIntTextModel",
          "BoundedFloatTextModel", "IntProgressModel", "FloatProgressModel", "PlayModel", "TextModel",
          "TextareaModel", "CheckboxModel", "ToggleButtonModel")
_INDEX = ("DropdownModel", "SelectModel", "RadioButtonsModel", "ToggleButtonsModel", "SelectionSliderModel")
LINKABLE = frozenset({(name, "value") for name in _VALUE} | {(name, "index") for name in _INDEX})

# A model's keys that list other models the page writes into, and the model each must be.
REFERENCE_LISTS = {"ControllerModel": {"buttons": "ControllerButtonModel", "axes": "ControllerAxisModel"}}


def model_id(reference: t.Any) -> str | None:
    """The model id in an ``IPY_MODEL_…`` reference, or None."""
    if isinstance(reference, str) and reference.startswith(MODEL_REFERENCE):
        return reference[len(MODEL_REFERENCE):]
    return None


def end_refusal(end: t.Any, carried: t.Callable[[str], K.Spec | None]) -> str | None:
    """Why a link's end may not be carried, or None. `carried`: the four names of a model
    whose open this kernel carried, or None."""
    if end is None:
        return None  # an unset end: the page copies nothing
    if not (isinstance(end, list) and len(end) == 2 and isinstance(end[1], str)):
        return "its end is not a [model, attribute] pair"
    ident = model_id(end[0])
    spec = carried(ident) if ident is not None else None
    if spec is None:
        return "its end names no widget of this kernel"
    if spec[0] != CONTROLS or (spec[1], end[1]) not in LINKABLE:
        return f"the page would write into {spec[1]}.{end[1][:60]}, which the kernel filters or which is not plain data"
    return None


def refusal(spec: K.Spec, state: dict[str, t.Any], carried: t.Callable[[str], K.Spec | None]) -> str | None:
    """Why a state for a model with these four names may not reach the page, judged by what
    the page would do with it; None when nothing in it makes the page copy or write."""
    if spec[0] != CONTROLS:
        return None
    if spec[1] in LINK_MODELS:
        for key in LINK_KEYS:
            why = end_refusal(state.get(key), carried) if key in state else None
            if why:
                return f"a {spec[1]} was not carried: {why}"
    for key, part in REFERENCE_LISTS.get(spec[1] or "", {}).items():
        if key not in state:
            continue
        refs = state[key]
        if not isinstance(refs, list) or any(_name(carried, r) != part for r in refs):
            return f"a {spec[1]} was not carried: its {key} name models other than {part}"
    return None


def _name(carried: t.Callable[[str], K.Spec | None], reference: t.Any) -> str | None:
    ident = model_id(reference)
    spec = carried(ident) if ident is not None else None
    return spec[1] if spec is not None and spec[0] == CONTROLS else None
