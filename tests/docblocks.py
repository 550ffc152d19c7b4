"""The fenced code blocks of README.md and the site's pages (docs/*.md, and the files they
include), with the reason a block is not run and the output it is documented to print.

A block's documented output is the ```text block right after it whose fence follows the line
``<!-- output -->``: the test compares it with what the block prints, doctest-style (``...``
stands for any text, runs of whitespace are one space), so a printed value that changes
fails. Read by the test that runs every documented snippet (tests/docs/test_documented_snippets.py)
and by the fresh-clone test, which takes README's run line from its block rather than from a
copy that could drift from it.
"""

from __future__ import annotations

import pathlib
import re
import typing as t

from support import REPO

SITE_PAGES = sorted((REPO / "docs").glob("*.md"))
INCLUDE = re.compile(r"^```\{include\}\s+(\S+)", re.M)  # a page that shows another file (bench/README.md)
INCLUDED = sorted({(page.parent / name).resolve() for page in SITE_PAGES for name in INCLUDE.findall(page.read_text())})
DOCS = [REPO / "README.md", *SITE_PAGES, *INCLUDED]
CODE = {"python", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
COMMAND_LINE = re.compile(r"^(sandbox-kernel|import|from|python3?|curl|pip) ", re.M)  # code, not a diagram
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->\s*$")
OUTPUT = re.compile(r"<!--\s*output\s*-->\s*$")  # the next ```text block is the one above's output


class Block(t.NamedTuple):
    path: pathlib.Path
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, when marked
    output: str | None = None  # what it prints, when documented (an OUTPUT block follows it)

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
            if OUTPUT.search(before):
                if not found or found[-1].path != path or found[-1].output is not None or match[1] != "text":
                    raise ValueError(f"{path.name}:{line}: an output block is a ```text block right after a code block")
                found[-1] = found[-1]._replace(output=match[2])
                continue
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
