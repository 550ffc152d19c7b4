"""The egress proxy under test, on its own: its event loop in a thread, sessions served by the
real forwarder, httpx clients through it (shared by the proxy's test modules)."""

from __future__ import annotations

import asyncio
import json
import pathlib
import ssl
import threading

import httpx
import pytest

from sandbox.egress.ca import CertificateAuthority
from sandbox.egress.policy import parse_policy
from sandbox.egress.proxy import EgressProxy, Resolver
from sandbox.egress.secrets import SecretStore
from sandbox.runtime import egress_forwarder

import support

from .apihost import ApiHost


class ProxyUnderTest:
    def __init__(self, tmp: pathlib.Path, api: ApiHost, **options) -> None:
        """``options``: the EgressProxy's own (connections, plain_http_secret_hosts)."""
        self.tmp, self.api = tmp, api
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.store = SecretStore()
        self.ca = CertificateAuthority(str(tmp / "ca"))
        self.log_path = tmp / "egress.log"
        self.server_port = 48_000  # stands for the sandbox server's own TCP port
        self.resolver = Resolver({"api.test": "127.0.0.1", "other.test": "127.0.0.1",
                                  "self.test": "127.0.0.1", "intranet.test": "10.20.30.40",
                                  "metadata.test": "169.254.169.254"})
        upstream = ssl.create_default_context(cafile=str(api.ca_path))
        self.proxy = EgressProxy(self.store, self.ca, str(self.log_path), resolver=self.resolver,
                                 upstream_ssl=upstream, own_addresses={("127.0.0.1", self.server_port)},
                                 **options)
        self.count = 0

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def session(self, egress: dict) -> tuple[int, dict[str, str]]:
        """A session for ``egress`` (the create body's field): the forwarder's port, placeholders."""
        self.count += 1
        policy = parse_policy(egress)
        placeholders = self.store.placeholders_for(policy.secrets)
        path = self.socket_path = str(self.tmp / f"egress-{self.count}.sock")
        self.run(self.proxy.open(f"sbx{self.count}", policy, placeholders, path))
        ready = threading.Event()
        threading.Thread(target=egress_forwarder.serve, args=(path, 0, ready), daemon=True).start()
        ready.wait(10)
        return ready.port, placeholders

    def client(self, port: int) -> httpx.Client:
        trust = ssl.create_default_context(cafile=str(self.api.ca_path))
        trust.load_verify_locations(self.ca.cert_path)
        return httpx.Client(proxy=f"http://127.0.0.1:{port}", verify=trust, timeout=20)

    def records(self, count: int = 0) -> list[dict]:
        """The log's records, once there are ``count`` (a tunnel is logged when it closes)."""
        def read():
            lines = self.log_path.read_text().splitlines() if self.log_path.exists() else []
            return [json.loads(line) for line in lines] if len(lines) >= count else None
        return support.wait_for(read, 30)

    def stop(self) -> None:
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _stop(self) -> None:
        self.proxy.close_all()
        await asyncio.sleep(0)


@pytest.fixture
def api(tmp_path):
    host = ApiHost(tmp_path)
    yield host
    host.close()


@pytest.fixture
def egress(tmp_path, api):
    under_test = ProxyUnderTest(tmp_path, api)
    yield under_test
    under_test.stop()


def allow_api(api: ApiHost, **extra) -> dict:
    """api.test and other.test on the test servers' ports, and the loopback address they
    resolve to listed explicitly (without it, loopback is refused)."""
    ports = f"{api.https_port},{api.http_port}"
    return {"allow": [f"api.test:{ports}", f"other.test:{ports}", f"127.0.0.1/32:{ports}"], **extra}


