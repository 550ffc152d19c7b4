"""A node server with a node id and a gateway in front of it, both real processes on
loopback: the gateway's behaviour that needs no second host (and no root)."""

from __future__ import annotations

import pathlib
import secrets
import subprocess
import sys
import time
import typing as t

import httpx
import pytest

import support


class GatewayProcess:
    """``python -m sandbox gateway`` on a free loopback port."""

    def __init__(self, token: str, log_path: pathlib.Path, *args: str, launcher: t.Sequence[str] = (),
                 env: dict[str, str] | None = None):
        self.token, self.log_path, self.args = token, log_path, list(args)
        self.extra_env = dict(env or {})  # settings the gateway reads from its environment
        # What runs ``sandbox``: ``python -m sandbox``, or a control's variant of it.
        self.launcher = list(launcher) or [sys.executable, "-m", "sandbox"]
        self.port = support.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "GatewayProcess":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([*self.launcher, "gateway", "--port", str(self.port), *self.args],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=support.server_env(self.token, self.extra_env), cwd=str(support.REPO), start_new_session=True)
        deadline = time.monotonic() + 60
        while not support.is_healthy(self.url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the gateway did not start:\n{self.log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def client(self, **kwargs: t.Any) -> httpx.Client:
        kwargs.setdefault("timeout", httpx.Timeout(60, connect=5))
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, **kwargs)

    @property
    def env(self) -> dict[str, str]:
        return {"SANDBOX_KERNEL_URL": self.url, "SANDBOX_KERNEL_TOKEN": self.token}


@pytest.fixture(scope="module")
def node(sandbox_server: support.Server) -> t.Iterator[support.Server]:
    if sandbox_server.external:
        pytest.skip("the node borrows the session server's images, which are on another host")
    state = support.make_state_dir("sbk-gw-node-", images_from=sandbox_server.state_dir)
    with support.Server(state, "--node-id", "loop1", "--pool-size", "1", "--set", "max_sandboxes=3", token=secrets.token_hex(16),
                        start_timeout=120) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(node: support.Server) -> t.Iterator[GatewayProcess]:
    gw = GatewayProcess(node.token, node.state_dir / "gateway.log", "--node", node.url,
                        "--refresh-seconds", "0.5", "--node-gone-seconds", "3").start()
    yield gw
    gw.stop()


@pytest.fixture
def rarely_refreshing_gateway(node: support.Server) -> t.Iterator[GatewayProcess]:
    """A gateway whose view of the node is as old as its start (it refreshes hourly)."""
    gw = GatewayProcess(node.token, node.state_dir / "gateway-slow.log", "--node", node.url,
                        "--refresh-seconds", "3600").start()
    yield gw
    gw.stop()


@pytest.fixture
def new_gateway(node: support.Server) -> t.Iterator[t.Callable[..., GatewayProcess]]:
    """new_gateway(name, *args) -> a started gateway in front of `node` (and what ``args`` add:
    another --node, --refresh-seconds...), stopped afterwards."""
    made: list[GatewayProcess] = []

    def start(name: str, *args: str) -> GatewayProcess:
        made.append(GatewayProcess(node.token, node.state_dir / f"gateway-{name}.log", "--node", node.url, *args))
        return made[-1].start()

    yield start
    for gw in made:
        gw.stop()


@pytest.fixture
def gateway_to(tmp_path: pathlib.Path) -> t.Iterator[t.Callable[..., GatewayProcess]]:
    """gateway_to(token, *args, launcher=()) -> a started gateway with these arguments, stopped
    afterwards."""
    made: list[GatewayProcess] = []

    def start(token: str, *args: str, launcher: t.Sequence[str] = ()) -> GatewayProcess:
        made.append(GatewayProcess(token, tmp_path / f"gateway-{len(made)}.log", *args, launcher=launcher))
        return made[-1].start()

    yield start
    for gw in made:
        gw.stop()
