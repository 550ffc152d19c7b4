"""The egress proxy: one per server, one unix socket per sandbox that has a policy.

HTTP is parsed by h11 (the HTTP/1.1 protocol library httpcore is built on) and TLS is the
standard library's; this module only decides. What it accepts from a sandbox:

* ``CONNECT host:port``: the name and port are checked against the policy before anything is
  resolved, the proxy resolves the name itself, every address is checked (no private,
  loopback, link-local... unless the policy lists it, never the sandbox server's own), and
  the tunnel goes to that checked address. For a host a secret of the sandbox is bound to,
  the proxy terminates TLS with the server's CA, replaces placeholders in the request's
  headers and opens its own verified TLS connection to the host.
* a plain ``GET http://host/...`` (absolute form), checked the same way, its Host header
  matching the target.

Why not mitmproxy or proxy.py, both made for intercepting proxies: mitmproxy 11.0.2, the last
release for Python 3.11 (12.x needs 3.12), pins h11<=0.14 and tornado<=6.4.2, which breaks
httpcore (h11>=0.16) and Jupyter here; proxy.py runs its plugins in acceptor processes of its
own, so the per-sandbox policies, budgets and secrets would have to leave this process (or be
written to disk) to reach them. Deciding per request is a small job; parsing HTTP and TLS is
not, and stays with h11 and ssl.

Anything else (an origin-form request, an ``Upgrade`` to WebSocket or h2c, HTTP/2's preface,
a Host header naming another host) is refused with a 4xx whose reason says why. One request
per connection: every answer says ``Connection: close``. Each request is logged as a JSON line
(sandbox id, host, port, decision, bytes) and counted against the sandbox's budgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import socket
import ssl
import time
import typing as t
import urllib.parse
from dataclasses import dataclass, field

import h11

from .connections import ActivityReader, ConnectionRefused, ConnectionTable, Tracked
from .policy import Address, EgressPolicy, Refused, normalize_host, parse_address
from .scrub import Scrubber, UncheckableEncoding
from .secrets import SecretStore, replace_in_headers

if t.TYPE_CHECKING:
    from .ca import CertificateAuthority

log = logging.getLogger("sandbox.egress")

CHUNK = 64 * 1024
CONNECT_TIMEOUT = 15.0
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authorization", b"proxy-authenticate", b"proxy-connection",
              b"te", b"trailer", b"upgrade"}


class BudgetExceeded(Refused):
    pass


@dataclass
class EgressSession:
    """One sandbox's side of the proxy: its policy, placeholders and what it has used."""
    sandbox_id: str
    policy: EgressPolicy
    placeholders: dict[str, str]  # secret name -> this sandbox's placeholder
    socket_path: str
    owner: int | None = None  # whose secrets the placeholders stand for
    requests: int = 0
    bytes: int = 0
    bytes_out: int = 0  # sent by the sandbox (requests, the client's side of a tunnel)
    bytes_in: int = 0  # received by the sandbox
    refused: int = 0
    server: asyncio.AbstractServer | None = field(default=None, repr=False)

    def take_request(self) -> None:
        if self.requests >= self.policy.max_requests:
            raise BudgetExceeded(f"this sandbox's egress request budget ({self.policy.max_requests}) is used up")
        self.requests += 1

    def take_bytes(self, count: int, key: str) -> None:
        """Count ``count`` bytes against the budget; ``key`` "bytes_up" (out of the sandbox)
        or "bytes_down" (into it), as the request's log line names them."""
        self.bytes += count
        if key == "bytes_up":
            self.bytes_out += count
        else:
            self.bytes_in += count
        if self.bytes > self.policy.max_bytes:
            raise BudgetExceeded(f"this sandbox's egress byte budget ({self.policy.max_bytes}) is used up")

    def usage(self) -> dict:
        return {"requests": self.requests, "bytes": self.bytes, "bytes_out": self.bytes_out,
                "bytes_in": self.bytes_in, "refused": self.refused}


