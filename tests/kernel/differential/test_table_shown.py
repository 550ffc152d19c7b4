"""The kernel's page (docs/kernel.md) shows the table of intended differences as the code holds it (differences.py)."""

from __future__ import annotations

import pathlib

from .differences import DIFFERENCES

KERNEL_PAGE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "kernel.md"


def test_the_kernel_page_shows_every_row():
    text = KERNEL_PAGE.read_text()
    for row in DIFFERENCES:
        assert f"| {row.name} | {row.ipykernel} | {row.sandbox} | {row.reason} |" in text, row.name
