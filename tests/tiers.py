"""The per-tier versions of tests/conftest.py's sandbox fixtures, for the suites that run
against every isolation tier (tests/security, tests/reliability): their conftests import
these, so that each suite's `new_sandbox` and `spawn_server` create in the `isolation` of
the run (tests/conftest.py), the tier in every test id."""

from __future__ import annotations

import typing as t

import pytest

import support


@pytest.fixture
def new_sandbox(new_sandbox: t.Callable[..., dict], isolation: str) -> t.Callable[..., dict]:
    """tests/conftest.py's factory, creating in this run's tier unless a test names one."""
    return lambda **fields: new_sandbox(**{"isolation": isolation, **fields})


@pytest.fixture
def spawn_server(spawn_server: t.Callable[..., support.Server], isolation: str) -> t.Callable[..., support.Server]:
    """tests/conftest.py's own servers, with this run's tier as their default isolation."""
    return lambda *args, **kwargs: spawn_server(*args, *support.tier_args(isolation), **kwargs)
