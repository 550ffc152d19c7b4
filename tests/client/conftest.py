"""Fixtures for the client tests, on the session's real server (tests/conftest.py).

`client` is parametrized over the client's two flavours behind one blocking surface, so
each test runs against both: the sync client as it is, and the async client (the kernel's,
from which the sync one is generated) driven to completion on an event loop in a thread of
its own. That is a bridge, not a mock: every call is the async client's real call on the
real server; only the waiting is done here.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import types
import typing as t

import pytest

import support
from sandbox.client import Sandbox, async_client, sync_client


class LoopThread:
    """One event loop running forever in a daemon thread; `run` waits for a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="client-loop", daemon=True)
        self.thread.start()

    def run(self, coro: t.Awaitable[t.Any]) -> t.Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Blocking:
    """An async client object (class or instance) whose coroutine methods block until done.

    Attributes that are async client objects themselves (`files`, `commands`, what
    `create` returns) come back wrapped too; plain values pass through.
    """

    def __init__(self, target: t.Any, loop: LoopThread) -> None:
        self._target = target
        self._loop = loop

    def _wrap(self, value: t.Any) -> t.Any:
        if isinstance(value, (async_client.AsyncSandbox, async_client.AsyncFiles, async_client.AsyncCommands,
                              async_client.AsyncSaves)):
            return Blocking(value, self._loop)
        return value

    def __getattr__(self, name: str) -> t.Any:
        value = getattr(self._target, name)
        if inspect.iscoroutinefunction(value):
            return lambda *args, **kwargs: self._wrap(self._loop.run(value(*args, **kwargs)))
        return self._wrap(value)

    def __call__(self, *args: t.Any, **kwargs: t.Any) -> t.Any:
        return self._wrap(self._target(*args, **kwargs))

    def __enter__(self) -> Blocking:
        self._loop.run(self._target.__aenter__())
        return self

    def __exit__(self, *exc_info: t.Any) -> None:
        self._loop.run(self._target.__aexit__(*exc_info))


def sync_flavour() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        name="sync", Sandbox=Sandbox, list_sandboxes=sync_client.list_sandboxes, health=sync_client.health,
        list_saves=sync_client.list_saves, delete_save=sync_client.delete_save,
    )


def async_flavour(loop: LoopThread) -> types.SimpleNamespace:
    def blocking(fn: t.Callable[..., t.Awaitable[t.Any]]) -> t.Callable[..., t.Any]:
        return lambda *args, **kwargs: loop.run(fn(*args, **kwargs))

    return types.SimpleNamespace(
        name="async",
        Sandbox=Blocking(async_client.AsyncSandbox, loop),
        list_sandboxes=blocking(async_client.list_sandboxes),
        health=blocking(async_client.health),
        list_saves=blocking(async_client.list_saves),
        delete_save=blocking(async_client.delete_save),
    )


@pytest.fixture
def server(sandbox_server: support.Server) -> support.Server:
    return sandbox_server


@pytest.fixture(scope="session")
def client_loop() -> t.Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="module", params=["sync", "async"])
def client(request: pytest.FixtureRequest, client_loop: LoopThread) -> types.SimpleNamespace:
    """The client under test: `.Sandbox`, `.list_sandboxes`, `.health`, `.list_saves`, `.delete_save`, all blocking."""
    return sync_flavour() if request.param == "sync" else async_flavour(client_loop)
