"""Each isolation layer proved on its own, with the layer that would hide its absence set aside.

Layers overlap: seccomp refuses every network socket, so a sandbox that lost its network
namespace still cannot connect and the other service tests pass; and the reverse. Each
test here runs on a server of its own with the other layer switched off, through the
test-only switches (``--no-seccomp``; ``--unsafe-test-only-layers-off`` confirmed by
``SANDBOX_KERNEL_UNSAFE_TEST_ONLY_LAYERS_OFF``, see sandbox/isolation/testonly.py), so a protection
that silently disappears fails a test here:

- the network namespace alone (seccomp off) blocks TCP to every host address and the
  host's abstract unix sockets;
- seccomp alone (the host's network namespace shared) refuses every socket but AF_UNIX;
- distinct host uids alone (seccomp off, the host's pid namespace and sandboxes directory
  shared): a sandbox can neither signal another's processes nor read its files;
- the runtime's output cap alone: a cell printing past the cap is cut by the runtime
  itself, well below where the supervisor's backstop would cut.

Every probe has a control showing the layer set aside really is off, and the host side
showing the blocked action works where no sandbox is in the way.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import subprocess
import sys
import threading

import pytest
from support import (
    REPO,
    cmdline,
    descendants,
    execute,
    free_port,
    is_runtime,
    ok,
    real_uid,
    server_env,
    stream_text,
    supervisor_pid,
    wait_for,
)
from svc_support import last_json_line

from sandbox.isolation import testonly

pytestmark = pytest.mark.slow

SECCOMP_OFF = ("--no-seccomp", "--allow-missing-protections")


def layers_off(*layers: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """serve arguments and environment that set these layers aside (tests only)."""
    names = ",".join(layers)
    return (("--unsafe-test-only-layers-off", names, "--allow-missing-protections"), {testonly.ENV: names})


def host_addresses() -> list[str]:
    """127.0.0.1 and the host's other IPv4 addresses, if any can be found."""
    found = ["127.0.0.1"]
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
        found += [a for a in out.split() if "." in a and a not in found]
    except (OSError, subprocess.SubprocessError):
        pass
    return found


class Listeners:
    """A TCP listener on every host address and an abstract unix socket (abstract names
    belong to a network namespace), counting the connections they accept."""

    def __init__(self) -> None:
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("0.0.0.0", 0))
        self.tcp.listen(16)
        self.port = self.tcp.getsockname()[1]
        self.abstract_name = f"\0sbk-layers-{secrets.token_hex(6)}"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(self.abstract_name)
        self.unix.listen(16)
        self.accepted = {"tcp": 0, "unix": 0}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, args=(s, k), daemon=True)
                        for s, k in ((self.tcp, "tcp"), (self.unix, "unix"))]
        for thread in self.threads:
            thread.start()

    def _accept(self, listener: socket.socket, kind: str) -> None:
        listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self.accepted[kind] += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(2)
        self.tcp.close()
        self.unix.close()


@pytest.fixture
def listeners():
    found = Listeners()
    yield found
    found.close()


def network_probe(addresses: list[str], port: int, abstract_name: str) -> str:
    """A cell that tries every way out and prints what happened, as JSON."""
    return f"""
import errno, json, socket
out = {{}}
def attempt(name, action):
    try:
        out[name] = ["ok", action()]
    except OSError as exc:
        out[name] = [type(exc).__name__, errno.errorcode.get(exc.errno)]
def tcp(address):
    with socket.create_connection((address, {port}), timeout=3):
        return "connected"
def made(family, kind):
    socket.socket(family, kind).close()
    return "made"
def abstract():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect({abstract_name!r})
        return "connected"
for address in {addresses!r}:
    attempt("tcp " + address, lambda address=address: tcp(address))
attempt("inet socket", lambda: made(socket.AF_INET, socket.SOCK_STREAM))
attempt("inet6 socket", lambda: made(socket.AF_INET6, socket.SOCK_DGRAM))
attempt("netlink socket", lambda: made(socket.AF_NETLINK, socket.SOCK_RAW))
attempt("interfaces", lambda: sorted(name for _, name in socket.if_nameindex()))
attempt("abstract unix", abstract)
print(json.dumps(out))
"""


def host_can_reach(listeners: Listeners, addresses: list[str]) -> None:
    """Control: from the host, every address and the abstract socket accept."""
    for address in addresses:
        socket.create_connection((address, listeners.port), timeout=5).close()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(listeners.abstract_name)


