"""Clients that speak plain HTTP to a sandbox server (its unix socket, an http:// URL) share
one SSL context, made once per process (sandbox/service/endpoint.py): httpx would make one
per transport, and in a kernel process the first cost about 4 MiB. An https:// URL keeps
httpx's own, verifying context."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.harness import with_repo_on_path
from sandbox.service import endpoint


def context_of(transport) -> object:
    return transport._pool._ssl_context


def test_plain_http_transports_share_one_context_and_https_keeps_httpx_own():
    shared = endpoint.plain_http_context()
    for where in ("unix:/tmp/some.sock", "http://127.0.0.1:8765"):
        found = endpoint.parse_url(where)
        assert not found.tls
        assert context_of(found.transport()) is shared
        assert context_of(found.async_transport()) is shared
    secure = endpoint.parse_url("https://sandboxes.example.org")
    assert secure.tls
    assert secure.transport() is None and secure.async_transport() is None  # httpx's default: verify=True


def test_the_fork_server_makes_the_context_before_it_forks(tmp_path):
    code = ("from kernel import forkserver; forkserver.preload()\n"
            "from sandbox.service.endpoint import plain_http_context\n"
            "print(plain_http_context.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, env=with_repo_on_path(dict(os.environ)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "1"
