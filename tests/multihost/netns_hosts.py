"""Several real hosts on one machine: network namespaces on a bridge, each with its own address.

Each host is a network namespace (``ip netns add``) with one end of a veth pair; the other end
is a port of a bridge made for the test, which holds the test's own address (the test process
reaches every host through it). Addresses come from 198.18.0.0/15, the range set aside for
network tests (RFC 2544), in a /24 no interface of this machine uses. Processes enter a host
with ``nsenter --net`` (not ``ip netns exec``, which remounts /sys and would hide the cgroup
hierarchies a node server needs). ``close()`` ends the processes, then deletes the namespaces,
the veths and the bridge.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import typing as t


def why_not_available() -> str | None:
    """None if this machine can make hosts, else why not (the test is skipped with it)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run the tests as root"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2 / util-linux)"
    probe = f"skprobe{secrets.token_hex(3)}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    for _ in range(200):
        net = ipaddress.ip_network(f"198.{18 + secrets.randbelow(2)}.{secrets.randbelow(256)}.0/24")
        if f" {'.'.join(str(net.network_address).split('.')[:3])}." not in used:
            return net
    raise RuntimeError("no free /24 in 198.18.0.0/15")


class Host:
    def __init__(self, net: "Network", name: str, address: str):
        self.net, self.name, self.address = net, name, address
        self.netns = f"{net.tag}-{name}"
        self.veth = ""  # the root namespace's end of its cable
        self.procs: list[subprocess.Popen] = []

    def popen(self, argv: t.Sequence[str], **kwargs: t.Any) -> subprocess.Popen:
        """A process on this host (its own session, so it can be signalled as a group)."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{self.netns}", *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def link(self, up: bool) -> None:
        """Cable in or out: with the link down the host's address answers nothing at all."""
        _ip("-n", self.netns, "link", "set", "eth0", "up" if up else "down")


class Network:
    def __init__(self) -> None:
        self.tag = "sk" + secrets.token_hex(3)
        self.subnet = _free_subnet()
        self.bridge = f"{self.tag}br"
        self.gateway_address = str(self.subnet.network_address + 1)  # the test's own address
        self.hosts: list[Host] = []
        self._made_bridge = False

    def open(self) -> "Network":
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        _ip("addr", "add", f"{self.gateway_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def host(self, name: str) -> Host:
        host = Host(self, name, str(self.subnet.network_address + 10 + len(self.hosts)))
        _ip("netns", "add", host.netns)
        self.hosts.append(host)
        veth = host.veth = f"{self.tag}{len(self.hosts)}"
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        for host in self.hosts:
            for proc in host.procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait(10)
            # Anything else still in the namespace (a process that left the session).
            pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            # Deleting a namespace frees its veth pair only once the kernel has let go of the
            # namespace, which it does in the background: delete the pair from this end now.
            subprocess.run(["ip", "link", "del", host.veth], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
        if self._made_bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.hosts = []

    def leftovers(self) -> list[str]:
        """Namespaces and links of this network still present (empty after close)."""
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        return [line for line in (netns + links).splitlines() if self.tag in line]
