"""The reference pages are made from the code (scripts/reference_pages.py): docs/http-api.md
from the OpenAPI document the server serves, docs/cli.md from the CLI's own --help. A page
that is not what the code makes now fails here, naming the command that remakes it."""

from __future__ import annotations

import importlib.util
import json

import pytest

from support import REPO


def _script():
    spec = importlib.util.spec_from_file_location("reference_pages", REPO / "scripts" / "reference_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pages = _script()


def test_the_reference_pages_are_what_the_code_makes(capsys):
    assert pages.main(["--check"]) == 0, capsys.readouterr().err


def test_the_http_page_is_made_from_the_document_the_server_serves(api):
    """Made from what `GET /v1/openapi.json` answers on a running server, the page is the
    checked-in one: the script reads the same document the server serves."""
    served = api.get("/v1/openapi.json")
    assert served.status_code == 200, served.text
    assert pages.http_api(served.json()) == (REPO / "docs" / "http-api.md").read_text()
    for path, methods in served.json()["paths"].items():
        for method in methods:
            assert f"## `{method.upper()} {path}`" in pages.http_api(served.json())


def test_every_command_has_its_help_on_the_cli_page():
    from sandbox.cli import build_parser

    text = (REPO / "docs" / "cli.md").read_text()
    for command, _ in pages._commands(build_parser(), "sandbox-kernel"):
        assert f"## `{command}`" in text, command


@pytest.mark.parametrize("drift", ["route", "option"])
def test_a_page_out_of_date_is_caught(tmp_path, monkeypatch, drift, capsys):
    """The control: a route or an option the code gained after the page was made is found."""
    pages.main(["--write"], docs=tmp_path)
    assert pages.main(["--check"], docs=tmp_path) == 0
    if drift == "route":
        from sandbox.service.api import openapi_document

        document = json.loads(json.dumps(openapi_document()))
        document["paths"]["/v1/brand-new"] = {"get": {"summary": "A route added later", "responses": {}}}
        monkeypatch.setitem(pages.PAGES, "http-api.md", lambda: pages.http_api(document))
    else:
        from sandbox import cli

        build = cli.build_parser

        def with_a_new_option():
            parser = build()
            parser.add_argument("--brand-new-option")
            return parser

        monkeypatch.setattr(cli, "build_parser", with_a_new_option)
    assert pages.main(["--check"], docs=tmp_path) == 1
    assert ("http-api.md" if drift == "route" else "cli.md") in capsys.readouterr().err
