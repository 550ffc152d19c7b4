"""sandbox/gateway/users.py and the scope family rule it relies on, without a gateway: tokens
verify under their own secret only, labels spell each name one way, and a user's scope
reaches that user's sandboxes and their agents' only (tests/gateway/test_gateway_users.py
checks the same through the real gateway and node)."""

from __future__ import annotations

import pytest

from sandbox.common.errors import ApiError
from sandbox.gateway import callers, users
from sandbox.service import scopes


def test_a_token_names_its_user_under_its_own_secret_only():
    token = users.mint("secret-a", "alice@example.org")
    assert users.verify("secret-a", token) == "alice@example.org"
    assert users.verify("secret-b", token) is None
    assert users.verify("", token) is None  # user tokens not enabled
    encoded = token.split(".")[1]
    bobs_signature = users.mint("secret-a", "bob").rsplit(".", 1)[1]
    assert users.verify("secret-a", f"{users.PREFIX}{encoded}.{bobs_signature}") is None
    assert users.verify("secret-a", token[:-1] + ("0" if token[-1] != "0" else "1")) is None
    for malformed in ("sbu1.", "sbu1..", "sbu1.%%%.00", "alice", ""):
        assert users.verify("secret-a", malformed) is None


def test_names_that_cannot_have_a_token_are_refused_with_the_reason():
    with pytest.raises(users.UserTokenError, match="SANDBOX_KERNEL_USER_SECRET"):
        users.mint("", "alice")
    with pytest.raises(users.UserTokenError, match="empty"):
        users.mint("s", "")
    with pytest.raises(users.UserTokenError, match="too long"):
        users.mint("s", "x" * (users.NAME_LABEL_MAX + 1))


@pytest.mark.parametrize("name", ["alice", "a_b", "a@b", "a:b", "Ünïcode", "x.y-z"])
def test_each_name_has_one_label_and_comes_back_from_it(name):
    label = users.label(name)
    assert scopes.NAME.match(label), label
    assert users.owner_of_label(label) == name
    assert users.owner_of_label(label + ":agent") == name
    assert users.label("a_b") != users.label("a@b") != users.label("a:b")


def test_a_users_scope_reaches_their_own_and_their_agents_sandboxes_only():
    alice = scopes.parse(callers.user_scope("alice", None))
    assert alice.may_reach("user:alice") and alice.may_reach("user:alice:helper")
    for other in ("user:bob", "user:bob:helper", "user:alicex", None, "helper"):
        assert not alice.may_reach(other), other
    agent = scopes.parse(callers.user_scope("alice", "helper, *"))
    assert agent.own == "user:alice:helper"
    assert agent.may_reach("user:alice")  # '*': every sandbox of the user's, and no one else's
    assert agent.may_reach("user:alice:other") and not agent.may_reach("user:bob") and not agent.may_reach(None)


def test_a_scope_too_long_for_a_user_is_a_clear_400():
    with pytest.raises(ApiError) as caught:
        callers.user_scope("alice", "a" * 60)
    assert caught.value.status == 400 and "too long" in caught.value.message
