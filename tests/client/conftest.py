"""Fixtures for the client tests, on the session's real server (tests/conftest.py)."""

from __future__ import annotations

import pytest

import support


@pytest.fixture
def server(sandbox_server: support.Server) -> support.Server:
    return sandbox_server
