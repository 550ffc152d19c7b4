"""The table of the kernel's settings (docs/kernel.md), made from the traits of kernel/config.py.

Each configurable trait of `SandboxSettings` is one row: its name (`--SandboxKernel.NAME`),
the environment variable it falls back to (the trait's `env` tag), its default, and its
help text. docs/kernel.md holds the table between two markers; tests/unit/test_kernel_settings.py
fails when the page's table is not what this script makes, so the two cannot drift:

    python scripts/kernel_settings_table.py --write    # rewrite the page's table
    python scripts/kernel_settings_table.py --check    # exit 1 if the page's table is stale
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "kernel.md"
BEGIN = "<!-- kernel settings: made by scripts/kernel_settings_table.py -->"
END = "<!-- end of kernel settings -->"


def _default(trait) -> str:
    value = trait.default_value
    if value is None or type(value).__name__ == "_Undefined" or repr(value) == "traitlets.Undefined":
        return "unset"
    return f"`{value!r}`"


def _help(text: str) -> str:
    text = re.sub(r"\s*\(env [A-Z_]+(?:=1)?(?:, JSON)?\)", "", text)  # the env column says it
    return " ".join(text.split()).replace("|", "\\|")


def table() -> str:
    sys.path.insert(0, str(ROOT))
    from kernel.config import SandboxSettings

    rows = ["| setting (`--SandboxKernel.…`) | environment variable | default | what it does |", "| --- | --- | --- | --- |"]
    for name, trait in sorted(SandboxSettings.class_traits(config=True).items()):
        env = trait.metadata.get("env")
        rows.append(f"| `{name}` | {f'`{env}`' if env else '-'} | {_default(trait)} | {_help(trait.help)} |")
    return "\n".join(rows)


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def current(page: str) -> str | None:
    match = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), page, re.DOTALL)
    return match.group(0) if match else None


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    found = current(page)
    if argv == ["--write"]:
        if found is None:
            print(f"{PAGE} has no {BEGIN!r} marker", file=sys.stderr)
            return 1
        PAGE.write_text(page.replace(found, block()))
        return 0
    if argv == ["--check"]:
        if found != block():
            print(f"{PAGE.name}'s kernel settings table is stale: python scripts/kernel_settings_table.py --write",
                  file=sys.stderr)
            return 1
        return 0
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
