"""The egress proxy on its own: real HTTP(S) servers on loopback, the real forwarder, a real
HTTP client (httpx) going through both, and the proxy's resolver mapping the test names to
the loopback servers (the one stand-in: no DNS server is reachable here)."""

from __future__ import annotations

import socket

import httpx

from .proxyharness import allow_api, api, egress  # noqa: F401 (fixtures)

SECRET_VALUE = "sk-live-0123456789abcdef-the-real-key"


def refusal(response: httpx.Response | Exception) -> str:
    return str(response)


def test_allowed_host_over_https_and_http(egress, api):
    port, _ = egress.session(allow_api(api))
    with egress.client(port) as client:
        assert client.get(f"https://api.test:{api.https_port}/hello").json() == {"ok": True, "path": "/hello"}
        assert client.post(f"http://api.test:{api.http_port}/plain", content=b"x" * 1000).status_code == 200
    assert api.seen[-1]["body"] == "x" * 1000
    tunnel, plain = sorted(egress.records(2), key=lambda r: r["method"])
    assert tunnel["decision"] == plain["decision"] == "allowed"
    assert all(r["sandbox"] == "sbx1" and r["host"] == "api.test" for r in (tunnel, plain))
    assert tunnel["method"] == "CONNECT" and tunnel["bytes_down"] > 0 and plain["bytes_up"] == 1000


def _refused(egress, port, url) -> str:
    with egress.client(port) as client:
        try:
            response = client.get(url)
        except httpx.ProxyError as exc:  # a refused CONNECT
            return str(exc)
        assert response.status_code in (400, 403, 429), response.status_code
        return response.text


def test_without_a_listed_name_nothing_is_reached_nor_resolved(egress, api):
    port, _ = egress.session(allow_api(api))
    message = _refused(egress, port, f"https://leak-0123abcd.exfil.test:{api.https_port}/")
    assert "not on this sandbox's egress allow list" in message
    assert "leak-0123abcd.exfil.test" not in egress.resolver.asked  # no DNS tunnelling through the proxy
    message = _refused(egress, port, f"http://leak-4567.exfil.test:{api.http_port}/")
    assert "not on this sandbox's egress allow list" in message
    assert not api.seen


def test_ip_literal_and_non_public_addresses_are_refused(egress, api):
    port, _ = egress.session({"allow": [f"api.test:{api.https_port}", f"self.test:{egress.server_port}",
                                        "intranet.test", "metadata.test"]})
    assert "IP address" in _refused(egress, port, f"https://127.0.0.1:{api.https_port}/")
    assert "non-public address" in _refused(egress, port, f"https://api.test:{api.https_port}/")  # loopback unlisted
    assert "non-public address" in _refused(egress, port, "https://intranet.test/")
    assert "non-public address" in _refused(egress, port, "http://metadata.test/latest/meta-data/")
    assert not api.seen


def test_the_servers_own_address_is_refused_even_when_listed(egress, api):
    port, _ = egress.session({"allow": [f"self.test:{egress.server_port}", f"127.0.0.0/8:{egress.server_port}"]})
    assert "sandbox server itself" in _refused(egress, port, f"http://self.test:{egress.server_port}/v1/sandboxes")
    assert "sandbox server itself" in _refused(egress, port, f"http://127.0.0.1:{egress.server_port}/v1/sandboxes")


def test_connect_to_a_port_not_listed_is_refused(egress, api):
    port, _ = egress.session({"allow": ["api.test", "127.0.0.1/32"]})  # 80 and 443 only
    assert "port" in _refused(egress, port, f"https://api.test:{api.https_port}/")
    assert not api.seen


