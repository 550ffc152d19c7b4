"""nbval on these notebooks: a notebook that needs an extra this environment lacks is
skipped, saying which extra and how to install it, rather than failing on its import
(docs/getting-started.md, Notebooks). The notebook's own first cell says the same to someone running it."""

from __future__ import annotations

import importlib.util

import pytest

# A notebook's file name -> the module it needs and the extra that installs it.
NEEDS = {"05-adk-agent.ipynb": ("google.adk", "adk")}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package (google) is missing too
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module, extra = NEEDS.get(item.path.name, (None, None))
        if module and not _installed(module):
            item.add_marker(pytest.mark.skip(reason=f"{item.path.name} needs the {extra} extra "
                                                    f"({module}): pip install -e '.[{extra}]'"))
