"""The site's reference pages, made from the code rather than copied from it.

- docs/http-api.md: every route of the OpenAPI document the server serves at
  ``/v1/openapi.json`` (``sandbox.service.api.openapi_document``): its method, path,
  summary, parameters, request body fields and answers;
- docs/cli.md: ``sandbox-kernel --help`` and every command's ``--help``, as argparse prints
  them at a fixed width.

The kernel's settings table is made the same way by scripts/kernel_settings_table.py, into
docs/kernel.md. tests/docs/test_reference_pages.py fails when a page is not what this script
makes, so neither can drift from the code:

    python scripts/reference_pages.py --write    # rewrite the pages
    python scripts/reference_pages.py --check    # exit 1 naming the stale pages
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import typing as t

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HELP_WIDTH = "100"  # argparse wraps to $COLUMNS: a fixed width, so the page does not depend on a terminal


def _schema_type(schema: dict) -> str:
    """A short spelling of a JSON schema's type (`string`, `integer \\| null`, `array of string`)."""
    if "oneOf" in schema:
        return " or ".join(_schema_type(s) for s in schema["oneOf"])
    kind = schema.get("type", "object" if "properties" in schema else "any")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return f"array of {_schema_type(schema['items'])}"
    if "enum" in schema:
        return f"{kind}: " + ", ".join(f"`{v}`" for v in schema["enum"])
    return kind


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _parameters(operation: dict) -> list[str]:
    rows = [f"| `{p['name']}` | {p['in']} | {_schema_type(p.get('schema', {}))} | {_cell(p.get('description', ''))} |"
            for p in operation.get("parameters", [])]
    return ["| parameter | in | type | what it is |", "| --- | --- | --- | --- |", *rows, ""] if rows else []


def _body(operation: dict) -> list[str]:
    content = operation.get("requestBody", {}).get("content", {})
    schema = next(iter(content.values()), {}).get("schema", {}) if content else {}
    fields = schema.get("properties", {})
    if not content:
        return []
    if not fields:
        return [f"Body: `{next(iter(content))}`.", ""]
    required = set(schema.get("required", []))
    rows = [f"| `{name}` | {_schema_type(field)} | {'yes' if name in required else 'no'} | {_cell(field.get('description', ''))} |"
            for name, field in fields.items()]
    return ["| body field | type | required | what it is |", "| --- | --- | --- | --- |", *rows, ""]


def _answers(operation: dict) -> list[str]:
    answers = []
    for status, response in operation.get("responses", {}).items():
        kinds = ", ".join(f"`{k}`" for k in response.get("content", {}))
        answers.append(f"{status} ({kinds})" if response.get("description") == "success" and kinds else status)
    return [f"Answers: {', '.join(answers)}.", ""]


def http_api(document: dict | None = None) -> str:
    if document is None:
        from sandbox.service.api import openapi_document
        document = openapi_document()
    lines = ["# HTTP API reference", "",
             f"Every route of the sandbox server's OpenAPI document (`GET /v1/openapi.json`, OpenAPI "
             f"{document['openapi']}, version {document['info']['version']}), made by "
             "`python scripts/reference_pages.py --write` from the route table the server serves it from "
             "(`sandbox/service/api.py`, `ENDPOINTS`); a test fails when this page is not what the server serves. "
             "The contract in prose, with every event and error: [HTTP API](api.md). Every route but "
             "`/v1/health` needs the bearer token over TCP; errors are JSON (`{\"error\": {\"code\", \"message\"}}`).",
             ""]
    for path, methods in sorted(document["paths"].items()):
        for method, operation in methods.items():
            lines += [f"## `{method.upper()} {path}`", "", _cell(operation.get("summary", "")) + ".", ""]
            lines += _parameters(operation) + _body(operation) + _answers(operation)
    return "\n".join(lines).rstrip("\n") + "\n"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        return parser.format_help().rstrip("\n")
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def _commands(parser: argparse.ArgumentParser, prefix: str) -> t.Iterator[tuple[str, argparse.ArgumentParser]]:
    for name, sub in _subparsers(parser).items():
        yield f"{prefix} {name}", sub
        yield from _commands(sub, f"{prefix} {name}")


def cli() -> str:
    from sandbox.cli import build_parser

    parser = build_parser()
    lines = ["# CLI reference", "",
             "`sandbox-kernel --help` and every command's `--help`, as the CLI prints them (made by "
             "`python scripts/reference_pages.py --write`; a test fails when this page is not what the CLI "
             "prints). What it says when it cannot do its job: [CLI messages](cli-messages.md); the commands "
             "in use: [Operations](operations.md).", "",
             "## `sandbox-kernel`", "", "```text", _help(parser), "```", ""]
    for command, sub in _commands(parser, "sandbox-kernel"):
        lines += [f"## `{command}`", "", "```text", _help(sub), "```", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


PAGES: dict[str, t.Callable[[], str]] = {"http-api.md": http_api, "cli.md": cli}


def stale(docs: pathlib.Path = DOCS) -> list[str]:
    """The pages whose text is not what the code makes now."""
    return [name for name, make in PAGES.items()
            if not (docs / name).exists() or (docs / name).read_text() != make()]


def main(argv: list[str], docs: pathlib.Path = DOCS) -> int:
    sys.path.insert(0, str(ROOT))
    if argv == ["--write"]:
        for name, make in PAGES.items():
            (docs / name).write_text(make())
        return 0
    if argv == ["--check"]:
        wrong = stale(docs)
        if wrong:
            print(f"stale reference pages in {docs}: {', '.join(wrong)}: python scripts/reference_pages.py --write",
                  file=sys.stderr)
            return 1
        return 0
    print("usage: python scripts/reference_pages.py --write | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
