"""The sync client is generated from the async one (scripts/unasync.py): the committed
sync_client.py must be what the script makes of async_client.py today, so that an edit to
the async client that was not regenerated fails here rather than drifting."""

from __future__ import annotations

import ast
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _unasync():
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sync_client_is_generated_from_the_async_one(capsys):
    status = _unasync().main(["--check"])
    assert status == 0, capsys.readouterr().err


def test_generated_client_has_no_async_left():
    text = (ROOT / "sandbox" / "client" / "sync_client.py").read_text()
    assert text.startswith("# GENERATED FILE: do not edit.")
    tree = ast.parse(text)
    left = [type(node).__name__ for node in ast.walk(tree)
            if isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncWith, ast.AsyncFor))]
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    left += sorted(name for name in names if "Async" in name or name.startswith(("aiter", "aread", "aclose", "__a")))
    assert not left
