"""README shows the table of intended differences as the code holds it (differences.py)."""

from __future__ import annotations

import pathlib

from .differences import DIFFERENCES

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def test_readme_shows_every_row():
    text = README.read_text()
    for row in DIFFERENCES:
        assert f"| {row.name} | {row.ipykernel} | {row.sandbox} | {row.reason} |" in text, row.name