class Resolver:
    """Name resolution done by the proxy (never by the sandbox). ``overrides`` maps names to
    addresses before the system resolver is asked: a test's stand-in for DNS."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.overrides = {normalize_host(k): v for k, v in (overrides or {}).items()}
        self.asked: list[str] = []  # every name looked up, in order (tests check what never was)

    async def resolve(self, host: str, port: int) -> list[Address]:
        self.asked.append(host)
        if host in self.overrides:
            return [ipaddress.ip_address(self.overrides[host])]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Refused(f"{host} does not resolve: {exc.strerror or exc}") from None
        return list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos))


class EgressProxy:
    def __init__(self, secrets: SecretStore, ca: CertificateAuthority, log_path: str, *,
                 resolver: Resolver | None = None, upstream_ssl: ssl.SSLContext | None = None,
                 own_addresses: set[tuple[str, int]] | None = None, connections: ConnectionTable | None = None,
                 plain_http_secret_hosts: frozenset[str] = frozenset()) -> None:
        self.secrets = secrets
        self.ca = ca
        self.log_path = log_path
        self.resolver = resolver or Resolver()
        self.upstream_ssl = upstream_ssl or ssl.create_default_context()
        self.upstream_ssl.set_alpn_protocols(["http/1.1"])
        self.own_addresses = own_addresses or set()  # the sandbox server's own (address, port)s
        self.sessions: dict[str, EgressSession] = {}
        self.closed = {"requests": 0, "refused": 0, "bytes_in": 0, "bytes_out": 0}  # of sessions closed since start
        self.connections = connections or ConnectionTable()
        # Hosts the operator lets secrets reach over plain HTTP (egress_insecure_plain_http_secret_hosts).
        self.plain_http_secret_hosts = plain_http_secret_hosts

    def totals(self) -> dict[str, int]:
        """Requests, refusals and bytes of every session since the server started (metrics)."""
        totals = dict(self.closed)
        for session in self.sessions.values():
            for key in totals:
                totals[key] += getattr(session, key)
        return totals

    async def open(self, sandbox_id: str, policy: EgressPolicy, placeholders: dict[str, str],
                   socket_path: str, *, sandbox_uid: int | None = None, owner: int | None = None) -> EgressSession:
        """Listen on ``socket_path`` for one sandbox (its directory is bound into the sandbox;
        the socket is the sandbox uid's alone)."""
        session = EgressSession(sandbox_id, policy, placeholders, socket_path, owner)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        session.server = await asyncio.start_unix_server(lambda r, w: self._serve(session, r, w), path=socket_path)
        os.chmod(socket_path, 0o600)
        if sandbox_uid is not None:
            os.chown(socket_path, sandbox_uid, -1)
        self.sessions[sandbox_id] = session
        return session

    def close(self, sandbox_id: str) -> None:
        """The sandbox ended: its socket and every connection it still has open go."""
        self.connections.close_sandbox(sandbox_id)
        session = self.sessions.pop(sandbox_id, None)
        if session is None:
            return
        for key in self.closed:
            self.closed[key] += getattr(session, key)
        if session.server is None:
            return
        session.server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(session.socket_path)

    def close_all(self) -> None:
        for sandbox_id in list(self.sessions):
            self.close(sandbox_id)
        self.connections.close_all()

    # -- one connection from a sandbox -------------------------------------------------------
    async def _serve(self, session: EgressSession, reader, writer) -> None:
        record = {"sandbox": session.sandbox_id}
        conn = h11.Connection(h11.SERVER)
        try:
            tracked = self.connections.admit(session.sandbox_id, writer)
        except ConnectionRefused as full:  # answered and closed at once: the descriptor is not kept
            session.refused += 1
            await _answer(conn, writer, full.status, full.reason)
            writer.transport.abort()
            return
        reader = ActivityReader(reader, tracked)
        try:
            request = await _next_event(conn, reader)
            tracked.head_done = True
            if not isinstance(request, h11.Request):
                raise _Answer(400, "not an HTTP/1.1 request")
            record["method"] = request.method.decode("ascii", "replace")
            session.take_request()
            if request.method == b"CONNECT":
                await self._connect(session, tracked, conn, request, reader, writer, record)
            else:
                await self._plain(session, tracked, conn, request, reader, writer, record)
        except _Answer as answer:
            record.update(decision="refused", status=answer.status, reason=answer.reason)
            session.refused += 1
            await _answer(conn, writer, answer.status, answer.reason)
        except Refused as exc:
            record.update(decision="refused", status=429 if isinstance(exc, BudgetExceeded) else 403, reason=str(exc))
            session.refused += 1
            await _answer(conn, writer, record["status"], str(exc))
        except h11.RemoteProtocolError as exc:
            record.update(decision="refused", status=400, reason=f"bad request: {exc}")
            session.refused += 1
            await _answer(conn, writer, 400, "not an HTTP/1.1 proxy request (HTTP/2 and raw bytes are refused)")
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError, asyncio.TimeoutError, h11.LocalProtocolError) as exc:
            record.setdefault("decision", "error")
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            self.connections.release(tracked)
            with contextlib.suppress(Exception):
                writer.close()
            self._log(record)

    async def _checked_address(self, session: EgressSession, host: str, port: int, record: dict) -> Address:
        record.update(host=host, port=port)
        session.policy.check_name(host, port)
        literal = parse_address(host)
        addresses = [literal] if literal is not None else await self.resolver.resolve(host, port)
        if not addresses:
            raise Refused(f"{host} does not resolve")
        for address in addresses:
            if (str(address), port) in self.own_addresses or address.is_unspecified:
                raise Refused(f"{host}:{port} is the sandbox server itself")
            session.policy.check_address(host, address, port)
        record["address"] = str(addresses[0])
        return addresses[0]

    async def _connect(self, session, tracked: Tracked, conn, request, reader, writer, record) -> None:
        host, port = _split_authority(request.target.decode("ascii", "replace"))
        address = await self._checked_address(session, host, port, record)
        bound = [n for n in session.placeholders
                 if (secret := self.secrets.find(n, session.owner)) is not None and secret.bound_to(host)]
        if bound:
            upstream = await asyncio.wait_for(asyncio.open_connection(
                str(address), port, ssl=self.upstream_ssl, server_hostname=host), CONNECT_TIMEOUT)
        else:
            upstream = await asyncio.wait_for(asyncio.open_connection(str(address), port), CONNECT_TIMEOUT)
        up_reader, up_writer = _tracked_upstream(tracked, *upstream)
        try:
            writer.write(conn.send(h11.Response(status_code=200, reason=b"Connection established", headers=[])))
            await writer.drain()
            record.update(decision="allowed", status=200)
            if bound:  # terminate TLS: read the one request, swap the placeholders in its headers
                if conn.trailing_data[0]:
                    raise _Answer(400, "data sent before the tunnel was established")
                await writer.start_tls(self.ca.server_context(host))
                inner = h11.Connection(h11.SERVER)
                try:
                    inner_request = await _next_event(inner, reader)
                    if not isinstance(inner_request, h11.Request):
                        return
                    _check_host_header(inner_request, host, port, default_port=443)
                    await self._relay_request(session, inner, inner_request, reader, writer, up_reader, up_writer,
                                              host, record, tls=True)
                except (_Answer, Refused) as refusal:  # answered inside the tunnel, where the client reads
                    status = refusal.status if isinstance(refusal, _Answer) else 429 if isinstance(refusal, BudgetExceeded) else 403
                    record.update(decision="refused", status=status, reason=str(refusal))
                    session.refused += 1
                    await _answer(inner, writer, status, str(refusal))
            else:
                early = conn.trailing_data[0]
                if early:
                    session.take_bytes(len(early), "bytes_up")
                    up_writer.write(early)
                await _splice(session, reader, writer, up_reader, up_writer, record)
        finally:
            with contextlib.suppress(Exception):
                up_writer.close()

    async def _plain(self, session, tracked: Tracked, conn, request, reader, writer, record) -> None:
        target = urllib.parse.urlsplit(request.target.decode("ascii", "replace"))
        if target.scheme != "http" or not target.hostname:
            raise _Answer(400, "only CONNECT and absolute http:// requests go through the egress proxy")
        host, port = normalize_host(target.hostname), target.port or 80
        _check_host_header(request, host, port, default_port=80)
        address = await self._checked_address(session, host, port, record)
        up_reader, up_writer = _tracked_upstream(tracked, *await asyncio.wait_for(
            asyncio.open_connection(str(address), port), CONNECT_TIMEOUT))
        try:
            origin = target.path or "/"
            if target.query:
                origin += "?" + target.query
            request = h11.Request(method=request.method, target=origin.encode(), headers=request.headers)
            record.update(decision="allowed")
            await self._relay_request(session, conn, request, reader, writer, up_reader, up_writer, host, record,
                                      tls=False)
        finally:
            with contextlib.suppress(Exception):
                up_writer.close()

    async def _relay_request(self, session, conn, request, reader, writer, up_reader, up_writer, host, record, *,
                             tls: bool) -> None:
        """One request and its response between the sandbox and the host: placeholders in the
        request's headers replaced for bound hosts, only over TLS (unless the operator named the
        host for plain HTTP), and the secrets' values scrubbed from what the host answers."""
        if any(k.lower() == b"upgrade" for k, _ in request.headers):
            raise _Answer(403, "protocol upgrades (WebSocket, h2c) are refused by the egress proxy")
        headers = [(k, v) for k, v in request.headers if k.lower() not in HOP_BY_HOP]
        headers, replaced, unbound = replace_in_headers(
            headers, session.placeholders, lambda name: self.secrets.find(name, session.owner), host)
        if replaced and not tls and host not in self.plain_http_secret_hosts:
            raise _Answer(403, f"the secret(s) {', '.join(replaced)} are sent to {host} over TLS only: use https://")
        if replaced:
            record["secrets_replaced"] = replaced
        if unbound:
            record["placeholders_unbound"] = unbound
        scrubber = self._scrubber(session, host)
        if scrubber:  # a compressed answer could hide a value from the scrubber
            headers = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"] + [(b"accept-encoding", b"identity")]
        headers.append((b"connection", b"close"))
        client = h11.Connection(h11.CLIENT)
        up_writer.write(client.send(h11.Request(method=request.method, target=request.target, headers=headers)))
        while True:  # the request's body
            event = await _next_event(conn, reader)
            if isinstance(event, h11.Data):
                session.take_bytes(len(event.data), "bytes_up")
                record["bytes_up"] = record.get("bytes_up", 0) + len(event.data)
                up_writer.write(client.send(event))
            elif isinstance(event, h11.EndOfMessage):
                up_writer.write(client.send(event))
                break
            else:
                raise _Answer(400, "the request ended early")
        await up_writer.drain()
        await _relay_response(session, client, up_reader, conn, writer, host, record, scrubber,
                              no_body=request.method == b"HEAD")

    def _scrubber(self, session: EgressSession, host: str) -> Scrubber:
        """Value -> placeholder for each of the sandbox's secrets bound to ``host`` (empty for
        other hosts: their answers cannot hold a value the proxy never sent them)."""
        replacements = {}
        for name, placeholder in session.placeholders.items():
            secret = self.secrets.find(name, session.owner)
            if secret is not None and secret.bound_to(host):
                replacements[secret.value.encode()] = placeholder.encode()
        return Scrubber(replacements)

    def _log(self, record: dict) -> None:
        record = {"time": round(time.time(), 3), **record}
        line = json.dumps(record, sort_keys=True)
        log.info("egress %s", line)
        with contextlib.suppress(OSError):
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(line + "\n")


