"""Saves by value on a shared (--multi-user) server, with real users: each user's saves are
their own (another user's save id is answered as an unknown one, for every route that takes
it), and one user filling their saves_max_mb leaves the others' room whole."""

from __future__ import annotations

import pytest

import support
from test_multiuser import as_user, client_script, shared_server, small_shared_server, users  # noqa: F401

pytestmark = [pytest.mark.slow,
              pytest.mark.bwrap_only("state by value is the default tier's way to outlive a sandbox")]


def test_a_users_saves_are_theirs_alone(users, client_script, shared_server):  # noqa: F811
    alice, bob = users
    sock = shared_server.state_dir / "server.sock"

    def call(user, method, path, body=None):
        return as_user(user, client_script, sock, method, path, body)

    sid = call(alice, "POST", "/v1/sandboxes", {"ttl_seconds": 600})["body"]["id"]
    assert call(alice, "POST", f"/v1/sandboxes/{sid}/execute", {"code": "secret = 'alice-42'"})["status"] == 200
    saved = call(alice, "POST", f"/v1/sandboxes/{sid}/save", {"label": "mine"})
    assert saved["status"] == 201, saved
    save_id = saved["body"]["id"]
    # control: alice reaches her save
    assert call(alice, "GET", f"/v1/saves/{save_id}")["status"] == 200
    assert [s["id"] for s in call(alice, "GET", "/v1/saves")["body"]["saves"]] == [save_id]

    bobs = call(bob, "POST", "/v1/sandboxes", {"ttl_seconds": 600})["body"]["id"]
    assert call(bob, "GET", "/v1/saves")["body"]["saves"] == []
    for method, path, body in [("GET", f"/v1/saves/{save_id}", None), ("DELETE", f"/v1/saves/{save_id}", None),
                               ("POST", "/v1/sandboxes", {"from_save": save_id}),
                               ("POST", f"/v1/sandboxes/{bobs}/restore", {"save_id": save_id})]:
        answer = call(bob, method, path, body)
        assert answer["status"] == 404 and answer["body"]["error"]["code"] == "save_not_found", (method, path, answer)
    assert call(bob, "POST", f"/v1/sandboxes/{bobs}/execute", {"code": "'secret' in dir()"})["body"][-2]["data"][
        "text/plain"] == "False"
    # alice's save survived bob's attempts
    restored = call(alice, "POST", "/v1/sandboxes", {"from_save": save_id})
    assert restored["status"] == 201 and restored["body"]["restored"]["restored"][0]["name"] == "secret", restored


def test_one_user_filling_their_saves_leaves_the_others_room(users, client_script, sandbox_server):  # noqa: F811
    alice, bob = users
    with small_shared_server(sandbox_server, "saves_max_mb=1") as server:
        sock = server.state_dir / "server.sock"

        def save_big(user):
            sid = as_user(user, client_script, sock, "POST", "/v1/sandboxes", {"ttl_seconds": 300})["body"]["id"]
            as_user(user, client_script, sock, "POST", f"/v1/sandboxes/{sid}/execute", {"code": "b = bytes(600_000)"})
            return [as_user(user, client_script, sock, "POST", f"/v1/sandboxes/{sid}/save", {}) for _ in range(2)]

        first, second = save_big(alice)
        assert first["status"] == 201 and second["status"] == 409, (first, second)
        assert second["body"]["error"]["code"] == "save_refused", second
        assert [s["status"] for s in save_big(bob)] == [201, 409]