def test_the_network_namespace_alone_keeps_a_sandbox_off_the_network(spawn_server, listeners):
    server = spawn_server(*SECCOMP_OFF)
    addresses = host_addresses()
    with server.client() as c:
        created = c.post("/v1/sandboxes", json={}).json()
        assert created["isolation"]["seccomp"] is False, created["isolation"]  # the other layer is off
        probe = last_json_line(execute(c, created["id"], network_probe(addresses, listeners.port,
                                                                                listeners.abstract_name)))
    print("\nnamespace alone, seccomp off:", probe)
    # control: seccomp is really off, so nothing below is its doing
    assert probe["inet socket"] == ["ok", "made"], probe
    assert probe["netlink socket"] == ["ok", "made"], probe
    # the namespace: a loopback of its own and nothing else
    assert probe["interfaces"] == ["ok", ["lo"]], probe
    assert probe["tcp 127.0.0.1"] == ["ConnectionRefusedError", "ECONNREFUSED"], probe
    for address in addresses[1:]:
        assert probe[f"tcp {address}"][0] != "ok" and probe[f"tcp {address}"][1] in ("ENETUNREACH", "EHOSTUNREACH"), probe
    assert probe["abstract unix"] == ["ConnectionRefusedError", "ECONNREFUSED"], probe
    assert listeners.accepted == {"tcp": 0, "unix": 0}
    host_can_reach(listeners, addresses)


def test_seccomp_alone_keeps_a_sandbox_off_the_network(spawn_server, listeners):
    """The sandbox shares the host's network namespace: only seccomp stands between it and
    every listener of the host. Safe to run: the cell is this test's own."""
    args, env = layers_off("network")
    server = spawn_server(*args, extra_env=env)
    addresses = host_addresses()
    with server.client() as c:
        created = c.post("/v1/sandboxes", json={}).json()
        isolation = created["isolation"]
        assert isolation["seccomp"] is True and isolation["unsafe_test_only_layers_off"] == ["network"], isolation
        probe = last_json_line(execute(c, created["id"], network_probe(addresses, listeners.port,
                                                                                listeners.abstract_name)))
    print("\nseccomp alone, host network shared:", probe)
    # control: the namespace is really the host's (its abstract socket is reachable)
    assert probe["abstract unix"] == ["ok", "connected"], probe
    # seccomp refuses every socket family but AF_UNIX, as if it did not exist
    for name in ("inet socket", "inet6 socket", "netlink socket"):
        assert probe[name] == ["OSError", "EAFNOSUPPORT"], (name, probe)
    for address in addresses:
        assert probe[f"tcp {address}"] == ["OSError", "EAFNOSUPPORT"], probe
    assert probe["interfaces"][0] != "ok", probe  # glibc asks over netlink
    assert wait_for(lambda: listeners.accepted["unix"] == 1, 5), listeners.accepted
    assert listeners.accepted["tcp"] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="distinct host uids per sandbox need a server running as root")
def test_distinct_host_uids_alone_keep_sandboxes_apart(spawn_server):
    """Two sandboxes run as two host uids, seen in their processes' real uids; with seccomp
    off and the host's pid namespace and sandboxes directory shared, the uid is all that
    keeps one from signalling the other's processes or reading its workspace."""
    args, env = layers_off("pid", "sandboxes_dir")
    server = spawn_server(*SECCOMP_OFF, *args, extra_env=env)
    with server.client() as c:
        a, b = (c.post("/v1/sandboxes", json={}).json() for _ in range(2))
        for sbx in (a, b):
            isolation = sbx["isolation"]
            assert isolation["seccomp"] is False, isolation
            assert isolation["unsafe_test_only_layers_off"] == ["pid", "sandboxes_dir"], isolation
        uids = {sbx["id"]: sbx["isolation"]["host_uid"] for sbx in (a, b)}
        assert all(isinstance(u, int) and u > 0 for u in uids.values()) and len(set(uids.values())) == 2, uids
        runtimes = {}
        for sbx in (a, b):
            ok(execute(c, sbx["id"], "open('/workspace/secret.txt', 'w').write('only for ' + "
                                             f"{sbx['id']!r})"))
            tree = descendants(supervisor_pid(server, sbx["id"]))
            runtime = [pid for pid in tree if is_runtime(" ".join(cmdline(pid)))]
            assert len(runtime) == 1, {p: cmdline(p) for p in tree}
            runtimes[sbx["id"]] = runtime[0]
            # the host sees each sandbox's processes under that sandbox's own uid
            for pid in tree:
                assert real_uid(pid) == uids[sbx["id"]], (sbx["id"], pid, cmdline(pid))
        probe = last_json_line(execute(c, a["id"], f"""
import errno, json, os
out = {{}}
def attempt(name, action):
    try:
        out[name] = ["ok", action()]
    except OSError as exc:
        out[name] = [type(exc).__name__, errno.errorcode.get(exc.errno)]
attempt("see other", lambda: os.path.exists("/proc/{runtimes[b['id']]}/status"))
attempt("signal other", lambda: os.kill({runtimes[b['id']]}, 0))
attempt("read other", lambda: open("/tmp/host-sandboxes/{b['id']}/workspace/secret.txt").read())
attempt("list other", lambda: os.listdir("/tmp/host-sandboxes/{b['id']}/workspace"))
attempt("read own", lambda: open("/tmp/host-sandboxes/{a['id']}/workspace/secret.txt").read())
attempt("my pid", lambda: os.getpid())
print(json.dumps(out))
"""))
    print("\nuids alone, seccomp off, host pid namespace and sandboxes directory shared:", probe)
    # controls: the namespaces are really set aside
    assert probe["see other"] == ["ok", True], probe
    assert probe["my pid"] == ["ok", runtimes[a["id"]]], probe
    assert probe["read own"] == ["ok", f"only for {a['id']}"], probe
    # the uid alone
    assert probe["signal other"] == ["PermissionError", "EPERM"], probe
    assert probe["read other"] == ["PermissionError", "EACCES"], probe
    assert probe["list other"] == ["PermissionError", "EACCES"], probe
    # control: the host can do both
    os.kill(runtimes[b["id"]], 0)
    assert (server.state_dir / "sandboxes" / b["id"] / "workspace" / "secret.txt").read_text() == f"only for {b['id']}"


