"""A sandbox's egress policy: which host names (and ports) it may reach, and its budgets.

The policy is checked twice, by name before anything is resolved (so a denied name never
reaches a resolver: no DNS tunnelling through the proxy) and by address after the proxy has
resolved it (so an allowed name that points into the host's network is still refused).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from ..common.errors import ApiError

DEFAULT_PORTS = frozenset({80, 443})
MAX_ALLOW_ENTRIES = 256
DEFAULT_MAX_REQUESTS = 10_000
DEFAULT_MAX_BYTES = 1 << 30
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_HOST = re.compile(rf"(\*\.)?{_LABEL}(\.{_LABEL})*")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Refused(Exception):
    """A request the policy refuses; the message is what the sandbox is told."""


@dataclass(frozen=True)
class HostRule:
    pattern: str  # "example.org" or "*.example.org" (any subdomain, not the apex)
    ports: frozenset[int]
    # The operator's own package index (the server's pip reaches it): wherever it resolves,
    # a private mirror or a routed address, it is reachable; a sandbox cannot add such a rule.
    any_address: bool = False

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        if self.pattern.startswith("*."):
            return host.endswith(self.pattern[1:])
        return host == self.pattern


@dataclass(frozen=True)
class EgressPolicy:
    hosts: tuple[HostRule, ...]
    networks: tuple[tuple[Network, frozenset[int]], ...] = ()
    max_requests: int = DEFAULT_MAX_REQUESTS
    max_bytes: int = DEFAULT_MAX_BYTES
    secrets: tuple[str, ...] = ()
    pip: bool = False
    source: dict = field(default_factory=dict, compare=False)  # as asked, for %sandbox and GET

    def check_name(self, host: str, port: int) -> None:
        """Before resolution: the name (or literal address) must be listed, with its port."""
        literal = parse_address(host)
        if literal is not None:
            if not self._network_allows(literal, port):
                raise Refused(f"{host} is an IP address; only host names on the allow list are reachable")
            return
        if not any(rule.matches(host, port) for rule in self.hosts):
            if any(rule.matches(host, p) for rule in self.hosts for p in rule.ports):
                raise Refused(f"port {port} of {host} is not allowed (allowed: "
                              f"{', '.join(str(p) for p in sorted(self._ports_of(host)))})")
            raise Refused(f"{host} is not on this sandbox's egress allow list")

    def check_address(self, host: str, address: Address, port: int) -> None:
        """After resolution: a private, loopback, link-local or otherwise special address is
        refused unless the policy lists it (a network entry)."""
        if is_public(address) or self._network_allows(address, port):
            return
        if any(rule.any_address and rule.matches(host, port) for rule in self.hosts):
            return
        raise Refused(f"{host} resolves to {address}, a non-public address this sandbox may not reach")

    def _network_allows(self, address: Address, port: int) -> bool:
        return any(address in net and port in ports for net, ports in self.networks)

    def _ports_of(self, host: str) -> set[int]:
        return {p for rule in self.hosts for p in rule.ports if rule.matches(host, p)}

    def describe(self) -> dict:
        return dict(self.source)


def parse_address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def normalize_host(host: str) -> str:
    """Lowercase, IDNA-encoded, no trailing dot: the one spelling rules and requests share."""
    host = host.strip().rstrip(".").lower()
    try:
        return host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise ValueError(f"{host!r} is not a valid host name") from None


def host_pattern(text: str) -> str | None:
    """A host name or '*.domain' in its one spelling, or None if it is neither."""
    try:
        host = normalize_host(text)
    except ValueError:
        return None
    return host if _HOST.fullmatch(host) else None


def _bad(message: str) -> ApiError:
    return ApiError(422, "invalid_request", f"egress: {message}")


def _entry(entry) -> tuple[str, frozenset[int]]:
    if not isinstance(entry, str) or not entry or len(entry) > 300:
        raise _bad(f"every allow entry must be a host name, 'host:port' or an address, got {entry!r}")
    host, ports = entry, DEFAULT_PORTS
    if entry.startswith("["):  # [v6]:port or [v6]
        close = entry.find("]")
        host, rest = entry[1:close], entry[close + 1:]
        if rest:
            ports = _ports(rest.removeprefix(":"), entry)
    elif entry.count(":") == 1:
        host, port_text = entry.split(":")
        ports = _ports(port_text, entry)
    return host, ports


def _ports(text: str, entry: str) -> frozenset[int]:
    try:
        ports = frozenset(int(p) for p in text.split(","))
    except ValueError:
        raise _bad(f"bad port in {entry!r}") from None
    if not ports or any(not 0 < p < 65536 for p in ports):
        raise _bad(f"bad port in {entry!r}")
    return ports


def parse_policy(value, *, pip_hosts: tuple[str, ...] = ()) -> EgressPolicy:
    """The create body's ``egress`` object, checked field by field (422 names what is wrong).

    ``{"allow": ["api.example.org", "*.example.org", "example.net:8443", "10.1.2.0/24"],
       "secrets": ["OPENAI_API_KEY"], "pip": true, "max_requests": 1000, "max_bytes": 100000000}``
    """
    if not isinstance(value, dict):
        raise _bad("must be an object")
    unknown = sorted(set(value) - {"allow", "secrets", "pip", "max_requests", "max_bytes"})
    if unknown:
        raise _bad(f"unknown field(s): {', '.join(map(repr, unknown))}")
    allow = value.get("allow", [])
    if not isinstance(allow, list) or len(allow) > MAX_ALLOW_ENTRIES:
        raise _bad(f"'allow' must be a list of at most {MAX_ALLOW_ENTRIES} entries")
    hosts, networks = [], []
    for entry in allow:
        host, ports = _entry(entry)
        try:
            networks.append((ipaddress.ip_network(host, strict=False), ports))
            continue
        except ValueError:
            pass
        pattern = host_pattern(host)
        if pattern is None:
            raise _bad(f"{entry!r} is not a host name, '*.domain', 'host:port' or an address")
        hosts.append(HostRule(pattern, ports))
    pip = value.get("pip", False)
    if not isinstance(pip, bool):
        raise _bad("'pip' must be true or false")
    if pip:
        hosts += [HostRule(h, frozenset({443}), any_address=True) for h in pip_hosts]
    secrets = value.get("secrets", [])
    if not isinstance(secrets, list) or not all(isinstance(s, str) for s in secrets) or len(secrets) > 64:
        raise _bad("'secrets' must be a list of secret names")
    limits = {}
    for name, default in (("max_requests", DEFAULT_MAX_REQUESTS), ("max_bytes", DEFAULT_MAX_BYTES)):
        number = value.get(name, default)
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise _bad(f"{name!r} must be a positive integer")
        limits[name] = number
    source = {"allow": list(allow), "secrets": list(secrets), "pip": pip, **limits}
    if pip:
        source["pip_hosts"] = list(pip_hosts)
    return EgressPolicy(tuple(hosts), tuple(networks), secrets=tuple(secrets), pip=pip, source=source, **limits)
