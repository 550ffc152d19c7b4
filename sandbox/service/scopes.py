"""Scopes: which sandboxes a caller that declares one may reach (agents' own sandboxes).

An agent's tools (the MCP server, the ADK executor) hold the same token as the user's
notebook, so the token alone cannot keep an agent away from the notebook's sandbox. A
caller declares a scope in the ``Sandbox-Scope`` request header: ``own[, other...]``.
A sandbox it creates or forks is labelled with ``own`` (kept with its owner, see
tenancy.py); every per-sandbox route answers a sandbox labelled otherwise exactly as an
unknown id (404), and listings leave it out. ``other`` names further scopes it may reach,
``*`` any sandbox at all: an explicit choice of whoever starts the agent's server, and
``NAME:*`` the family of NAME (any label that starts with ``NAME:``: the gateway gives a user
``user:NAME:*``, their agents' sandboxes, sandbox/gateway/users.py). A caller
without the header is not scoped (the user's kernel, the CLI) and reaches what its
identity allows, as before. The rule is the server's: a tool that forgets to check, or a
model that passes another sandbox's id, still gets 404.
"""

from __future__ import annotations

import re
import typing as t
from dataclasses import dataclass

from ..common.errors import ApiError

HEADER = "sandbox-scope"
ANY = "*"
FAMILY = ":*"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")


@dataclass(frozen=True)
class Scope:
    own: str | None  # None: the caller declared no scope
    reach: frozenset[str] = frozenset()

    def may_reach(self, label: str | None) -> bool:
        if self.own is None or label == self.own or ANY in self.reach:
            return True
        return label is not None and (label in self.reach or any(
            r.endswith(FAMILY) and label.startswith(r[:-1]) for r in self.reach))

    def header(self) -> str:
        return ", ".join([t.cast(str, self.own), *sorted(self.reach)])


def parse(value: str | None) -> Scope:
    """The scope a header value declares; 400 if it is malformed."""
    if value is None or not value.strip():
        return Scope(None)
    names = [n.strip() for n in value.split(",")]
    own, others = names[0], names[1:]
    bad = [n for n in [own] if not NAME.match(n)] + [n for n in others if n != ANY and not NAME.match(_family_of(n))]
    if bad:
        raise ApiError(400, "invalid_request", f"Sandbox-Scope {bad[0]!r} is not a scope name: 1-64 letters, digits, "
                                               "'_', '.', ':' or '-' (others may also be '*': any sandbox, or "
                                               "'NAME:*': NAME's family)")
    return Scope(own, frozenset(others))


def _family_of(name: str) -> str:
    """NAME for a family ``NAME:*``; the name itself otherwise."""
    return name[:-len(FAMILY)] if name.endswith(FAMILY) else name


def of_request(request: t.Any) -> Scope:
    return parse(request.headers.get(HEADER))
