"""A DNS server the test controls (dnslib, UDP): A and AAAA records for the names it is
given, NXDOMAIN for any other. The gateway's tests point ``--dns-server`` at it, for DNS
discovery and for the host names in ``--node`` URLs."""

from __future__ import annotations

import ipaddress

import support


class Zone:
    def __init__(self, address: str = "127.0.0.1"):
        from dnslib import AAAA, QTYPE, RR, A
        from dnslib.server import BaseResolver, DNSServer

        self.records: dict[str, list[str]] = {}  # name -> its addresses, IPv4 and IPv6 alike
        zone = self

        class Resolver(BaseResolver):
            def resolve(self, request, handler):
                reply = request.reply()
                name = str(request.q.qname).rstrip(".")
                if name not in zone.records:
                    reply.header.rcode = 3  # NXDOMAIN
                    return reply
                for ip in list(zone.records[name]):
                    version = ipaddress.ip_address(ip).version
                    if (request.q.qtype, version) == (QTYPE.A, 4):
                        reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ip), ttl=1))
                    elif (request.q.qtype, version) == (QTYPE.AAAA, 6):
                        reply.add_answer(RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(ip), ttl=1))
                return reply

        self.address = address
        self.port = support.free_port()
        self.server = DNSServer(Resolver(), port=self.port, address=address)
        self.server.start_thread()

    @property
    def server_arg(self) -> str:
        """What ``--dns-server`` takes."""
        return f"{self.address}:{self.port}"

    def close(self) -> None:
        self.server.stop()
