"""The fenced code blocks of README.md and docs/*.md, with the reason a block is not run.

Read by the test that runs every documented snippet (tests/docs/test_documented_snippets.py)
and by the fresh-clone test, which takes README's run line from its block rather than from a
copy that could drift from it.
"""

from __future__ import annotations

import pathlib
import re
import typing as t

from support import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CODE = {"python", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
COMMAND_LINE = re.compile(r"^(sandbox-kernel|import|from|python3?|curl|pip) ", re.M)  # code, not a diagram
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->\s*$")


class Block(t.NamedTuple):
    path: pathlib.Path
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks(docs: t.Iterable[pathlib.Path] = DOCS) -> list[Block]:
    found = []
    for path in docs:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = NOT_RUN.search(before)
            found.append(Block(path, line, match[1], match[2], marker[1] if marker else None))
    return found


def readme_run_line(readme: pathlib.Path) -> str:
    """README's run line ("Two commands"): its first bash block that installs the project and
    starts `lab`."""
    for block in blocks([readme]):
        if block.lang == "bash" and "sandbox-kernel lab" in block.code and "pip install" in block.code:
            return block.code.strip()
    raise LookupError("README.md has no bash block that installs the project and starts `sandbox-kernel lab`")
