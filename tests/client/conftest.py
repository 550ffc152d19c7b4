"""Fixtures for the client tests, on the session's real server (tests/conftest.py)."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "kernel"))

import sandbox_test_support as support  # noqa: E402


@pytest.fixture
def server(sandbox_server: support.TestServer) -> support.TestServer:
    return sandbox_server
