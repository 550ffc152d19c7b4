"""Secrets held by the server and bound to hosts; a sandbox only ever holds placeholders.

A secret's value lives in this process's memory and nowhere else: the API never returns it,
it is never written to disk or into a sandbox, and nothing logs it. A sandbox that asks for a
secret gets an environment variable holding a random placeholder, unique to that sandbox;
the egress proxy swaps the placeholder for the value in the headers of requests to the
secret's bound hosts, and only there.

Each owner's secrets are capped (``SecretLimits``: how many, how large, how many hosts each),
so that one user of a shared server cannot fill its memory: past a cap, 422 (too large, too
many hosts) or 409 (too many secrets), code ``limit_exceeded``, with the caps in the body.
"""

from __future__ import annotations

import re
import secrets as _random
from dataclasses import dataclass

from ..common.errors import ApiError
from .policy import HostRule, host_pattern

SECRET_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
PLACEHOLDER_PREFIX = "sbx-placeholder-"
MAX_SECRET_BYTES = 16 * 1024


@dataclass(frozen=True)
class SecretLimits:
    per_owner: int = 64
    value_bytes: int = MAX_SECRET_BYTES
    hosts_per_secret: int = 16

    def describe(self) -> dict:
        return {"max_secrets": self.per_owner, "max_value_bytes": self.value_bytes,
                "max_hosts_per_secret": self.hosts_per_secret}


@dataclass(frozen=True)
class Secret:
    name: str
    value: str
    hosts: tuple[HostRule, ...]

    def bound_to(self, host: str) -> bool:
        return any(rule.matches(host, port) for rule in self.hosts for port in rule.ports)

    def describe(self) -> dict:
        """What the API shows: never the value."""
        return {"name": self.name, "hosts": [rule.pattern for rule in self.hosts]}

    def __repr__(self) -> str:  # a stray log line or traceback must not print the value
        return f"Secret({self.name!r}, hosts={[r.pattern for r in self.hosts]})"


class SecretStore:
    """Secrets by (owner, name): on a shared server each user registers and uses their own."""

    def __init__(self, limits: SecretLimits | None = None) -> None:
        self._secrets: dict[tuple[int | None, str], Secret] = {}
        self.limits = limits or SecretLimits()

    def _refuse(self, status: int, code: str, message: str) -> ApiError:
        return ApiError(status, code, message, {"limits": self.limits.describe()})

    def put(self, name: str, value, hosts, owner: int | None = None) -> Secret:
        limits = self.limits
        if not re.fullmatch(SECRET_NAME, name or ""):
            raise ApiError(422, "invalid_request", f"a secret's name must match {SECRET_NAME}")
        if not isinstance(value, str) or not value:
            raise ApiError(422, "invalid_request", "'value' must be a non-empty string")
        if len(value.encode()) > limits.value_bytes:
            raise self._refuse(422, "limit_exceeded", f"'value' is {len(value.encode())} bytes; at most "
                               f"{limits.value_bytes} bytes")
        if any(c in value for c in "\r\n\0"):
            raise ApiError(422, "invalid_request", "'value' must not hold CR, LF or NUL (it goes into a header)")
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
            raise ApiError(422, "invalid_request", "'hosts' must be a non-empty list of host names")
        if len(hosts) > limits.hosts_per_secret:
            raise self._refuse(422, "limit_exceeded", f"'hosts': at most {limits.hosts_per_secret} hosts per secret, "
                               f"got {len(hosts)}")
        if (owner, name) not in self._secrets and self.count(owner) >= limits.per_owner:
            raise self._refuse(409, "limit_exceeded", f"you have {self.count(owner)} secrets registered, the cap per "
                               "user; delete one (DELETE /v1/secrets/NAME) or replace one by its name")
        patterns = [host_pattern(h) for h in hosts]
        if None in patterns:
            raise ApiError(422, "invalid_request", f"'hosts': {hosts[patterns.index(None)]!r} is not a host name or '*.domain'")
        rules = tuple(HostRule(p, frozenset({80, 443})) for p in patterns)
        secret = Secret(name, value, rules)
        self._secrets[(owner, name)] = secret
        return secret

    def count(self, owner: int | None) -> int:
        return sum(1 for o, _ in self._secrets if o == owner)

    def get(self, name: str, owner: int | None = None) -> Secret:
        try:
            return self._secrets[(owner, name)]
        except KeyError:
            raise ApiError(404, "not_found", f"no secret named {name!r} is registered on this server") from None

    def find(self, name: str, owner: int | None = None) -> Secret | None:
        return self._secrets.get((owner, name))

    def delete(self, name: str, owner: int | None = None) -> None:
        self.get(name, owner)
        del self._secrets[(owner, name)]

    def list(self, owner: int | None = None) -> list[dict]:
        return [s.describe() for (o, _), s in sorted(self._secrets.items(), key=lambda kv: kv[0][1]) if o == owner]

    def placeholders_for(self, names, owner: int | None = None) -> dict[str, str]:
        """name -> a fresh random placeholder, for one sandbox (404 for an unknown name)."""
        return {name: PLACEHOLDER_PREFIX + _random.token_hex(16) for name in names if self.get(name, owner)}


def replace_in_headers(headers: list[tuple[bytes, bytes]], placeholders: dict[str, str], find,
                       host: str) -> tuple[list[tuple[bytes, bytes]], list[str], list[str]]:
    """``find``: a secret by name (the sandbox owner's). Headers with each bound placeholder replaced by its value, the names replaced, and the
    names whose placeholder was sent to a host it is not bound to (left as they were)."""
    replaced, unbound = set(), set()
    out = []
    for key, value in headers:
        for name, placeholder in placeholders.items():
            token = placeholder.encode()
            if token not in value:
                continue
            secret = find(name)
            if secret is not None and secret.bound_to(host):
                value = value.replace(token, secret.value.encode())
                replaced.add(name)
            else:
                unbound.add(name)
        out.append((key, value))
    return out, sorted(replaced), sorted(unbound)
