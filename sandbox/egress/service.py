"""The server's side of egress: one proxy, one secret store and one CA per server, and what
a sandbox with a policy gets at launch (a socket directory, a CA bundle, a package layer,
environment variables). The spec that reaches the supervisor holds paths and placeholders,
never a secret's value.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import urllib.parse

from ..core.descriptors import DescriptorBudget
from ..common.errors import ApiError
from ..isolation.bwrap import EGRESS_CA_BUNDLE as CA_BUNDLE, EGRESS_PACKAGES as PACKAGES, EGRESS_SOCKET_DIR as SOCKET_DIR
from .connections import ConnectionLimits, ConnectionTable
from .policy import EgressPolicy, parse_policy
from .proxy import EgressProxy, Resolver
from .secrets import SecretLimits, SecretStore

log = logging.getLogger("sandbox.egress")

SOCKET_NAME = "proxy.sock"
FORWARDER_PORT = 3128
DEFAULT_INDEX = "https://pypi.org/simple"


@functools.cache
def server_pip_index() -> str:
    """The index the server's own pip uses (its configuration and environment), if it is an
    https URL a sandbox could reach through the proxy; else PyPI's."""
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    index = os.environ.get("PIP_INDEX_URL", "")
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".index-url") and not index:
            index = value.strip().strip("'\"")
    return index if index.startswith("https://") else DEFAULT_INDEX


def index_hosts(index_url: str) -> tuple[str, ...]:
    host = urllib.parse.urlsplit(index_url).hostname or ""
    # PyPI's index points at its file host for the downloads themselves.
    return (host, "files.pythonhosted.org") if host == "pypi.org" else (host,)


def own_addresses(config) -> set[tuple[str, int]]:
    """The sandbox server's own TCP (address, port)s, refused even when a policy lists them;
    a wildcard bind stands for every loopback spelling of that port."""
    if config.tcp is None:
        return set()
    host, port = config.tcp
    if host in ("", "0.0.0.0", "::"):
        return {("127.0.0.1", port), ("::1", port), ("0.0.0.0", port), ("::", port)}
    return {(host, port)}


def from_config(config) -> "EgressService":
    """The service with the operator's settings (ServiceConfig's egress_*, secrets_*, descriptor_reserve)."""
    return EgressService(
        config.state_dir, hosts=config.egress_hosts, upstream_ca=config.egress_ca_file,
        own_addresses=own_addresses(config), pip_index=config.egress_pip_index,
        limits=ConnectionLimits(config.egress_max_connections, config.egress_head_timeout_seconds,
                                config.egress_idle_timeout_seconds),
        descriptor_reserve=config.descriptor_reserve,
        secret_limits=SecretLimits(config.secrets_max_per_user, config.secrets_max_value_bytes, config.secrets_max_hosts),
        plain_http_secret_hosts=frozenset(config.egress_insecure_plain_http_secret_hosts))



def readonly_copy(source: str, dest: str) -> None:
    """Copy `source` over `dest` (0444 afterwards), in place: a running sandbox's bind mount
    holds dest's inode, so a server restart's reopen must write into that file, not replace
    it. Made writable first: a non-root server may not write its own 0444 file (root could)."""
    if os.path.exists(dest):
        os.chmod(dest, 0o644)
    shutil.copyfile(source, dest)
    os.chmod(dest, 0o444)

