"""Session-wide fixtures: one real sandbox server for the whole test run.

The server is started for real (``python -m sandbox serve``, real bwrap, real cgroups);
its first start builds the default image. Set SANDBOX_KERNEL_TEST_STATE_DIR to reuse a
state directory (and its image) between runs (tests/support.py lists the others).
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import typing as t

import httpx
import pytest

# Every suite imports `support` by that one name: pytest's default import mode would put
# this directory on sys.path too, but not under --import-mode=importlib.
HERE = str(pathlib.Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import support  # noqa: E402

from sandbox.isolation import gvisor  # noqa: E402

#: The isolation tiers the tiered suites (tests/security, tests/reliability) run against.
TIERS = ("bwrap", "gvisor")


@pytest.fixture(scope="module", params=TIERS)
def isolation(request: pytest.FixtureRequest) -> str:
    """The isolation tier of a suite's sandboxes: a test that creates its sandboxes through
    this fixture (or a fixture built on it) runs once per tier, the tier in its id. The gvisor
    half is skipped, with the reason, where runsc cannot run. Module scope, so that a suite's
    own servers and shared sandboxes are made once per tier."""
    if request.param == "gvisor":
        ok, why = gvisor.available()
        if not ok:
            pytest.skip(f"gvisor backend unavailable here: {why}")
    return request.param


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``bwrap_only(reason=...)`` is skipped in its gvisor run, the reason printed."""
    for item in items:
        marker = item.get_closest_marker("bwrap_only")
        callspec = getattr(item, "callspec", None)
        if marker is not None and callspec is not None and callspec.params.get("isolation") == "gvisor":
            item.add_marker(pytest.mark.skip(reason=f"bwrap only: {bwrap_only_reason(marker)}"))


def bwrap_only_reason(marker: pytest.Mark) -> str:
    reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
    if not reason:
        raise pytest.UsageError("bwrap_only needs a reason: why the test does not apply to the gvisor tier")
    return reason


@pytest.fixture(scope="session")
def sandbox_server() -> t.Iterator[support.Server]:
    try:
        server = support.start_session_server()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.close()


@pytest.fixture(scope="session")
def image_source(sandbox_server: support.Server) -> t.Iterator[pathlib.Path]:
    """A state directory with a built default image, for servers of a test's own
    (`support.own_server`): the session server's, else one built here."""
    if support.has_default_image(sandbox_server.state_dir):
        yield sandbox_server.state_dir
        return
    state = support.make_state_dir("sk-images-")
    try:
        support.build_default_image(state)
        yield state
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def spawn_server(image_source: pathlib.Path) -> t.Iterator[t.Callable[..., support.Server]]:
    """spawn_server(*serve_args, extra_env=None) -> a started server of the test's own (to
    kill, stop or weaken) on a fresh state directory; all it and its sandboxes left is
    removed afterwards."""
    made: list[support.Server] = []

    def spawn(*args: str, extra_env: dict[str, str] | None = None) -> support.Server:
        server = support.own_server(image_source, *args, extra_env=extra_env)
        made.append(server)
        server.start()
        return server

    yield spawn
    for server in made:
        server.close()


@pytest.fixture
def api(sandbox_server: support.Server) -> t.Iterator[httpx.Client]:
    """An authenticated httpx client on the test server (base URL set, no timeout surprises)."""
    with sandbox_server.client(timeout=120) as client:
        yield client


@pytest.fixture
def new_sandbox(api: httpx.Client) -> t.Iterator[t.Callable[..., dict]]:
    """Factory: new_sandbox(**create_fields) -> sandbox JSON; every one is deleted afterwards."""
    made: list[str] = []

    def create(**fields) -> dict:
        sandbox = support.create(api, **fields)
        made.append(sandbox["id"])
        return sandbox

    yield create
    for sandbox_id in made:
        api.delete(f"/v1/sandboxes/{sandbox_id}")


@pytest.fixture
def run(api: httpx.Client) -> t.Callable[..., list[dict]]:
    """run(sandbox_id, code, **fields) -> the execute's events, ``done`` last."""
    return lambda sandbox_id, code, **fields: support.execute(api, sandbox_id, code, **fields)
