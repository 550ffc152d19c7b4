"""Session-wide fixtures: one real sandbox server for the whole test run.

The server is started for real (``python -m sandbox serve``, real bwrap, real cgroups);
its first start builds the default image. Set SANDBOX_KERNEL_TEST_STATE_DIR to reuse a
state directory (and its image) between runs.
"""

from __future__ import annotations

import pathlib
import sys
import typing as t

import httpx
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent / "kernel"))

import sandbox_test_support as support  # noqa: E402


@pytest.fixture(scope="session")
def sandbox_server() -> t.Iterator[support.TestServer]:
    try:
        server = support.get_server()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    support.stop_server(server)


@pytest.fixture
def api(sandbox_server: support.TestServer) -> t.Iterator[httpx.Client]:
    """An authenticated httpx client on the test server (base URL set, no timeout surprises)."""
    with httpx.Client(base_url=sandbox_server.url, timeout=120,
                      headers={"Authorization": f"Bearer {sandbox_server.token}"}) as client:
        yield client


@pytest.fixture
def new_sandbox(api: httpx.Client) -> t.Iterator[t.Callable[..., dict]]:
    """Factory: new_sandbox(**create_fields) -> sandbox JSON; every one is deleted afterwards."""
    made: list[str] = []

    def create(**fields) -> dict:
        r = api.post("/v1/sandboxes", json=fields)
        assert r.status_code == 201, r.text
        made.append(r.json()["id"])
        return r.json()

    yield create
    for sandbox_id in made:
        api.delete(f"/v1/sandboxes/{sandbox_id}")


def execute(api: httpx.Client, sandbox_id: str, code: str, **fields) -> list[dict]:
    """Run code; return the list of NDJSON events (the last one is ``done``)."""
    import json

    events = []
    with api.stream("POST", f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code, **fields}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line:
                events.append(json.loads(line))
    return events


@pytest.fixture
def run(api: httpx.Client) -> t.Callable[..., list[dict]]:
    """run(sandbox_id, code, **fields) -> the execute's events, ``done`` last."""
    return lambda sandbox_id, code, **fields: execute(api, sandbox_id, code, **fields)