class EgressService:
    def __init__(self, state_root: str, *, hosts: dict[str, str] | None = None, upstream_ca: str = "",
                 own_addresses: set[tuple[str, int]] | None = None, pip_index: str = "",
                 limits: ConnectionLimits | None = None, descriptor_reserve: int = 0,
                 secret_limits: SecretLimits | None = None, plain_http_secret_hosts: frozenset[str] = frozenset()) -> None:
        self.root = os.path.join(state_root, "egress")
        self.secrets = SecretStore(secret_limits)
        self.limits = limits or ConnectionLimits()
        self.descriptor_reserve = descriptor_reserve
        self.plain_http_secret_hosts = plain_http_secret_hosts
        self.hosts = dict(hosts or {})
        self.upstream_ca = upstream_ca
        self.own_addresses = own_addresses or set()
        self._pip_index = pip_index
        self._proxy: EgressProxy | None = None

    @property
    def pip_index(self) -> str:
        return self._pip_index or server_pip_index()

    @property
    def proxy(self) -> EgressProxy:
        """Made on first use: a server whose sandboxes never ask for egress makes no CA (nor
        imports cryptography, which the CA is made with: about 4 MiB of the server)."""
        if self._proxy is None:
            from .ca import CertificateAuthority

            os.makedirs(self.root, mode=0o700, exist_ok=True)
            import ssl

            upstream = ssl.create_default_context()
            if self.upstream_ca:
                upstream.load_verify_locations(self.upstream_ca)
            self._proxy = EgressProxy(self.secrets, CertificateAuthority(os.path.join(self.root, "ca")),
                                      os.path.join(self.root, "requests.log"), resolver=Resolver(self.hosts),
                                      upstream_ssl=upstream, own_addresses=self.own_addresses,
                                      connections=ConnectionTable(self.limits, DescriptorBudget(self.descriptor_reserve)),
                                      plain_http_secret_hosts=self.plain_http_secret_hosts)
        return self._proxy

    def parse(self, egress, owner: int | None = None) -> EgressPolicy:
        pip = isinstance(egress, dict) and egress.get("pip") is True
        policy = parse_policy(egress, pip_hosts=index_hosts(self.pip_index) if pip else ())
        for name in policy.secrets:
            self.secrets.get(name, owner)  # 404 for a secret this user did not register
            if name in RESERVED_ENV or name.startswith(("SANDBOX_", "PIP_", "PYTHON", "LD_")):
                raise ApiError(422, "invalid_request", f"egress: a secret named {name!r} would replace one of the "
                               "sandbox's own environment variables; register it under another name")
        return policy

    async def prepare(self, sandbox_id: str, sandbox_dir: str, policy: EgressPolicy, uid: int | None,
                      owner: int | None = None) -> dict:
        """Open the sandbox's socket and return the ``egress`` part of its launch spec."""
        placeholders = self.secrets.placeholders_for(policy.secrets, owner)
        return await self._open(sandbox_id, sandbox_dir, policy, placeholders, uid, owner)

    async def _open(self, sandbox_id, sandbox_dir, policy, placeholders, uid, owner) -> dict:
        proxy = self.proxy
        socket_dir = os.path.join(sandbox_dir, "egress")
        os.makedirs(socket_dir, mode=0o755, exist_ok=True)
        await proxy.open(sandbox_id, policy, placeholders, os.path.join(socket_dir, SOCKET_NAME),
                         sandbox_uid=uid, owner=owner)
        # A copy the sandbox's uid can read (bwrap binds it as that uid; the CA's directory is 0700).
        bundle = os.path.join(socket_dir, "ca-bundle.pem")
        readonly_copy(proxy.ca.bundle_path, bundle)
        spec = {"socket_dir": socket_dir, "ca_bundle": bundle, "policy": policy.describe(),
                "placeholders": placeholders, "packages": None, "owner": owner}
        env = {
            "SANDBOX_EGRESS_SOCKET": f"{SOCKET_DIR}/{SOCKET_NAME}",
            "SANDBOX_EGRESS_PORT": str(FORWARDER_PORT),
            "SSL_CERT_FILE": CA_BUNDLE, "REQUESTS_CA_BUNDLE": CA_BUNDLE, "CURL_CA_BUNDLE": CA_BUNDLE,
            "PIP_CERT": CA_BUNDLE,
            # one retry: pip shows a failed attempt only in its retry warning, and that line
            # carries the proxy's refusal (which host, and why); without it pip says only
            # "no matching distribution" (the proxy answers at once, so the retry is quick)
            "PIP_RETRIES": "1",
        }
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            env[name] = f"http://127.0.0.1:{FORWARDER_PORT}"
        if policy.pip:
            packages = os.path.join(sandbox_dir, "packages")
            os.makedirs(packages, mode=0o700, exist_ok=True)
            if uid is not None:
                os.chown(packages, uid, uid)
            spec["packages"] = packages
            # pip's own retries and timeout again (the sandbox's default is one quick attempt)
            env.update({"PIP_INDEX_URL": self.pip_index, "PIP_TARGET": PACKAGES, "PIP_RETRIES": "5",
                        "PIP_TIMEOUT": "15"})
        env.update(placeholders)
        spec["env"] = env
        return spec

    async def reopen(self, sandbox_id: str, sandbox_dir: str, spec: dict, uid: int | None) -> None:
        """After a server restart: the sandbox keeps its policy and placeholders (a secret not
        registered again since is simply not replaced)."""
        egress = spec.get("egress")
        if not egress:
            return
        source = dict(egress["policy"])
        source.pop("pip_hosts", None)
        policy = parse_policy(source, pip_hosts=index_hosts(self.pip_index) if source.get("pip") else ())
        await self._open(sandbox_id, sandbox_dir, policy, egress.get("placeholders") or {}, uid, egress.get("owner"))

    def close(self, sandbox_id: str) -> None:
        if self._proxy is not None:
            self._proxy.close(sandbox_id)

    def totals(self) -> dict[str, int]:
        """Egress requests, refusals and bytes since the server started (the metrics' counters)."""
        if self._proxy is None:
            return {"requests": 0, "refused": 0, "bytes_in": 0, "bytes_out": 0}
        return self._proxy.totals()

    def describe(self, sandbox_id: str) -> dict | None:
        """The policy in force and what the sandbox has used of its budgets (for GET and
        %sandbox): the secrets by name and the variable that holds each placeholder."""
        session = self._proxy.sessions.get(sandbox_id) if self._proxy is not None else None
        if session is None:
            return None
        usage = {**session.usage(), "connections": self._proxy.connections.count(sandbox_id),
                 "max_connections": self.limits.per_sandbox}
        return {"policy": session.policy.describe(), "usage": usage,
                "proxy": f"http://127.0.0.1:{FORWARDER_PORT}", "secrets": sorted(session.placeholders)}


RESERVED_ENV = frozenset({"HOME", "USER", "LANG", "LC_ALL", "PATH", "VIRTUAL_ENV", "IPYTHONDIR", "MPLCONFIGDIR",
                          "MPLBACKEND", "TERM", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                          "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NO_PROXY", "no_proxy"})