def test_placeholder_replaced_only_for_the_bound_host(egress, api):
    egress.store.put("API_KEY", SECRET_VALUE, ["api.test"])
    port, placeholders = egress.session(allow_api(api, secrets=["API_KEY"]))
    placeholder = placeholders["API_KEY"]
    assert SECRET_VALUE not in placeholder
    with egress.client(port) as client:
        for host in ("api.test", "other.test"):
            assert client.get(f"https://{host}:{api.https_port}/v1/models",
                              headers={"authorization": f"Bearer {placeholder}", "x-body-too": placeholder}).status_code == 200
        client.post(f"http://other.test:{api.http_port}/plain", headers={"authorization": f"Bearer {placeholder}"},
                    content=placeholder.encode())
    bound, tunnelled, plain = api.seen
    assert bound["headers"]["authorization"] == f"Bearer {SECRET_VALUE}"
    assert bound["headers"]["x-body-too"] == SECRET_VALUE
    assert tunnelled["headers"]["authorization"] == f"Bearer {placeholder}"
    assert plain["headers"]["authorization"] == f"Bearer {placeholder}" and plain["body"] == placeholder
    # Found by what they were, not by their order: the two servers' ports are random.
    logged = {(r["host"], r["method"] == "CONNECT"): r for r in egress.records(3)}
    assert logged[("api.test", True)]["secrets_replaced"] == ["API_KEY"]
    assert logged[("other.test", False)]["placeholders_unbound"] == ["API_KEY"]
    assert SECRET_VALUE not in egress.log_path.read_text()
    assert SECRET_VALUE not in repr(egress.store.list()) + repr(egress.store.get("API_KEY"))


def test_secret_replaced_in_headers_only_never_in_the_body(egress, api):
    egress.store.put("API_KEY", SECRET_VALUE, ["api.test"])
    port, placeholders = egress.session(allow_api(api, secrets=["API_KEY"]))
    with egress.client(port) as client:
        client.post(f"https://api.test:{api.https_port}/echo", content=placeholders["API_KEY"].encode())
    assert api.seen[-1]["body"] == placeholders["API_KEY"]


def test_host_header_mismatch_is_refused(egress, api):
    egress.store.put("API_KEY", SECRET_VALUE, ["api.test"])
    port, placeholders = egress.session(allow_api(api, secrets=["API_KEY"]))
    assert "does not match" in _refused_with_host(egress, port, f"http://other.test:{api.http_port}/", "api.test")
    assert "does not match" in _refused_with_host(egress, port, f"https://api.test:{api.https_port}/", "other.test")
    assert not api.seen


def _refused_with_host(egress, port, url, host) -> str:
    with egress.client(port) as client:
        response = client.get(url, headers={"host": host})
    assert response.status_code == 403
    return response.text


def test_websocket_and_h2c_upgrades_are_refused(egress, api):
    egress.store.put("API_KEY", SECRET_VALUE, ["api.test"])
    port, _ = egress.session(allow_api(api, secrets=["API_KEY"]))
    with egress.client(port) as client:
        for url in (f"http://api.test:{api.http_port}/ws", f"https://api.test:{api.https_port}/ws"):
            for upgrade in ({"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-key": "x",
                             "sec-websocket-version": "13"}, {"upgrade": "h2c", "connection": "Upgrade, HTTP2-Settings"}):
                response = client.get(url, headers=upgrade)
                assert response.status_code == 403 and "upgrades" in response.text
    assert not api.seen


def test_http2_prior_knowledge_and_garbage_are_refused(egress, api):
    port, _ = egress.session(allow_api(api))
    for raw in (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x02\x00garbage\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(raw)
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 400"), answer
    assert not api.seen


def test_budgets(egress, api):
    port, _ = egress.session(allow_api(api, max_requests=2))
    with egress.client(port) as client:
        for _ in range(2):
            assert client.get(f"http://api.test:{api.http_port}/").status_code == 200
        response = client.get(f"http://api.test:{api.http_port}/")
    assert response.status_code == 429 and "request budget" in response.text
    port, _ = egress.session(allow_api(api, max_bytes=4000))
    with egress.client(port) as client:
        response = client.post(f"http://api.test:{api.http_port}/big", content=b"y" * 100_000)
    assert response.status_code == 429 and "byte budget" in response.text
    assert egress.proxy.sessions["sbx2"].bytes > 4000
    assert not any(len(s["body"]) == 100_000 for s in api.seen)
