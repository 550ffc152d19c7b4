"""Fixtures for the reliability tests: servers of their own (to kill), on state directories
that borrow the session server's built image instead of building one each."""

from __future__ import annotations

import pathlib
import shutil
import sys
import typing as t

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import reliability_support as rs  # noqa: E402


@pytest.fixture(scope="session")
def image_source(sandbox_server) -> t.Iterator[pathlib.Path]:
    """A state directory with a built default image: the session server's, else one built here."""
    if rs.has_default_image(sandbox_server.state_dir):
        yield sandbox_server.state_dir
        return
    state = rs.make_state_dir(None, prefix="sk-rel-images-")
    try:
        rs.build_default_image(state)
        yield state
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def spawn_server(image_source: pathlib.Path) -> t.Iterator[t.Callable[..., rs.Server]]:
    """spawn_server(*serve_args, start=True) -> a started Server on a fresh state directory;
    everything it and its sandboxes left is removed afterwards."""
    made: list[rs.Server] = []

    def spawn(*args: str, start: bool = True) -> rs.Server:
        server = rs.Server(rs.make_state_dir(image_source), *args)
        made.append(server)
        if start:
            server.start()
        return server

    yield spawn
    for server in made:
        server.stop()
        rs.sweep(server.state_dir)
        shutil.rmtree(server.state_dir, ignore_errors=True)
