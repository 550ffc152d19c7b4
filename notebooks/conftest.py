"""nbval on these notebooks: a notebook that needs an extra this environment lacks is
skipped, saying which extra and how to install it, rather than failing on its import
(docs/getting-started.md, Notebooks). The notebook's own first cell says the same to someone running it."""

from __future__ import annotations

import importlib.util
import os

import pytest

# A notebook's file name -> the module it needs and the extra that installs it.
NEEDS = {"05-adk-agent.ipynb": ("google.adk", "adk")}
# A notebook's file name -> what it needs of the kernel's image, and how to get it: its own
# Debian root with Node.js and gcc (README, Images), selected with SANDBOX_KERNEL_IMAGE.
NEEDS_IMAGE = {"06-polyglot-analysis.ipynb": "an image on a root of its own with nodejs, npm, gcc and left-pad "
               "(as root: sandbox-kernel image build polyglot --apt nodejs npm gcc libc6-dev --npm left-pad), "
               "selected with SANDBOX_KERNEL_IMAGE=polyglot"}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package (google) is missing too
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in NEEDS_IMAGE and not os.environ.get("SANDBOX_KERNEL_IMAGE"):
            item.add_marker(pytest.mark.skip(reason=f"{item.path.name} needs {NEEDS_IMAGE[item.path.name]}"))
        module, extra = NEEDS.get(item.path.name, (None, None))
        if module and not _installed(module):
            item.add_marker(pytest.mark.skip(reason=f"{item.path.name} needs the {extra} extra "
                                                    f"({module}): pip install -e '.[{extra}]'"))
