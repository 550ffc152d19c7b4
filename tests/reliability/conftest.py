"""Fixtures for the reliability tests: servers of their own (to kill), on state directories
that borrow the session server's built image instead of building one each."""

from __future__ import annotations

import pathlib
import secrets
import shutil
import sys
import typing as t

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import support  # noqa: E402

# A server on a borrowed image starts in about a second: one that takes minutes is broken.
START_TIMEOUT = 120.0


@pytest.fixture(scope="session")
def image_source(sandbox_server) -> t.Iterator[pathlib.Path]:
    """A state directory with a built default image: the session server's, else one built here."""
    if support.has_default_image(sandbox_server.state_dir):
        yield sandbox_server.state_dir
        return
    state = support.make_state_dir("sk-rel-images-")
    try:
        support.build_default_image(state)
        yield state
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def spawn_server(image_source: pathlib.Path) -> t.Iterator[t.Callable[..., support.Server]]:
    """spawn_server(*serve_args) -> a started Server on a fresh state directory; everything
    it and its sandboxes left is removed afterwards."""
    made: list[support.Server] = []

    def spawn(*args: str) -> support.Server:
        state = support.make_state_dir("sk-rel-", images_from=image_source)
        server = support.Server(state, "--pool-size", "0", "--log-level", "info", *args,
                                token=secrets.token_hex(16), start_timeout=START_TIMEOUT)
        made.append(server)
        server.start()
        return server

    yield spawn
    for server in made:
        server.close()
