"""Write kernel/resources/widgets-allow-list.json: every (model module, model name, view
module, view name) that the installed ipywidgets ships, with its version.

The kernel lets a sandbox's widget reach the page only if its four names are in that list
(kernel/widget_kinds.py). The list is pinned to the ipywidgets of the default image
(sandbox/images/images.py: ``ipywidgets>=8.1,<9``); refresh it when that pin moves:

    pip install 'ipywidgets==NEW' && python scripts/widget_allow_list.py

then review the diff (a new view that sets innerHTML needs a rule in widget_kinds.py).
tests/kernel/test_widget_policy.py checks that the committed list is the one this script
makes from the installed ipywidgets, when its minor version is the list's.
"""

from __future__ import annotations

import json
import pathlib
import sys

TARGET = pathlib.Path(__file__).resolve().parents[1] / "kernel" / "resources" / "widgets-allow-list.json"


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def allow_list() -> dict:
    """The list, from the installed ipywidgets (only its own modules' classes)."""
    import ipywidgets
    from ipywidgets.widgets.widget import Widget

    specs = set()
    for cls in _subclasses(Widget):
        if not cls.__module__.startswith("ipywidgets."):
            continue
        traits = cls.class_traits()
        names = [traits[k].default_value if k in traits else None
                 for k in ("_model_module", "_model_name", "_view_module", "_view_name")]
        if names[0] and names[1]:
            specs.add(tuple(names))
    return {
        "ipywidgets": ipywidgets.__version__,
        "widgets": [list(spec) for spec in sorted(specs, key=lambda s: tuple(x or "" for x in s))],
    }


def main() -> int:
    TARGET.write_text(json.dumps(allow_list(), indent=1) + "\n")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
