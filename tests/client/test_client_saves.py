"""State by value through the client, in both flavours: save a sandbox's variables, start a
new sandbox from the save, and see what came back and what did not."""

from __future__ import annotations

import secrets

import pytest

from sandbox.client import SandboxError, SandboxNotFound

pytestmark = pytest.mark.bwrap_only("state by value is the default tier's way to outlive a sandbox")


@pytest.mark.slow
def test_a_save_comes_back_in_a_sandbox_created_from_it(server, client):
    label = f"client-{secrets.token_hex(4)}"
    with client.Sandbox.create(url=server.url, token=server.token) as first:
        first.run_code("import numpy as np\nweights = np.arange(6.0).reshape(2, 3)\ndouble = lambda v: 2 * v\n"
                       "import threading\nworker = threading.Thread(target=print)")
        save = first.saves.save(label)
    assert save["summary"]["saved_count"] == 2
    assert [(i["name"], i["why"].split(":")[0]) for i in save["summary"]["lost"]] == [
        ("worker", "a live threading object")]
    assert [s["id"] for s in client.list_saves(label, url=server.url, token=server.token)] == [save["id"]]
    try:
        with client.Sandbox.create(from_save=save["id"], url=server.url, token=server.token) as second:
            assert sorted(i["name"] for i in second.info.restored["restored"]) == ["double", "weights"]
            assert [m["name"] for m in second.info.restored["modules"]] == ["np", "threading"]
            assert second.info.restored["save"]["id"] == save["id"]
            assert second.run_code("double(weights).sum()").text == "np.float64(30.0)"
            # restore into a running sandbox, by id
            second.run_code("del weights")
            again = second.saves.restore(save["id"])
            assert "weights" in {i["name"] for i in again["restored"]}
    finally:
        client.delete_save(save["id"], url=server.url, token=server.token)
    assert client.list_saves(label, url=server.url, token=server.token) == []
    with pytest.raises(SandboxNotFound):
        client.delete_save(save["id"], url=server.url, token=server.token)


def test_a_missing_save_is_a_clear_error(server, client):
    with pytest.raises(SandboxError) as raised:
        client.Sandbox.create(from_save="sv-0000000000000000", url=server.url, token=server.token)
    assert "no save" in str(raised.value)
