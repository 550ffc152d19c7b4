"""Where the nodes are: a static list of URLs, or the A/AAAA records of a DNS name.

In Kubernetes the name is a headless Service over the node DaemonSet: its records are the
ready node pods' addresses, so nodes that start or stop show up at the next refresh. A
lookup that fails (resolver down, timeout) keeps the last answer rather than dropping every
node; a name that does not exist or has no records means there are no nodes.
"""

from __future__ import annotations

import ipaddress
import logging

import dns.asyncresolver
import dns.exception
import dns.resolver

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


class StaticNodes:
    def __init__(self, urls: list[str]):
        self.urls = [u.rstrip("/") for u in urls]

    async def addresses(self) -> list[str]:
        return list(self.urls)

    def describe(self) -> str:
        return f"static list of {len(self.urls)}"


class DnsNodes:
    """The A and AAAA records of ``name``, as ``http://ADDRESS:port`` URLs."""

    def __init__(self, name: str, port: int, server: str = "", timeout: float = 2.0):
        self.name = name
        self.port = port
        self.timeout = timeout
        self.resolver = dns.asyncresolver.Resolver(configure=not server)
        if server:
            host, server_port = split_host_port(server)
            self.resolver.nameservers = [host]
            if server_port:
                self.resolver.port = server_port
        self.last: list[str] = []

    async def addresses(self) -> list[str]:
        found: list[str] = []
        failed = False
        for rdtype in ("A", "AAAA"):
            try:
                answer = await self.resolver.resolve(self.name, rdtype, lifetime=self.timeout, search=True)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
            except (dns.exception.DNSException, OSError) as exc:
                log.warning("looking up %s %s failed: %s", self.name, rdtype, exc)
                failed = True
                continue
            found += [self._url(r.address) for r in answer]
        if failed and not found:
            return list(self.last)  # a resolver outage is not every node leaving
        self.last = sorted(set(found))
        return list(self.last)

    def _url(self, address: str) -> str:
        host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
        return f"http://{host}:{self.port}"

    def describe(self) -> str:
        return f"DNS name {self.name} (port {self.port})"