def test_the_runtime_output_cap_alone_cuts_a_flood(api, new_sandbox, run):
    """The runtime trims a cell's output at the cap before anything is framed; the
    supervisor's budget is only a backstop well above the cap, so a flood of 1.2 times
    the cap shows which layer cut it: the runtime's own notice, and no more than the cap."""
    created = new_sandbox()
    cap = created["limits"]["output_bytes"]
    chunk = 1 << 20
    chunks = -(-cap * 6 // 5 // chunk)  # ceil(1.2 x cap) in MiB
    events = run(created["id"], f"import sys\nfor _ in range({chunks}):\n    sys.stdout.write('x' * {chunk})\n")
    done = events[-1]
    assert done["type"] == "done" and done["truncated"] is True, done
    printed = stream_text(events, "stdout")
    assert len(printed) <= cap and set(printed) == {"x"}, len(printed)
    notice = stream_text(events, "stderr")
    assert "byte limit per execution were dropped" in notice and str(cap) in notice, notice
    dropped = chunks * chunk - len(printed)
    assert str(dropped) in notice, (dropped, notice)


def serve_briefly(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`serve` that is expected to refuse to start (it exits before it binds anything)."""
    return subprocess.run([sys.executable, "-m", "sandbox", "serve", "--port", str(free_port()),
                           "--state-dir", str(tmp_path / "state"), *args],
                          cwd=str(REPO), env=server_env("t" * 32, env), capture_output=True, text=True, timeout=120)


def test_the_test_only_switch_needs_its_variable_and_is_reported_loudly(tmp_path):
    """The switch must not be turned on by accident: the flag alone is refused whatever else
    is said; with the confirming variable it is still reported as missing protections, so
    serve also wants --allow-missing-protections; and doctor flags the variable itself."""
    alone = serve_briefly(tmp_path, "--unsafe-test-only-layers-off", "network", "--allow-missing-protections")
    assert alone.returncode == 2, alone
    assert "refusing to start" in alone.stderr and testonly.ENV in alone.stderr, alone.stderr
    wrong = serve_briefly(tmp_path, "--unsafe-test-only-layers-off", "network", "--allow-missing-protections",
                          env={testonly.ENV: "pid"})
    assert wrong.returncode == 2 and "refusing to start" in wrong.stderr, wrong
    confirmed = serve_briefly(tmp_path, "--unsafe-test-only-layers-off", "network", env={testonly.ENV: "network"})
    assert confirmed.returncode == 2, confirmed
    assert "network (SET ASIDE FOR TESTS)" in confirmed.stderr and "--allow-missing-protections" in confirmed.stderr, \
        confirmed.stderr
    unknown = serve_briefly(tmp_path, "--unsafe-test-only-layers-off", "seatbelts", env={testonly.ENV: "seatbelts"})
    assert unknown.returncode != 0 and "unknown isolation layer" in unknown.stderr, unknown
    doctor = subprocess.run([sys.executable, "-m", "sandbox", "doctor", "--json"], cwd=str(REPO),
                            env=server_env(None, {testonly.ENV: "network"}), capture_output=True, text=True, timeout=120)
    items = {item["name"]: item for item in json.loads(doctor.stdout)}
    assert items["test-only variable"]["status"] == "weaker", items
    assert testonly.ENV in items["test-only variable"]["detail"]
    assert not (tmp_path / "state").exists()  # refused before touching anything
