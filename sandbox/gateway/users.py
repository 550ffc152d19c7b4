"""Per-user tokens at the gateway: one secret, a token per user derived from it, nothing stored.

On a shared deployment (JupyterHub on Kubernetes: one single-user pod per person) one token
for every client would let each user list, attach to and delete everyone's sandboxes. The
gateway's ``user_secret`` instead signs a user's name:

    token = "sbu1." + base64url(name) + "." + hex(HMAC-SHA256(secret, "user:" + name))

so the gateway verifies a token with the secret alone (no table to keep in step across
replicas), the hub (or ``sandbox-kernel user-token``) mints one without asking the gateway,
and rotating the secret revokes every user token at once. The ``user:`` prefix keeps these
signatures apart from any other use of the same secret.

A user's requests reach only that user's sandboxes through the nodes' scope rule
(sandbox/service/scopes.py): the gateway sends, in place of whatever the client declared,
the user's own scope ``user:NAME`` (what its sandboxes are labelled with) and the family
``user:NAME:*`` (its agents' sandboxes, labelled ``user:NAME:AGENT``). Another user's sandbox
then answers as an unknown id (404) on the node itself, and the listing leaves it out.

Standard library only: ``deploy/kubernetes/jupyterhub/values.yaml`` repeats ``mint`` in the
hub's configuration (the hub's image does not have this package), and
tests/gateway/test_gateway_users.py checks that the gateway accepts what it makes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re

PREFIX = "sbu1."
LABEL_PREFIX = "user:"
# A name as it goes into a scope label: these characters as they are, every other byte as
# _XX (so '_' itself too): one spelling per name, and only characters a scope name may hold.
_KEPT = re.compile(r"[A-Za-z0-9.-]")
# Room left in a 64-character scope label for an agent's own scope name after the user's.
NAME_LABEL_MAX = 40


class UserTokenError(ValueError):
    """A name that cannot have a token (empty, or too long for a scope label)."""


def signature(secret: str, name: str) -> str:
    return hmac.new(secret.encode(), f"user:{name}".encode(), hashlib.sha256).hexdigest()


def mint(secret: str, name: str) -> str:
    """The token of user ``name`` under ``secret``."""
    if not secret:
        raise UserTokenError("no user secret: set SANDBOX_KERNEL_USER_SECRET (the gateway's user_secret)")
    if not name:
        raise UserTokenError("a user name cannot be empty")
    if len(label_part(name)) > NAME_LABEL_MAX:
        raise UserTokenError(f"the user name {name!r} is too long: at most {NAME_LABEL_MAX} characters as a scope "
                             "label spells it (letters, digits, '.', '-' one each, any other byte three)")
    encoded = base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")
    return f"{PREFIX}{encoded}.{signature(secret, name)}"


def is_user_token(token: str) -> bool:
    return token.startswith(PREFIX)


def verify(secret: str, token: str) -> str | None:
    """The user a token was minted for under ``secret``, or None (forged, another secret's,
    malformed, or user tokens not enabled). The signature is compared in constant time."""
    if not secret or not is_user_token(token):
        return None
    encoded, dot, given = token[len(PREFIX):].partition(".")
    if not dot or not encoded:
        return None
    try:
        name = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not hmac.compare_digest(given.encode(), signature(secret, name).encode()) or not name:
        return None
    return name


def label_part(name: str) -> str:
    return "".join(c if _KEPT.match(c) else "".join(f"_{b:02x}" for b in c.encode()) for c in name)


def label(name: str) -> str:
    """The scope label of the sandboxes user ``name`` creates without declaring a scope."""
    return LABEL_PREFIX + label_part(name)


def owner_of_label(scope_label: str | None) -> str | None:
    """The user whose label (or whose agent's label) this is, else None: what the gateway's
    listing shows as each sandbox's owner."""
    if not scope_label or not scope_label.startswith(LABEL_PREFIX):
        return None
    part = scope_label[len(LABEL_PREFIX):].partition(":")[0]
    try:
        raw = re.sub(rb"_([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]), part.encode())
        return raw.decode()
    except UnicodeDecodeError:
        return None
