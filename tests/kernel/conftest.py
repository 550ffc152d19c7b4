"""Fixtures for the kernel tests: the kernelspec and real kernels on the session's real
server (`sandbox_server`, from tests/conftest.py).

No mocks: every test talks to `python -m sandbox serve` through the real kernel process.
The machinery lives in tests/support.py.
"""

from __future__ import annotations

import os
import pathlib
import typing as t

import pytest

import support


@pytest.fixture(scope="session")
def jupyter_data() -> t.Iterator[pathlib.Path]:
    yield support.install_kernelspec()
    support.remove_kernelspec()


@pytest.fixture(scope="session")
def kernel_env(sandbox_server: support.Server, jupyter_data: pathlib.Path) -> t.Iterator[dict[str, str]]:
    """Points this process (and so the kernels it starts) at the test server.

    Set in os.environ because jupyter_kernel_test starts its kernel itself, with our
    environment; restored afterwards.
    """
    env = support.kernel_environ(sandbox_server, jupyter_data)
    saved = dict(os.environ)
    os.environ.update(env)
    yield env
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def start_kernel(kernel_env: dict[str, str], tmp_path: pathlib.Path) -> t.Iterator[t.Callable[..., t.Any]]:
    """Factory: start_kernel(cwd=None, **env_overrides) -> (km, kc); all shut down after."""
    started: list[tuple[t.Any, t.Any]] = []

    def start(cwd: str | os.PathLike | None = None, **overrides: str) -> tuple[t.Any, t.Any]:
        env = dict(kernel_env)
        env.update(overrides)
        km, kc = support.start_kernel("sandbox", cwd=cwd or tmp_path, env=env, startup_timeout=60)
        started.append((km, kc))
        return km, kc

    yield start
    for km, kc in started:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=False)


@pytest.fixture
def kernel(start_kernel: t.Callable[..., t.Any]) -> tuple[t.Any, t.Any]:
    return start_kernel()


@pytest.fixture
def kc(kernel: tuple[t.Any, t.Any]) -> t.Any:
    return kernel[1]


@pytest.fixture
def client_env(sandbox_server: support.Server) -> dict[str, str]:
    return sandbox_server.env
