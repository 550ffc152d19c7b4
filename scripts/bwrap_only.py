#!/usr/bin/env python3
"""The tests of the tiered suites that do not apply to the gvisor tier, and why.

The one definition is each test's ``@pytest.mark.bwrap_only(reason=...)`` (or a module's
``pytestmark``) in tests/security and tests/reliability; docs/security.md holds
the list this prints, between its ``bwrap-only`` comment lines, and
tests/unit/test_bwrap_only_list.py fails when the two differ.

    python3 scripts/bwrap_only.py            # print the list (Markdown)
    python3 scripts/bwrap_only.py --write    # put it into docs/security.md
"""

from __future__ import annotations

import argparse
import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
SUITES = ("tests/security", "tests/reliability")
BEGIN, END = "<!-- bwrap-only: begin (scripts/bwrap_only.py --write) -->", "<!-- bwrap-only: end -->"


def _reason(node: ast.expr) -> str | None:
    """The reason of a ``pytest.mark.bwrap_only(...)`` call, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "bwrap_only"):
        return None
    for kw in node.keywords:
        if kw.arg == "reason":
            return ast.literal_eval(kw.value)
    return ast.literal_eval(node.args[0])


def bwrap_only(root: pathlib.Path = REPO) -> list[tuple[str, str]]:
    """(test, reason) for every marked test (a marked module: ``file`` alone), in file order."""
    found = []
    for suite in SUITES:
        for path in sorted((root / suite).glob("test_*.py")):
            tree = ast.parse(path.read_text())
            rel = path.relative_to(root).as_posix()
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
                    values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                    for value in values:
                        if (reason := _reason(value)) is not None:
                            found.append((f"{rel} (every test)", reason))
                elif isinstance(node, ast.FunctionDef):
                    for deco in node.decorator_list:
                        if (reason := _reason(deco)) is not None:
                            found.append((f"{rel}::{node.name}", reason))
    return found


def markdown(root: pathlib.Path = REPO) -> str:
    return "\n".join(f"- `{test}`: {reason}" for test, reason in bwrap_only(root))


def page_block(text: str) -> str:
    """What the page holds between the two comment lines."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="put the list into docs/security.md")
    args = parser.parse_args()
    if not args.write:
        print(markdown())
        return
    page = REPO / "docs" / "security.md"
    head, rest = page.read_text().split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(head + BEGIN + "\n" + markdown() + "\n" + END + tail)


if __name__ == "__main__":
    main()