class _Answer(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def _split_authority(authority: str) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = authority.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise _Answer(400, "CONNECT needs host:port") from None
    if not host or not 0 < port < 65536:
        raise _Answer(400, "CONNECT needs host:port")
    try:
        return normalize_host(host), port
    except ValueError as exc:
        raise _Answer(400, str(exc)) from None


def _check_host_header(request: h11.Request, host: str, port: int, default_port: int) -> None:
    """A Host header naming another host than the one checked is refused: the request would
    otherwise be routed (by a shared front end) to a host the policy never saw."""
    values = [v for k, v in request.headers if k.lower() == b"host"]
    if len(values) != 1:
        raise _Answer(400, "exactly one Host header is required")
    given = values[0].decode("ascii", "replace").lower().rstrip(".")
    expected = {host, f"{host}:{port}"} if port == default_port else {f"{host}:{port}"}
    if given.rstrip(".") not in expected and given.replace(".:", ":") not in expected:
        raise _Answer(403, f"the Host header ({given}) does not match the requested host ({host})")


async def _next_event(conn: h11.Connection, reader) -> object:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(CHUNK)
            conn.receive_data(data)
            continue
        return event


async def _answer(conn: h11.Connection, writer, status: int, reason: str) -> None:
    body = f"egress refused: {reason}\n".encode()
    with contextlib.suppress(Exception):
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            writer.write(conn.send(h11.Response(status_code=status, reason=reason.encode("ascii", "replace")[:300],
                                                headers=[(b"content-type", b"text/plain; charset=utf-8"),
                                                         (b"content-length", str(len(body)).encode()),
                                                         (b"x-sandbox-egress", b"refused"),
                                                         (b"connection", b"close")])))
            writer.write(conn.send(h11.Data(data=body)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()


async def _relay_response(session, client, up_reader, conn, writer, host, record, scrubber: Scrubber, *,
                          no_body: bool) -> None:
    response = await _next_event(client, up_reader)
    while isinstance(response, h11.InformationalResponse):
        response = await _next_event(client, up_reader)
    if not isinstance(response, h11.Response):
        raise _Answer(502, f"{host} sent no response")
    record["status"] = response.status_code
    out = [(k, v) for k, v in response.headers if k.lower() not in HOP_BY_HOP]
    if scrubber and (no_body or response.status_code in (204, 304)):
        out = [(k, scrubber.replace(v)) for k, v in out]
    elif scrubber:
        try:
            out = scrubber.headers(out)
        except UncheckableEncoding as exc:
            raise _Answer(502, str(exc)) from None
    out.append((b"connection", b"close"))
    writer.write(conn.send(h11.Response(status_code=response.status_code, reason=response.reason, headers=out)))
    while True:
        event = await _next_event(client, up_reader)
        if isinstance(event, h11.Data):
            data = scrubber.feed(event.data) if scrubber else event.data
            session.take_bytes(len(data), "bytes_down")
            record["bytes_down"] = record.get("bytes_down", 0) + len(data)
            if data:
                writer.write(conn.send(h11.Data(data=data)))
            await writer.drain()
        elif isinstance(event, h11.EndOfMessage):
            rest = scrubber.flush() if scrubber else b""
            if rest:
                writer.write(conn.send(h11.Data(data=rest)))
            writer.write(conn.send(h11.EndOfMessage()))
            break
        else:
            break
    await writer.drain()


def _tracked_upstream(tracked: Tracked, up_reader, up_writer):
    """The host's side of a connection, closed with it and counted as its activity."""
    tracked.transports.append(up_writer.transport)
    return ActivityReader(up_reader, tracked), up_writer


async def _splice(session, reader, writer, up_reader, up_writer, record) -> None:
    async def pump(src, dst, key):
        try:
            while data := await src.read(CHUNK):
                session.take_bytes(len(data), key)
                record[key] = record.get(key, 0) + len(data)
                dst.write(data)
                await dst.drain()
        except BudgetExceeded as exc:
            record["reason"] = str(exc)
        finally:
            with contextlib.suppress(Exception):
                dst.close()

    await asyncio.gather(pump(reader, up_writer, "bytes_up"), pump(up_reader, writer, "bytes_down"),
                         return_exceptions=True)
