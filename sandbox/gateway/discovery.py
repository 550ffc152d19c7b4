"""Where the nodes are: a static list of URLs, or the A/AAAA records of a DNS name; and the
one address each candidate node is reached at.

Discovery yields *targets*, never bare URLs: a target is a URL together with the single IP
address the gateway connects to for it. A URL whose host is a name is resolved here, once
per refresh, and each of its addresses is a candidate node of its own, which proves itself
at that address and is then reached only there (``nodes.pinned_client``, ``pool.NodeUpstream``).
Resolving again at every connection, as a plain HTTP client does, would let a proof made
at one address be followed by the node token sent to another address of the same name.

In Kubernetes the name is a headless Service over the node DaemonSet: its records are the
ready node pods' addresses, so nodes that start or stop show up at the next refresh. A
lookup that fails (resolver down, timeout) keeps the last answer rather than dropping every
node; a name that does not exist or has no records means there are no nodes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import urllib.parse
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.resolver

from ..service.nodeproof import address_text

log = logging.getLogger("sandbox.gateway.discovery")


def split_host_port(text: str) -> tuple[str, int | None]:
    """``IP``, ``IP:PORT``, ``[IPv6]:PORT`` or a bare IPv6 address."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    ipaddress.ip_address(host)  # ValueError for anything else
    return host, int(port) if port else None


@dataclass(frozen=True)
class Target:
    """One candidate node: the URL it is known by (the Host header and TLS name of every
    request to it) and the one IP address every connection for it goes to."""

    url: str
    ip: str
    port: int

    @property
    def peer(self) -> str:
        """The address a proof must name (``IP:PORT``, ``[v6]:PORT``)."""
        return address_text(self.ip, self.port)

    @property
    def label(self) -> str:
        """How the gateway names it (its key, its logs, ``GET /v1/nodes``): the URL alone
        when its host is the address, else the URL and the address."""
        host = urllib.parse.urlsplit(self.url).hostname or ""
        return self.url if _is_ip(host) else f"{self.url} at {self.peer}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def url_host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


class LookupFailed(Exception):
    """The resolver did not answer: not the same as a name without addresses."""


class DnsLookup:
    """A name's A and AAAA records from a DNS server (``--dns-server``, else the system's)."""

    def __init__(self, server: str = "", timeout: float = 2.0):
        self.timeout = timeout
        self.resolver = dns.asyncresolver.Resolver(configure=not server)
        if server:
            host, server_port = split_host_port(server)
            self.resolver.nameservers = [host]
            if server_port:
                self.resolver.port = server_port

    async def addresses(self, name: str) -> list[str]:
        found: list[str] = []
        failed = False
        for rdtype in ("A", "AAAA"):
            try:
                answer = await self.resolver.resolve(name, rdtype, lifetime=self.timeout, search=True)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except (dns.exception.DNSException, OSError) as exc:
                log.warning("looking up %s %s failed: %s", name, rdtype, exc)
                failed = True
                continue
            found += [r.address for r in answer]
        if failed and not found:
            raise LookupFailed(name)
        return sorted(set(found))


class SystemLookup:
    """A name's addresses as the system resolves it (``getaddrinfo``: /etc/hosts, then DNS)."""

    def __init__(self, timeout: float = 2.0):
        self.timeout = timeout

    async def addresses(self, name: str) -> list[str]:
        try:
            infos = await asyncio.wait_for(
                asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM), self.timeout)
        except socket.gaierror as exc:
            if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
                return []
            log.warning("looking up %s failed: %s", name, exc)
            raise LookupFailed(name) from None
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("looking up %s failed: %s", name, exc)
            raise LookupFailed(name) from None
        return sorted({info[4][0] for info in infos})


class StaticNodes:
    """The ``--node`` URLs; a host name in one is one target per address it resolves to."""

    def __init__(self, urls: list[str], lookup: DnsLookup | SystemLookup | None = None):
        self.urls = [u.rstrip("/") for u in urls]
        self.lookup = lookup or SystemLookup()
        self.last: dict[str, list[Target]] = {}

    async def addresses(self) -> list[Target]:
        targets: list[Target] = []
        for url in self.urls:
            host, port = url_host_port(url)
            if _is_ip(host):
                targets.append(Target(url, host, port))
                continue
            try:
                self.last[url] = [Target(url, ip, port) for ip in await self.lookup.addresses(host)]
            except LookupFailed:
                pass  # a resolver outage is not the node leaving: its last addresses stand
            targets += self.last.get(url, [])
        return targets

    def describe(self) -> str:
        return f"static list of {len(self.urls)}"


class DnsNodes:
    """The A and AAAA records of ``name``, as ``http://ADDRESS:port`` targets."""

    def __init__(self, name: str, port: int, server: str = "", timeout: float = 2.0):
        self.name = name
        self.port = port
        self.lookup = DnsLookup(server, timeout)
        self.last: list[Target] = []

    async def addresses(self) -> list[Target]:
        try:
            found = await self.lookup.addresses(self.name)
        except LookupFailed:
            return list(self.last)  # a resolver outage is not every node leaving
        self.last = [Target(self._url(ip), ip, self.port) for ip in found]
        return list(self.last)

    def _url(self, address: str) -> str:
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
        return f"http://{host}:{self.port}"

    def describe(self) -> str:
        return f"DNS name {self.name} (port {self.port})"
