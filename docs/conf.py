"""Sphinx configuration of the documentation site (MyST Markdown pages in this folder).

Sphinx with MyST rather than MkDocs: it is what the Jupyter projects this one sits beside
use (ipykernel, jupyter_client, JupyterHub), so their pages cross-link the same way, and its
autodoc reads the Python client's docstrings straight from the code (docs/client-reference.md).
tests/docs/test_site.py builds it with warnings as errors.
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # autodoc imports sandbox.client from this checkout

from sandbox import __version__  # noqa: E402

project = "sandbox-kernel"
release = version = __version__
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4  # README-style `page.md#a-heading` links
myst_enable_extensions = ["colon_fence"]
autodoc_member_order = "bysource"
autodoc_typehints = "description"
html_theme = "alabaster"
html_title = "sandbox-kernel"
suppress_warnings = ["misc.highlighting_failure"]  # shell lines with `…` placeholders are shown as text
