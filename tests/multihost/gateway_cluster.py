"""A small cluster on one machine: node servers and gateways, each on its own host
(network namespace, own address), all started for real (``python -m sandbox serve`` with
real bwrap and cgroups; ``python -m sandbox gateway``).

The nodes share the session server's built images (``support.make_state_dir(images_from=)``),
so no node builds one; their warm pools are kept small, as two cores run all of them.
"""

from __future__ import annotations

import pathlib
import shutil
import signal
import subprocess
import sys
import time
import typing as t

import httpx

import support
from netns_hosts import Host, Network

NODE_PORT = 8765
GATEWAY_PORT = 8780
START_TIMEOUT = 120.0


class Process:
    """A server on one host: started, health-checked over the network, killed."""

    def __init__(self, host: Host, argv: list[str], url: str, log_path: pathlib.Path, token: str,
                 launcher: t.Sequence[str] = ()):
        self.host, self.argv, self.url, self.log_path, self.token = host, argv, url, log_path, token
        # What runs ``sandbox``: ``python -m sandbox``, or a control's variant of it.
        self.launcher = list(launcher) or [sys.executable, "-m", "sandbox"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = self.host.popen([*self.launcher, *self.argv], stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, cwd=str(support.REPO),
                                        env=support.server_env(self.token))
        deadline = time.monotonic() + START_TIMEOUT
        while not support.is_healthy(self.url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.argv[0]} on {self.host.name} did not start:\n{self.log_tail()}")
            time.sleep(0.1)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM, so that it removes what it made (a gateway's private directory);
        SIGKILL if it hangs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def client(self, timeout: float = 60) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"},
                            timeout=httpx.Timeout(timeout, connect=5))


class Node(Process):
    def __init__(self, host: Host, node_id: str, state_dir: pathlib.Path, token: str, *extra: str):
        self.node_id, self.state_dir = node_id, state_dir
        super().__init__(host, ["serve", "--host", host.address, "--port", str(NODE_PORT), "--state-dir", str(state_dir),
                                "--node-id", node_id, *extra],
                         f"http://{host.address}:{NODE_PORT}", state_dir / "node.log", token)

    def supervisors(self) -> list[int]:
        return [pid for pid in support.processes_of(self.state_dir / "sandboxes")
                if support.is_supervisor_command(support.cmdline(pid))]

    def kill_everything(self) -> list[int]:
        """SIGKILL the server and every supervisor (their sandboxes die with them)."""
        victims = self.supervisors()
        self.kill9()
        support.signal_all(victims, signal.SIGKILL)
        return victims


class Gateway(Process):
    def __init__(self, host: Host, token: str, log_dir: pathlib.Path, *args: str, launcher: t.Sequence[str] = ()):
        super().__init__(host, ["gateway", "--host", host.address, "--port", str(GATEWAY_PORT), *args],
                         f"http://{host.address}:{GATEWAY_PORT}", log_dir / f"gateway-{host.name}.log", token,
                         launcher)


class Cluster:
    def __init__(self, net: Network, token: str, images_from: pathlib.Path, work: pathlib.Path):
        self.net, self.token, self.images_from, self.work = net, token, images_from, work
        self.nodes: list[Node] = []
        self.gateways: list[Gateway] = []

    def add_node(self, node_id: str, *extra: str) -> Node:
        state_dir = support.make_state_dir(f"sbk-mh-{node_id}-", images_from=self.images_from)
        node = Node(self.net.host(node_id), node_id, state_dir, self.token, *extra)
        self.nodes.append(node)
        node.start()
        return node

    def add_gateway(self, name: str, *args: str, launcher: t.Sequence[str] = ()) -> Gateway:
        gateway = Gateway(self.net.host(name), self.token, self.work, *args, launcher=launcher)
        self.gateways.append(gateway)
        gateway.start()
        return gateway

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def close(self) -> None:
        for process in [*self.gateways, *self.nodes]:
            process.stop()
        for node in self.nodes:
            support.sweep(node.state_dir)
        self.net.close()
        for node in self.nodes:
            shutil.rmtree(node.state_dir, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- {p.host.name}\n{p.log_tail()}" for p in [*self.nodes, *self.gateways])


def wait_for(predicate: t.Callable[[], t.Any], timeout: float, interval: float = 0.2) -> t.Any:
    return support.wait_for(predicate, timeout, interval)
