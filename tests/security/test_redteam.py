"""Red-team suite: an attacker who reads our source, controls the code a sandbox runs and can
plant files in its workspace, against the real server and real sandboxes.

Every probe has a positive control (the same action succeeding on the host, or in a sandbox
of a server started with seccomp off), so a missing binary or a broken probe cannot pass as
"blocked"; the blocked side asserts the exact failure. `pytest -s` prints one line per probe.

This suite stays in CI (README's test command runs it; it needs root). Until the layer tests
existed, it was the only one to catch removing the network namespace, not applying seccomp
at all, or disabling the runtime's output cap: in the service tests seccomp hides a missing
namespace (every non-unix socket is refused anyway), the namespace hides a missing seccomp
(nothing to connect to), and the supervisor's budget backs the output cap. Here the exact
errno of each probe and the seccomp-off control tell the layers apart.
tests/service/test_svc_layers.py now also proves each layer on its own, with the other set
aside through the test-only switches (sandbox/isolation/testonly.py), and scripts/mutation_check.py
checks that removing any one protection fails a test.

Probes:
 1. Host environment and secrets: a server of this module's own, with a canary in its
    environment and in files (its state dir, /root, /tmp) and a token: neither appears in the
    sandbox's environment, in any process's environ/cmdline, or in any readable file (a walk
    of /, reading every small file outside the read-only package trees, whose mounts are
    checked instead); /root, /home, /etc/shadow, /var/lib/sandbox-kernel, the state dir are
    absent. A control needle planted in the workspace is found by the same walk.
    Also: no inherited file descriptor leads out of the sandbox (/proc/*/fd/N/../..).
 2. Host files: /etc/shadow, /root and /tmp canaries -> FileNotFoundError; / holds only the
    minimal tree.
 3. Another sandbox: its files by any path, its processes (/proc, kill of its host pids).
 4. Writes outside /workspace (/, /usr, /etc, /opt, the runtime, the venv) -> EROFS.
 5. Network: TCP/UDP to host listeners, DNS, raw/netlink/packet/inet6 sockets, the server's
    port, an abstract unix socket, the supervisor's control socket.
 6. Fork bomb under "pids": 64 -> EAGAIN inside; the server and another sandbox still answer.
 7. Memory bomb under memory_mb 256 -> SandboxDied / reason "oom" / 410 naming memory.
 8. Disk: /tmp past its cap -> ENOSPC; /workspace past disk_mb -> ENOSPC (xfail while the
    server reports no workspace cap); the host's free space barely moves.
 9. Output flood of 50 MiB -> at most the cap, a truncation notice, bounded server RSS.
10. CPU hog with timeout_seconds 2 -> TimeoutError, timeout_interrupted, state kept.
11. Signals: kill(server pid) -> ESRCH; kill(1, SIGKILL) and kill(-1, SIGKILL) harm nothing
    outside.
12. ptrace(PTRACE_ATTACH) and process_vm_readv -> EPERM.
13. /proc and /sys: nothing of the host in /proc/*, kmsg/sysctl/kallsyms closed, no /sys,
    a minimal /dev; no host path of the server's in any process's command line.
14. setuid(0) -> EINVAL, setuid binaries powerless, every capability set empty.
15. keyctl / add_key -> EPERM.
16. mount, unshare (every namespace), `unshare -r`, bwrap inside -> all fail.
17. Airlock path tricks: planted symlinks, a directory swapped for a symlink, %2e%2e, %2F,
    absolute paths, NUL, a FIFO -> 4xx, never host content, host target untouched.
18. Forged frames and sync markers in output, writes to every fd -> exact output, a real
    done; a cell writing to the runtime's channel can only hurt its own sandbox; garbage on it stops
    that sandbox at once with the cause named
    garbage on that channel ends the execute promptly with the right cause.
19. A cell that tries to outlive DELETE (double fork, setsid, nohup, ignored SIGTERM/SIGHUP):
    every host process gone, cgroups removed.
20. API hardening: constant-time token check, token file 0600, no 0.0.0.0 without a token,
    the token never in the log or an error body, oversized bodies -> 413.
21. `sandbox-kernel doctor` reports each protection; serve with a protection missing refuses
    to start unless --allow-missing-protections.
"""

from __future__ import annotations

import ctypes
import errno
import http.client
import inspect
import json
import os
import pathlib
import re
import secrets
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import httpx
import pytest
from redteam_support import (RESULT_MARK, RedteamServer, cgroup_file, host_runtime_pid, minimal_dev, probe_cell, veil,
                             vm_rss_kib)

import support
from sandbox.runtime.forge import FORGE_CELL as FORGE  # `channel`: the runtime's own, on either tier
from support import cgroup_dirs, command, descendants, done_of, of_type, proc_identity, stream_text

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=(
    "the red-team suite needs root: per-sandbox host uids and cgroups on the server side, and host-side "
    "controls (mount, /proc/kmsg, su) that only root can run"))

MiB = 1 << 20
ZERO_CAPS = "0000000000000000"
# the host's /sys is out of reach on both tiers: bwrap mounts none, runsc always mounts
# gVisor's own sysfs (the Sentry's, a handful of virtual files)
GVISOR_ONLY_MOUNTS = {"/sys"}
# the gVisor root is the image's own copy: its /etc also holds the alternatives links of the
# few tools it carries
GVISOR_ONLY_ETC = {"alternatives"}
# bwrap on the pinned root (bwrap_system=pinned, the default): the same /etc as gVisor's, and
# the empty points the egress mounts land on (a read-only root cannot make them on demand)
PINNED_BWRAP_TOP = {"run"}
PINNED_BWRAP_ETC = GVISOR_ONLY_ETC | {"sandbox-egress"}
# the environment bwrap gives the runtime (--clearenv, then these): a new name here is a
# decision about what a sandbox may see, so it should fail this suite until added
SANDBOX_ENV = {"HOME", "USER", "LANG", "LC_ALL", "PATH", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
               "IPYTHONDIR", "MPLCONFIGDIR", "MPLBACKEND", "SANDBOX_PRELOAD", "SANDBOX_OUTPUT_LIMIT", "SANDBOX_MPLCACHE",
               "TERM", "PWD",
               # pip's one quick attempt without a network (isolation/bwrap.py, NO_NETWORK_PIP)
               "PIP_RETRIES", "PIP_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK", "PIP_NO_INPUT",
               # the sandbox's memory limit for a JVM's and V8's heaps (isolation/runtime_limits.py)
               "JAVA_TOOL_OPTIONS", "NODE_OPTIONS"}


def outcome(number: int, name: str, text: str) -> None:
    print(f"\nPROBE {number:>2} | {name:<30} | {text}", flush=True)


def failed_with(result: dict, exc: str, errno_name: str | int | None = None) -> bool:
    return (not result["ok"] and result["exc"] == exc
            and (errno_name is None or result["errno"] == errno_name))


def brief(result: dict) -> str:
    if result.get("ok"):
        return f"ok {str(result.get('value'))[:40]}"
    return f"{result['exc']}({result['errno']})"


def libc_syscall(*args) -> tuple[int, str | None]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    # Variadic: widen ints to long, or a register's upper half goes to the kernel as garbage.
    ret = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return ret, (errno.errorcode.get(ctypes.get_errno()) if ret < 0 else None)


# ================================================================== fixtures


@dataclass
class Canary:
    value: str
    tag: str
    control_value: str
    control_tag: str
    files: list[pathlib.Path]

    @property
    def filename(self) -> str:
        return self.tag + ".txt"


@pytest.fixture(scope="module")
def canary():
    c = Canary("sk-canary-" + secrets.token_hex(16), "canary-" + secrets.token_hex(6),
               "sk-control-" + secrets.token_hex(16), "control-" + secrets.token_hex(6), [])
    for d in (pathlib.Path("/root"), pathlib.Path("/tmp")):
        path = d / c.filename
        path.write_text(c.value + "\n")
        path.chmod(0o644)  # readable by any host uid: only isolation may keep it from a sandbox
        c.files.append(path)
    yield c
    for path in c.files:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def hostile(image_source, canary, isolation):
    """This module's server, its sandboxes in this run's tier: a canary in its environment and
    its state dir, a token of its own."""
    state = support.make_state_dir("sk-redteam-", images_from=image_source)
    planted = state / canary.filename
    planted.write_text(canary.value + "\n")
    planted.chmod(0o644)
    canary.files.append(planted)
    with RedteamServer(state, "tok-" + secrets.token_urlsafe(24), *support.tier_args(isolation),
                       extra_env={"SECRET_CANARY": canary.value}) as server:
        yield server
    canary.files.remove(planted)  # gone with its state dir: the next tier's server plants its own


@pytest.fixture(scope="module")
def open_server(image_source):
    """A bwrap server with seccomp off (--no-seccomp --allow-missing-protections): the control
    that shows which calls the filter, and not something else, stops (both tiers' probes
    are held against it: the same call succeeding without a protection)."""
    state = support.make_state_dir("sk-redteam-noseccomp-", images_from=image_source)
    with RedteamServer(state, secrets.token_urlsafe(24), "--no-seccomp", "--allow-missing-protections") as server:
        yield server


@pytest.fixture(scope="module")
def image_info(image_source) -> dict:
    return json.loads((image_source / "images" / "default" / "image.json").read_text())


@pytest.fixture(scope="module")
def victim(hostile, canary):
    info = hostile.api.create()
    r = hostile.api.http.put(f"/v1/sandboxes/{info['id']}/files/{canary.control_tag}.txt", content=canary.control_value.encode())
    assert r.status_code == 201, r.text
    yield info
    hostile.api.delete(info["id"])


@pytest.fixture(scope="module")
def scratch(hostile):
    """A second sandbox for probes that leave it running (A of probe 3, signals, airlock tricks,
    forged frames): creating one per probe would cost seconds each."""
    info = hostile.api.create()
    yield info
    hostile.api.delete(info["id"])


@pytest.fixture(scope="module")
def listeners(isolation):
    """Host listeners a probe must not reach, fresh per tier (a control leaves a connection
    queued on one)."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    abstract_name = "redteam-" + secrets.token_hex(6)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + abstract_name)
    abstract.listen(8)
    yield {"tcp": tcp, "udp": udp, "abstract": abstract, "abstract_name": abstract_name}
    for s in (tcp, udp, abstract):
        s.close()


def probe_params(server, sandbox_id: str, canary: Canary, image_info: dict, listeners: dict, scan: bool) -> dict:
    from sandbox.isolation import bwrap

    state = str(server.state_dir)
    package_trees = ["/usr"] + list(image_info.get("layers") or [image_info["venv"]])
    if image_info.get("python_copy"):
        package_trees += [image_info["python_prefix"], bwrap.PYTHON_MOUNT]
    ro_dirs = ["/", "/usr", "/etc", "/opt", "/opt/sandbox-kernel", image_info["venv"]]
    if image_info.get("python_copy"):
        ro_dirs.append(image_info["python_prefix"])
    binary = bwrap.discover()
    return {
        "mark": RESULT_MARK,
        "scan": scan,
        "needles": {"canary": veil(canary.value), "token": veil(server.token), "control": veil(canary.control_value)},
        "name_needles": [canary.tag, canary.control_tag],
        "content_skip": package_trees,
        "host_files": ["/etc/shadow", f"/root/{canary.filename}", f"/tmp/{canary.filename}", f"{state}/{canary.filename}",
                       f"{state}/server.json"],
        "host_only_files": [f"/tmp/{canary.filename}", f"{state}/{canary.filename}"],
        "host_dirs": ["/sys", "/var/lib/sandbox-kernel", state, f"{state}/sandboxes"],
        "ro_dirs": ro_dirs,
        "tcp_port": listeners["tcp"].getsockname()[1],
        "udp_port": listeners["udp"].getsockname()[1],
        "server_port": server.port,
        "abstract_name": listeners["abstract_name"],
        "control_socket": f"{state}/sandboxes/{sandbox_id}/control.sock",
        "host_bwrap": binary.path if binary else "/usr/bin/bwrap",
    }


@pytest.fixture(scope="module")
def probe(hostile, victim, canary, image_info, listeners) -> dict:
    """The batch of in-sandbox probes, run once in the protected victim sandbox."""
    params = probe_params(hostile, victim["id"], canary, image_info, listeners, scan=True)
    return hostile.api.run_json(victim["id"], probe_cell(params), timeout_seconds=240)


@pytest.fixture(scope="module")
def control(open_server, canary, image_info, listeners) -> dict:
    """The same batch in a sandbox whose server runs without seccomp."""
    info = open_server.api.create()
    assert info["isolation"]["seccomp"] is False, info["isolation"]
    params = probe_params(open_server, info["id"], canary, image_info, listeners, scan=False)
    try:
        return open_server.api.run_json(info["id"], probe_cell(params), timeout_seconds=120)
    finally:
        open_server.api.delete(info["id"])


# ============================================================ probes 1 and 2


def test_p01_host_secrets_unreachable(hostile, victim, probe, canary, image_info, isolation):
    from sandbox.isolation import bwrap

    # control: the needles are real and findable where they live
    environ = pathlib.Path(f"/proc/{hostile.proc.pid}/environ").read_bytes()
    assert canary.value.encode() in environ and hostile.token.encode() in environ
    for path in canary.files:
        assert canary.value in path.read_text()
    # control: the walk inside finds the needle planted in the workspace, by name and content
    control_path = f"/workspace/{canary.control_tag}.txt"
    scan = probe["scan"]
    assert scan["names"] == [control_path], scan["names"]
    assert scan["content"] == {"control": [control_path]}, scan["content"]
    assert scan["files_read"] >= 20, scan  # /etc, /opt, /tmp, /workspace: the rest is package trees

    assert probe["environ_hits"] == [] and "SECRET_CANARY" not in probe["environ_keys"]
    assert set(probe["environ_keys"]) <= SANDBOX_ENV, set(probe["environ_keys"]) - SANDBOX_ENV
    for pid, entry in probe["procs"].items():
        assert entry.get("cmdline_hits", []) == [] and entry.get("environ_hits", []) == [], (pid, entry)
        assert "SECRET_CANARY" not in entry.get("environ_keys", []), (pid, entry)
    # the walk skipped the read-only package trees: their mounts must be exactly the image's
    expected_mounts = {"/", "/usr", "/etc/fonts", "/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types",
                       "/etc/ssl/certs", "/etc/passwd", "/etc/group", "/proc", "/dev", "/dev/pts", "/dev/shm", "/tmp",
                       "/opt/sandbox-kernel", "/opt/sandbox-kernel-mpl", "/workspace"}
    expected_mounts |= {f"/dev/{d}" for d in ("null", "zero", "full", "random", "urandom", "tty", "console")}
    expected_mounts |= set(image_info.get("layers") or [image_info["venv"]])
    if image_info.get("python_copy"):  # bwrap: at a neutral path, the host's prefix a link to it
        expected_mounts.add(image_info["python_prefix"] if isolation == "gvisor" else bwrap.PYTHON_MOUNT)
    if isolation == "gvisor":
        expected_mounts |= GVISOR_ONLY_MOUNTS
    mountpoints = {mp for _, mp in probe["mounts"]}
    assert mountpoints <= expected_mounts, mountpoints - expected_mounts
    state = str(hostile.state_dir)
    for root, mp in probe["mounts"]:
        assert root not in (state, f"{state}/sandboxes", "/root", "/home", "/etc"), (root, mp)
    # the host's private places
    assert failed_with(probe["read"]["/etc/shadow"], "FileNotFoundError", "ENOENT")
    for d in ("/home", "/var/lib/sandbox-kernel", state, f"{state}/sandboxes"):
        assert failed_with(probe["ls"][d], "FileNotFoundError", "ENOENT"), (d, probe["ls"][d])
    assert failed_with(probe["read"][f"{state}/{canary.filename}"], "FileNotFoundError", "ENOENT")
    # /root exists only as the parent of the interpreter copy's mount point
    root_ls = probe["ls"]["/root"]
    if image_info.get("python_copy") and image_info["python_prefix"].startswith("/root/"):
        assert root_ls["ok"] and root_ls["value"] == [image_info["python_prefix"].split("/")[2]], root_ls
    else:
        assert failed_with(root_ls, "FileNotFoundError", "ENOENT"), root_ls
    outcome(1, "host env and secrets", f"0 hits for canary/token in env, {len(probe['procs'])} procs and "
            f"{scan['files_read']} files read ({scan['unreadable']} unreadable); control needle found at {control_path}")


def test_p01_no_inherited_fd_reaches_the_host(hostile, probe, canary):
    # control: on the host, an O_PATH fd to a deep directory walks up to the canary
    fd = os.open(str(hostile.state_dir / "images" / "default"), os.O_PATH | os.O_DIRECTORY)
    try:
        route = f"/proc/self/fd/{fd}/" + "../" * 24 + f"tmp/{canary.filename}"
        assert canary.value in pathlib.Path(route).read_text()
    finally:
        os.close(fd)
    assert probe["fd_escapes"] == [], probe["fd_escapes"]
    # what the runtime may hold: /dev/null, pipes, its channel socket, and its log (a regular file)
    host_paths = {fd: target for fd, target in probe["own_fds"].items() if target.startswith("/")
                  and not target.startswith(("/dev/", "/proc/")) and not target.endswith("/runtime.log")}
    assert host_paths == {}, host_paths
    outcome(1, "inherited fds", f"no fd of any sandbox process leads out; runtime fds: "
            f"{sorted(probe['own_fds'].values())}")


def test_p02_host_files_invisible(hostile, victim, probe, canary, image_info, isolation):
    # control: the host reads them
    assert pathlib.Path("/etc/shadow").read_bytes()
    host_top = set(os.listdir("/"))
    for path in (f"/root/{canary.filename}", f"/tmp/{canary.filename}"):
        assert canary.value in pathlib.Path(path).read_text()
        assert failed_with(probe["read"][path], "FileNotFoundError", "ENOENT"), (path, probe["read"][path])
    assert failed_with(probe["read"]["/etc/shadow"], "FileNotFoundError", "ENOENT")
    expected_top = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp", "workspace", "opt"}
    for path in [image_info["venv"], *(image_info.get("layers") or []),
                 image_info["python_prefix"] if image_info.get("python_copy") else "/usr"]:
        expected_top.add(path.strip("/").split("/")[0])
    expected_etc = {"fonts", "group", "ld.so.cache", "localtime", "mime.types", "passwd", "ssl"}
    if isolation == "gvisor":
        expected_top |= {m.strip("/") for m in GVISOR_ONLY_MOUNTS}
        expected_etc |= GVISOR_ONLY_ETC
    elif victim["isolation"].get("rootfs_version"):
        expected_top |= PINNED_BWRAP_TOP
        expected_etc |= PINNED_BWRAP_ETC
    top = set(probe["top"])
    assert top <= expected_top, top - expected_top
    assert not host_top <= expected_top  # the host's own / is more than that
    assert set(probe["ls"]["/etc"]["value"]) <= expected_etc, probe["ls"]["/etc"]
    outcome(2, "host files", f"shadow/canaries ENOENT; / = {sorted(top)}")


# ================================================================== probe 3


def test_p03_other_sandbox_unreachable(hostile, victim, scratch, isolation):
    api = hostile.api
    a = scratch["id"]
    secret_name = f"secret-{secrets.token_hex(4)}.txt"
    own = api.run_json(a, f"""
import json, os, subprocess
open("/workspace/{secret_name}", "w").write("A-only")
subprocess.Popen(["sleep", "3141"], start_new_session=True)
print({RESULT_MARK!r} + json.dumps({{"read": open("/workspace/{secret_name}").read(), "pid": os.getpid()}}))
""")
    assert own["read"] == "A-only"  # control: A sees its own file
    procs = cgroup_file(a, "cgroup.procs")
    if isolation == "gvisor":
        # A's runtime and sleep are the Sentry's processes, not the host's: A's host processes
        # are runsc's own (the sandbox with its Sentry, the gofer, the ptrace stubs)
        a_host = [int(p) for p in procs.read_text().split()]
        assert any("runsc" in command(p) for p in a_host), {p: command(p) for p in a_host}
    else:
        a_sleep = [int(p) for p in procs.read_text().split() if command(int(p)) == "sleep 3141"]
        assert len(a_sleep) == 1
        a_host = [host_runtime_pid(a), a_sleep[0]]
    for pid in a_host:
        os.kill(pid, 0)  # control: the host can signal them
    a_host_path = hostile.state_dir / "sandboxes" / a / "workspace" / secret_name
    assert a_host_path.read_text() == "A-only"
    state = hostile.state_dir
    b = api.run_json(victim["id"], f"""
import glob, json, os
def attempt(fn):
    try:
        return ["ok", fn()]
    except OSError as e:
        return [type(e).__name__, e.errno]
paths = ["/workspace/{secret_name}", "/workspace/../{secret_name}", "/tmp/{secret_name}",
         "{state}/sandboxes/{a}/workspace/{secret_name}", "/workspace/../../..{state}/sandboxes/{a}/workspace/{secret_name}",
         "/proc/self/root/../../..{state}/sandboxes/{a}/workspace/{secret_name}"]
pids = sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int)
out = {{
    "paths": {{p: attempt(lambda p=p: open(p).read()) for p in paths}},
    "globs": glob.glob("/proc/*/root/workspace/{secret_name}") + glob.glob("/proc/*/cwd/{secret_name}")
             + [os.path.join(d, f) for top in ("/workspace", "/tmp", "/opt") for d, _, fs in os.walk(top)
                for f in fs if f == "{secret_name}"],
    "pids": pids,
    "cmdlines": [open(f"/proc/{{p}}/cmdline", "rb").read().replace(b"\\0", b" ").decode() for p in pids],
    "kill": {{str(pid): attempt(lambda pid=pid: os.kill(pid, 0)) for pid in {a_host!r}}},
}}
print({RESULT_MARK!r} + json.dumps(out))
""")
    for path, result in b["paths"].items():
        assert result == ["FileNotFoundError", errno.ENOENT], (path, result)
    assert b["globs"] == []
    assert not any("3141" in c for c in b["cmdlines"]), b["cmdlines"]
    assert len(b["pids"]) <= 3, b  # bwrap's init (none under gVisor), the runtime, at most the glob's helper
    for pid in a_host:
        assert str(pid) not in b["pids"], "a host pid of A collides with a pid of B's namespace"
        assert b["kill"][str(pid)] == ["ProcessLookupError", errno.ESRCH], b["kill"]
    r = api.http.get(f"/v1/sandboxes/{victim['id']}/files/{secret_name}")
    assert r.status_code == 404, r.text
    outcome(3, "other sandbox", f"A's file ENOENT by {len(b['paths'])} paths, B sees pids {b['pids']}, "
            f"kill(A's host pids {a_host}) -> ESRCH")


# ================================================================== probe 4


def test_p04_writes_outside_workspace(probe, isolation):
    writes = probe["write"]
    assert writes["/workspace"] == {"ok": True, "value": "written"}  # control: the probe can write
    assert writes["/tmp"] == {"ok": True, "value": "written"}
    blocked = {d: r for d, r in writes.items() if d not in ("/workspace", "/tmp")}
    # bwrap: read-only binds (EROFS). gVisor: the same read-only root, but the code is not
    # root there, so the directories' modes refuse first (EACCES); mkdir / shows the EROFS
    refused = ("PermissionError", "EACCES") if isolation == "gvisor" else ("OSError", "EROFS")
    for d, r in blocked.items():
        assert failed_with(r, *refused), (d, r)
    assert failed_with(probe["mkdir_root"], "OSError", "EROFS")
    outcome(4, "writes outside /workspace", f"{refused[1]} on {sorted(blocked)}, mkdir / EROFS; /workspace and /tmp "
            "writable")


# ================================================================== probe 5


def test_p05_network(hostile, victim, probe, control, listeners, isolation):
    net, open_net = probe["net"], control["net"]
    if isolation == "gvisor":
        # no filter on the sandbox's calls: sockets are gVisor's netstack's, with only its own
        # loopback (--network=none); raw and packet sockets need a capability
        for name in ("tcp_host_listener", "tcp_server_port"):
            assert failed_with(net[name], "ConnectionRefusedError", "ECONNREFUSED"), (name, net[name])
        for name in ("tcp_outside", "udp_outside"):
            assert failed_with(net[name], "OSError", "EHOSTUNREACH"), (name, net[name])
        assert net["inet_stream"]["ok"] and net["inet6"]["ok"], net
        for name in ("raw", "packet"):
            assert failed_with(net[name], "PermissionError", "EPERM"), (name, net[name])
        assert net["udp_host_listener"]["ok"], net  # sent into its own loopback (checked below: not the host's)
    else:
        # blocked by the filter: no socket but AF_UNIX exists
        for name in ("inet_stream", "inet_dgram", "inet6", "raw", "netlink", "packet", "socketpair_inet",
                     "tcp_host_listener", "udp_host_listener", "tcp_server_port", "tcp_outside", "udp_outside"):
            assert failed_with(net[name], "OSError", "EAFNOSUPPORT"), (name, net[name])
    assert net["dns"]["exc"] == "gaierror" and net["dns"]["errno"] == socket.EAI_AGAIN, net["dns"]
    assert net["dns_localhost"]["exc"] == "gaierror", net["dns_localhost"]
    assert net["unix"] == {"ok": True, "value": "created"}
    assert failed_with(net["abstract_unix"], "ConnectionRefusedError", "ECONNREFUSED"), net["abstract_unix"]
    assert failed_with(net["control_socket"], "FileNotFoundError", "ENOENT"), net["control_socket"]
    # control without seccomp: sockets exist, but the private network namespace still has no way out
    assert open_net["inet_stream"]["ok"] and open_net["netlink"]["ok"], open_net
    assert failed_with(open_net["tcp_host_listener"], "ConnectionRefusedError", "ECONNREFUSED"), open_net
    assert failed_with(open_net["tcp_server_port"], "ConnectionRefusedError", "ECONNREFUSED"), open_net
    assert failed_with(open_net["tcp_outside"], "OSError", "ENETUNREACH"), open_net
    assert open_net["udp_host_listener"]["ok"], open_net  # sent into its own loopback ...
    # ... and nothing of either sandbox reached the host's listeners
    for sock in (listeners["tcp"], listeners["abstract"]):
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            sock.accept()
    listeners["udp"].setblocking(False)
    with pytest.raises(BlockingIOError):
        listeners["udp"].recvfrom(100)
    # control: the host reaches all of them
    with socket.create_connection(listeners["tcp"].getsockname(), timeout=5):
        listeners["tcp"].settimeout(5)
        listeners["tcp"].accept()[0].close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.sendto(b"host", listeners["udp"].getsockname())
        listeners["udp"].settimeout(5)
        assert listeners["udp"].recvfrom(100)[0] == b"host"
    with socket.socket(socket.AF_UNIX) as s:
        s.connect("\0" + listeners["abstract_name"])
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(hostile.state_dir / "sandboxes" / victim["id"] / "control.sock"))
    with socket.create_connection(("127.0.0.1", hostile.port), timeout=5):
        pass
    for family, kind, proto in ((socket.AF_NETLINK, socket.SOCK_RAW, 0), (socket.AF_PACKET, socket.SOCK_RAW, 0),
                                (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)):
        socket.socket(family, kind, proto).close()
    host_dns = "ok"
    try:
        socket.getaddrinfo("localhost", 80)
    except socket.gaierror as exc:
        host_dns = str(exc)
    assert host_dns == "ok"
    outcome(5, "network egress", f"inet socket {brief(net['inet_stream'])}, tcp {brief(net['tcp_host_listener'])}, "
            f"outside {brief(net['tcp_outside'])}, DNS EAI_AGAIN, abstract ECONNREFUSED, control socket ENOENT; without seccomp: tcp {brief(open_net['tcp_host_listener'])}, outside "
            f"{brief(open_net['tcp_outside'])}; host listeners received nothing")


# ================================================================== probe 6

BOMB = r"""
import json, os, signal, subprocess, sys, time
bomb = '''
import errno, json, os, time
errors, children, start, me = {}, 0, time.time(), os.getpid()
began = start
# at least 3 s; the first process goes on until its own fork is refused (a tree slowed by a
# loaded host reaches the limit later: gVisor's ptrace platform forks slowly), 40 s at most
while (time.time() - start < 3 or (os.getpid() == me and not errors)) and time.time() - began < 40:
    try:
        pid = os.fork()
    except OSError as e:
        key = type(e).__name__ + ":" + errno.errorcode.get(e.errno, str(e.errno))
        errors[key] = errors.get(key, 0) + 1
        time.sleep(0.01)
        continue
    if pid == 0:
        start = began = time.time()  # every child forks on: a real bomb
        continue
    children += 1
if os.getpid() == me:
    print(json.dumps({"errors": errors, "children": children}), flush=True)
    time.sleep(30)
'''
p = subprocess.Popen([sys.executable, "-c", bomb], stdout=subprocess.PIPE, text=True, start_new_session=True)
first = p.stdout.readline()
os.killpg(p.pid, signal.SIGKILL)
p.wait()
print(__MARK__ + first.strip())
""".replace("__MARK__", repr(RESULT_MARK))


def test_p06_fork_bomb_contained(hostile, victim, isolation):
    api = hostile.api
    bomb_sbx = api.create(pids=64)
    sid = bomb_sbx["id"]
    try:
        iso = bomb_sbx["isolation"]
        pids_current = cgroup_file(sid, "pids.current")
        pids_events = cgroup_file(sid, "pids.events")
        target = 60  # tasks in the cgroup that show the bomb at its limit
        if isolation == "gvisor":
            # The code's limit is the Sentry's RLIMIT_NPROC; the host cgroup, which counts gVisor's
            # own tasks (the Sentry's threads, the gofer, ptrace stubs), holds a ceiling above it.
            assert bomb_sbx["limits"]["pids"] == 64 and iso["pids"].startswith("gVisor's Sentry (RLIMIT_NPROC 64"), iso
            ceiling = iso["pids_host_ceiling"]
            assert int(cgroup_file(sid, "pids.max").read_text()) == ceiling > 64
            target = int(pids_current.read_text()) + 60  # each guest process has a host stub at least
        else:
            assert bomb_sbx["limits"]["pids"] == 64 and iso["pids"].startswith("cgroup"), iso
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(events=api.run(sid, BOMB, timeout_seconds=90)))
        worker.start()
        deadline = time.monotonic() + 30
        at_limit = 0  # the most tasks seen in the sandbox's cgroup
        while at_limit < target and time.monotonic() < deadline:
            try:
                at_limit = max(at_limit, int(pids_current.read_text()))
            except FileNotFoundError:  # the sandbox ended, and its cgroup with it
                break
            time.sleep(0.05)
        t0 = time.monotonic()
        health = httpx.get(hostile.url + "/v1/health", timeout=30)
        health_s = time.monotonic() - t0
        t0 = time.monotonic()
        other = api.run(victim["id"], "print(6 * 7)", timeout_seconds=30)
        other_s = time.monotonic() - t0
        worker.join(90)
        assert not worker.is_alive()
        assert health.status_code == 200 and health_s < 30
        assert stream_text(other) == "42\n" and done_of(other)["status"] == "ok" and other_s < 30
        events = result["events"]
        assert at_limit >= target, at_limit
        out = stream_text(events)
        assert RESULT_MARK in out, events
        report = json.loads(out.split(RESULT_MARK, 1)[1].splitlines()[0])
        assert set(report["errors"]) == {"BlockingIOError:EAGAIN"}, report
        hits = int(pids_events.read_text().split()[1])
        if isolation == "gvisor":
            # the Sentry refused the forks: gVisor's own tasks stayed under the host ceiling
            assert hits == 0 and at_limit < ceiling, (hits, at_limit, ceiling)
        else:
            assert hits > 0
        after = api.run(sid, "print('alive')")
        assert stream_text(after) == "alive\n" and done_of(after)["sandbox_state"] == "running"
        refused = (f"the Sentry refused {sum(report['errors'].values())} forks, host ceiling {ceiling} never reached"
                   if isolation == "gvisor" else f"cgroup refused {hits} forks")
        outcome(6, "fork bomb (pids 64)", f"{at_limit} {'host ' if isolation == 'gvisor' else ''}tasks at peak, fork -> "
                f"{report['errors']}, {refused}; during it health {health_s * 1000:.0f} ms, other sandbox execute "
                f"{other_s * 1000:.0f} ms")
    finally:
        api.delete(sid)


# ================================================================== probe 7


def test_p07_memory_bomb(hostile):
    api = hostile.api
    sid = api.create(memory_mb=256)["id"]
    try:
        events = api.run(sid, """
chunks = []
for i in range(64):
    chunks.append(b"\\x01" * (64 << 20))  # 64 MiB, every page written
    print(i, flush=True)
""", timeout_seconds=120)
        done = done_of(events)
        errors = of_type(events, "error")
        if errors and errors[0]["ename"] == "MemoryError":
            assert done["sandbox_state"] == "running", events
            assert stream_text(api.run(sid, "print('survived')")) == "survived\n"
            outcome(7, "memory bomb (256 MiB)", "MemoryError inside, sandbox survived")
            return
        assert [e["ename"] for e in errors] == ["SandboxDied"], events
        assert "out of memory" in errors[0]["evalue"] and "256 MiB" in errors[0]["evalue"], errors[0]
        assert done["reason"] == "oom" and done["sandbox_state"] == "dead" and done["status"] == "error", done
        r = api.http.get(f"/v1/sandboxes/{sid}")
        assert r.status_code == 410, r.text
        body = r.json()["error"]
        assert body["reason"] == "oom" and body["state"] == "dead" and "memory" in body["message"], body
        printed = stream_text(events).split()
        outcome(7, "memory bomb (256 MiB)", f"killed after {len(printed)} x 64 MiB chunks: {errors[0]['evalue']!r}; "
                f"GET -> 410 reason oom")
    finally:
        api.delete(sid)


# ================================================================== probe 8


def test_p08_tmp_and_workspace_caps(hostile, request):
    api = hostile.api
    info = api.create(disk_mb=16)
    sid = info["id"]
    disk = str(info["isolation"].get("disk", "none"))
    if disk.startswith("none"):
        request.node.add_marker(pytest.mark.xfail(strict=True, reason="workspace disk cap not enforced yet"))
    try:
        before = os.statvfs("/")
        result = api.run_json(sid, r"""
import errno, json, os
def fill(path, mib):
    n = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"\1" * (1 << 20))
                n += 1
            f.flush()
            os.fsync(f.fileno())
        return ["ok", n]
    except OSError as e:
        return [type(e).__name__, errno.errorcode.get(e.errno), n]
# three files under the per-file limit, so the tmpfs cap (not RLIMIT_FSIZE) is what stops them
tmp = [fill(f"/tmp/fill{i}.bin", 99) for i in range(3)]
for i in range(3):
    os.unlink(f"/tmp/fill{i}.bin")
ws = fill("/workspace/fill.bin", 256)
st = os.statvfs("/workspace")
print(__MARK__ + json.dumps({"tmp": tmp, "ws": ws, "ws_mib": st.f_blocks * st.f_frsize >> 20}))
""".replace("__MARK__", repr(RESULT_MARK)), timeout_seconds=120)
        after = os.statvfs("/")
        used_mib = ((before.f_bavail - after.f_bavail) * before.f_frsize) / MiB
        assert result["tmp"][0] == ["ok", 99] and result["tmp"][1] == ["ok", 99], result
        assert result["tmp"][2][:2] == ["OSError", "ENOSPC"], result
        tmp_total = 99 * 2 + result["tmp"][2][2]
        assert tmp_total <= 256, result
        outcome(8, "disk fill", f"/tmp ENOSPC after {tmp_total} MiB; /workspace ({disk}) -> {result['ws']}; host free "
                f"space fell {used_mib:.0f} MiB while the file was kept")
        assert result["ws"][:2] == ["OSError", "ENOSPC"], result
        assert result["ws"][2] <= 16, result
        assert used_mib < 128, used_mib
    finally:
        api.delete(sid)
    # nothing of the fill stays on the host once the sandbox is deleted
    assert sid not in pathlib.Path("/proc/self/mountinfo").read_text(), "the workspace is still mounted after DELETE"
    left = sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(hostile.state_dir / "sandboxes" / sid)
               for f in fs)
    assert left < MiB, f"{left} bytes left in the deleted sandbox's directory"
    final = os.statvfs("/")
    print(f"host free space after DELETE: {(final.f_bavail - before.f_bavail) * before.f_frsize / MiB:+.0f} MiB vs before; "
          f"{left} bytes left in its directory")


# ================================================================== probe 9


def test_p09_output_flood(hostile, victim):
    api = hostile.api
    limit = victim["limits"]["output_bytes"]
    rss_before = vm_rss_kib(hostile.proc.pid)
    events = api.run(victim["id"], """
import sys
block = ("x" * 1023 + "\\n") * 1024  # 1 MiB
for _ in range(50):
    sys.stdout.write(block)
print("END-OF-FLOOD")
""", timeout_seconds=120)
    rss_after = vm_rss_kib(hostile.proc.pid)
    done = done_of(events)
    out, err = stream_text(events), stream_text(events, "stderr")
    assert done["status"] == "ok" and done["truncated"] is True, done
    assert 0 < len(out.encode()) <= limit, len(out)
    assert "END-OF-FLOOD" not in out
    assert "truncated" in err and str(limit) in err, err
    assert len(err) < 1024, err[:200]
    growth_mib = (rss_after - rss_before) / 1024
    assert growth_mib < 200, (rss_before, rss_after)
    outcome(9, "output flood (50 MiB)", f"client got {len(out.encode())} bytes (cap {limit}), notice {err.strip()!r}; "
            f"server RSS {rss_before // 1024} -> {rss_after // 1024} MiB")


# ================================================================= probe 10


def test_p10_cpu_hog_timeout(hostile, victim):
    api = hostile.api
    assert done_of(api.run(victim["id"], "kept = 41"))["status"] == "ok"
    t0 = time.monotonic()
    events = api.run(victim["id"], "while True:\n    pass", timeout_seconds=2)
    elapsed = time.monotonic() - t0
    done = done_of(events)
    errors = of_type(events, "error")
    assert [e["ename"] for e in errors] == ["TimeoutError"], events
    assert done["reason"] == "timeout_interrupted" and done["sandbox_state"] == "running", done
    assert elapsed < 30
    after = api.run(victim["id"], "kept + 1")
    assert of_type(after, "execute_result")[0]["data"]["text/plain"] == "42"
    outcome(10, "CPU hog, timeout 2 s", f"TimeoutError after {elapsed:.1f} s, reason timeout_interrupted, state kept")


# ================================================================= probe 11


SIGNAL_ATTEMPT = """
import json, os, signal
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return [type(e).__name__, e.errno]
"""


def test_p11_signals_to_host_processes(hostile, victim, scratch, sandbox_server, isolation):
    api = hostile.api
    sid = scratch["id"]
    targets = [hostile.proc.pid] + ([sandbox_server.proc.pid] if sandbox_server.proc else []) + [os.getpid()]
    for pid in targets:
        os.kill(pid, 0)  # control: alive and signalable from the host
    result = api.run_json(sid, SIGNAL_ATTEMPT + f"""
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out = {{"pids": pids, "kill": {{}}}}
for pid in {targets!r}:
    out["kill"][str(pid)] = [attempt(lambda: os.kill(pid, 0)), attempt(lambda: os.kill(pid, signal.SIGKILL))]
print({RESULT_MARK!r} + json.dumps(out))
""")
    for pid in targets:
        assert pid not in result["pids"], f"host pid {pid} exists in the sandbox's pid namespace: inconclusive"
        assert result["kill"][str(pid)] == [["ProcessLookupError", errno.ESRCH]] * 2, result
    # kill(1) and kill(-1), in a sandbox of their own: under gVisor the runtime is pid 1 of
    # the sandbox's namespace and they end it (its own sandbox only, which any cell can end)
    own = api.create()["id"]
    try:
        events = api.run(own, SIGNAL_ATTEMPT + f"""
out = {{"init_kill": attempt(lambda: os.kill(1, signal.SIGKILL)), "all_kill": attempt(lambda: os.kill(-1, signal.SIGKILL))}}
out["init_alive"] = os.path.exists("/proc/1")
print({RESULT_MARK!r} + json.dumps(out))
""")
        if isolation == "gvisor":
            assert done_of(events)["sandbox_state"] == "dead", events
            result.update(init_kill="ends its own sandbox", all_kill="-")
        else:
            result.update(json.loads(stream_text(events).split(RESULT_MARK, 1)[1].splitlines()[0]))
            assert result["init_alive"] is True
            assert stream_text(api.run(own, "print('alive')")) == "alive\n"
    finally:
        api.delete(own)
    for pid in targets:
        os.kill(pid, 0)  # still alive
    assert httpx.get(hostile.url + "/v1/health", timeout=10).status_code == 200
    again = api.run(sid, "print('still here')")
    assert stream_text(again) == "still here\n" and done_of(again)["sandbox_state"] == "running"
    assert stream_text(api.run(victim["id"], "print('victim ok')")) == "victim ok\n"
    outcome(11, "signals to host processes", f"kill(server/test pids) -> ESRCH; kill(1, SIGKILL) -> "
            f"{result['init_kill']} (dropped by the kernel), kill(-1, SIGKILL) -> {result['all_kill']}; sandbox, "
            "server and others unharmed")


# ========================================================= probes 12 to 16


@pytest.mark.bwrap_only(reason="checks bwrap's seccomp filter on the host kernel: under gVisor ptrace is the "
                        "Sentry's own, between the sandbox's own processes (attach 0), process_vm_readv is not "
                        "implemented (ENOSYS), and no host process is in its pid namespace (probe 11)")
def test_p12_ptrace_and_process_vm(probe, control):
    assert probe["ptrace_attach"] == {"ret": -1, "errno": "EPERM"}, probe["ptrace_attach"]
    assert probe["process_vm_readv"] == {"ret": -1, "errno": "EPERM"}, probe["process_vm_readv"]
    # control: without seccomp the same calls work
    assert control["ptrace_attach"] == {"ret": 0, "errno": None}, control["ptrace_attach"]
    assert control["process_vm_readv"] == {"ret": 8, "errno": None}, control["process_vm_readv"]
    outcome(12, "ptrace, process_vm_readv", "EPERM both (without seccomp: attach 0, readv 8 bytes)")


def test_p13_proc_sys_dev(hostile, probe, control, isolation):
    procs = probe["procs"]
    gvisor = isolation == "gvisor"
    # bwrap: its init (pid 1) and the runtime; gVisor: the runtime is pid 1 of its namespace
    assert set(procs) == ({"1"} if gvisor else {"1", "2"}), {p: e.get("cmdline") for p, e in procs.items()}
    if not gvisor:
        assert set(procs["1"]["environ_keys"]) <= {"PATH", "LD_LIBRARY_PATH"}, procs["1"]
    assert set(procs[max(procs, key=int)]["environ_keys"]) <= SANDBOX_ENV, procs
    for entry in procs.values():
        assert "sandbox.supervisor" not in entry["cmdline"] and "sandbox serve" not in entry["cmdline"], entry
    # kernel interfaces: closed inside, open to the host (control)
    # gVisor's /proc is the Sentry's: it has no kmsg nor kallsyms at all
    if gvisor:
        assert failed_with(probe["kmsg"], "FileNotFoundError", "ENOENT"), probe["kmsg"]
        assert failed_with(probe["kallsyms"], "FileNotFoundError", "ENOENT"), probe["kallsyms"]
    else:
        assert failed_with(probe["kmsg"], "PermissionError", "EACCES"), probe["kmsg"]
        assert probe["kallsyms"] == {"ok": True, "value": "0000000000000000"}, probe["kallsyms"]
    open("/proc/kmsg", "rb").close()
    assert int(open("/proc/kallsyms").readline().split()[0], 16) != 0
    assert failed_with(probe["sysctl_write"], "PermissionError", "EACCES"), probe["sysctl_write"]
    open("/proc/sys/kernel/hostname", "w").close()  # opened, nothing written
    if gvisor:  # gVisor's own sysfs (GVISOR_ONLY_MOUNTS), never the host's
        assert probe["ls"]["/sys"]["ok"] and ["/", "/sys"] in probe["mounts"], probe["ls"]["/sys"]
    else:
        assert failed_with(probe["ls"]["/sys"], "FileNotFoundError", "ENOENT"), probe["ls"]["/sys"]
    assert os.listdir("/sys")
    kcore = "absent on this kernel (host too)"
    if os.path.exists("/proc/kcore"):
        assert not probe["kcore"]["ok"], probe["kcore"]
        kcore = brief(probe["kcore"])
    dev = set(probe["ls"]["/dev"]["value"])
    assert dev <= minimal_dev(isolation), dev - minimal_dev(isolation)
    assert not set(os.listdir("/dev")) <= minimal_dev(isolation)
    outcome(13, "/proc, /sys, /dev", f"pids {sorted(procs)}, kmsg {brief(probe['kmsg'])}, kallsyms "
            f"{brief(probe['kallsyms'])}, sysctl EACCES, /sys {brief(probe['ls']['/sys'])}, "
            f"kcore {kcore}, /dev = {sorted(dev)}")


def test_p13_cmdlines_name_no_host_path(hostile, probe, image_info):
    """bwrap's pid 1 shares bwrap's command line: its options (host sources of every mount, the
    sandbox's own directory) must reach it through --args, not argv."""
    state = str(hostile.state_dir)
    mounted = [image_info["venv"], *(image_info.get("layers") or [])]  # the image's sandbox paths
    leaking = {}
    for pid, entry in probe["procs"].items():
        line = entry["cmdline"]
        for path in mounted:  # the sandbox sees these paths anyway (its interpreter)
            line = line.replace(path, "")
        if state in line:
            leaking[pid] = entry["cmdline"]
    assert leaking == {}, leaking
    outcome(13, "host paths in command lines", f"none: {sorted(e['cmdline'][:60] for e in probe['procs'].values())}")


def on_pinned_root(victim: dict, isolation: str) -> bool:
    """The sandbox runs on its image's pinned root (gVisor; bwrap unless the server keeps the
    host's /usr with bwrap_system=host): the host's su, mount, unshare are not in it."""
    return isolation == "gvisor" or bool(victim["isolation"].get("rootfs_version"))


def test_p14_setuid_and_capabilities(probe, victim, isolation):
    gvisor = isolation == "gvisor"
    if gvisor:  # uid 0 exists in gVisor's namespace, but the code has no CAP_SETUID
        assert failed_with(probe["setuid0"], "PermissionError", "EPERM"), probe["setuid0"]
    else:
        assert failed_with(probe["setuid0"], "OSError", "EINVAL"), probe["setuid0"]  # uid 0 is not mapped in here
    assert failed_with(probe["setgroups0"], "PermissionError", "EPERM"), probe["setgroups0"]
    # control: the same command on the host gives uid 0
    host_su = subprocess.run(["su", "root", "-c", "id -u"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert host_su.stdout.strip() == "0", host_su
    su, mount_bin, bins = probe["su"], probe["mount_bin"], probe["setuid_bins"]
    if on_pinned_root(victim, isolation):
        # the image's own root carries no su, sudo, mount nor any setuid binary
        for name in ("su", "sudo", "mount_bin"):
            assert failed_with(probe[name], "FileNotFoundError", "ENOENT"), (name, probe[name])
        assert bins == {}, bins
    else:
        assert su["ok"] and su["value"]["rc"] != 0 and su["value"]["out"].strip() != "0", su
        assert mount_bin["ok"] and mount_bin["value"]["rc"] != 0, mount_bin
        if shutil.which("sudo"):
            assert not probe["sudo"]["ok"] or probe["sudo"]["value"]["rc"] != 0, probe["sudo"]
        assert "/usr/bin/su" in bins and os.stat("/usr/bin/su").st_uid == 0
        assert set(bins.values()) == {65534}, bins  # owned by an unmapped uid: setuid would not reach root
    caps = probe["caps"]
    # gVisor's /proc/self/status has no CapAmb nor NoNewPrivs line; its Seccomp is 0: the
    # filters are on the Sentry and the gofer, the code's calls go to the Sentry
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd") + (() if gvisor else ("CapAmb",)):
        assert caps[key] == ZERO_CAPS, caps
    if gvisor:
        assert caps["CapAmb"] is None and caps["NoNewPrivs"] is None and caps["Seccomp"] == "0", caps
    else:
        assert caps["NoNewPrivs"] == "1" and caps["Seccomp"] == "2", caps
    host_eff = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0]
    assert host_eff != ZERO_CAPS
    outcome(14, "setuid, capabilities", f"setuid(0) {brief(probe['setuid0'])}, su {brief(su)}, "
            f"{len(bins)} setuid binaries (owned by 65534), all cap sets 0; "
            f"sudo {'absent' if not shutil.which('sudo') else 'fails'}")


def test_p15_keyrings(probe, control, isolation):
    refused = {"ret": -1, "errno": "EACCES" if isolation == "gvisor" else "EPERM"}  # gVisor's keyrings: no access
    assert probe["keyctl"] == refused, probe["keyctl"]
    assert probe["add_key"] == refused, probe["add_key"]
    assert control["keyctl"]["ret"] > 0 and control["add_key"]["ret"] > 0, (control["keyctl"], control["add_key"])
    ret, err = libc_syscall(250, 0, ctypes.c_long(-3), 0)
    assert ret > 0, err
    outcome(15, "keyctl, add_key", f"{refused['errno']} both (without seccomp and on the host: a key serial)")


def test_p16_mount_and_namespaces(probe, control, victim, isolation):
    from sandbox.isolation import bwrap

    assert probe["mount"] == {"ret": -1, "errno": "EPERM"}, probe["mount"]
    cmd = probe["unshare_cmd"]
    if isolation == "gvisor":
        # New namespaces are the Sentry's own (no host kernel namespace code is reached), which
        # is what bwrap's filter and --disable-userns guard against: gVisor allows them.
        assert probe["unshare"] == {"ok": True, "value": {"user": "ok", "mnt": "ok", "net": "ok", "pid": "ok"}}, \
            probe["unshare"]
        assert failed_with(cmd, "FileNotFoundError", "ENOENT"), cmd  # no unshare in the image's root
    else:
        assert probe["unshare"] == {"ok": True, "value": {"user": "EPERM", "mnt": "EPERM", "net": "EPERM",
                                                          "pid": "EPERM"}}, probe["unshare"]
        if on_pinned_root(victim, isolation):
            assert failed_with(cmd, "FileNotFoundError", "ENOENT"), cmd  # no unshare in the image's root
        else:
            assert cmd["ok"] and cmd["value"]["rc"] == 1 and "Operation not permitted" in cmd["value"]["err"], cmd
    assert probe["bwrap_on_path"] == {"ok": True, "value": None}, probe["bwrap_on_path"]
    assert failed_with(probe["bwrap_host_path"], "FileNotFoundError", "ENOENT"), probe["bwrap_host_path"]
    # controls: without seccomp, --disable-userns still refuses a user namespace (another errno);
    # on the host the same things work
    assert control["unshare"]["value"]["user"] == "ENOSPC", control["unshare"]
    assert subprocess.run(["unshare", "-r", "true"]).returncode == 0
    binary = bwrap.discover()
    env = dict(os.environ, LD_LIBRARY_PATH=binary.libdir or "")
    assert subprocess.run([binary.path, "--version"], capture_output=True, env=env).returncode == 0
    target = tempfile.mkdtemp(prefix="redteam-mount-")
    try:
        ret, err = libc_syscall(165, b"none", target.encode(), b"tmpfs", 0, None)
        assert ret == 0, err
        libc_syscall(166, target.encode(), 0)  # umount2
    finally:
        os.rmdir(target)
    outcome(16, "mount, namespaces, bwrap", f"mount EPERM, unshare(user/mnt/net/pid) {probe['unshare']['value']}, "
            f"`unshare -r` {brief(cmd)}, bwrap not reachable; without seccomp unshare(user) -> {control['unshare']['value']['user']}")


# ================================================================= probe 17


def raw_request(port: int, token: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """HTTP with the path sent byte for byte (httpx would normalise it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Authorization": f"Bearer {token}"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_p17_airlock_path_tricks(hostile, scratch, isolation):
    api = hostile.api
    sid = scratch["id"]
    target = pathlib.Path(tempfile.mkdtemp(prefix="redteam-target-", dir="/tmp"))
    target.chmod(0o777)
    victim_file = target / "victim.txt"
    victim_file.write_text("original\n")
    try:
        assert api.http.put(f"/v1/sandboxes/{sid}/files/d/a.txt", content=b"hello").status_code == 201
        planted = api.run(sid, f"""
import os, shutil
os.symlink("/", "/workspace/rootlink")
os.symlink("/etc/passwd", "/workspace/passwd")
os.symlink("{target}", "/workspace/tgt")
os.symlink("{victim_file}", "/workspace/victim.txt")
os.mkfifo("/workspace/fifo")
shutil.rmtree("/workspace/d")
os.symlink("{target}", "/workspace/d")  # the directory of the last upload, now a link
""")
        assert done_of(planted)["status"] == "ok", planted
        # gVisor keeps a named pipe in the Sentry (its gofer makes no host FIFO): the host's
        # workspace has nothing by that name, so a PUT there is an ordinary new upload
        host_fifo = hostile.state_dir / "sandboxes" / sid / "workspace" / "fifo"
        assert stat.S_ISFIFO(os.lstat(host_fifo).st_mode) if isolation == "bwrap" else not host_fifo.exists()
        base = f"/v1/sandboxes/{sid}/files/"
        gets = ["rootlink/etc/passwd", "passwd", "tgt/victim.txt", "victim.txt", "fifo", "d/victim.txt", "d/a.txt",
                "%2e%2e/%2e%2e/etc/passwd", "..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "/etc/passwd", "a%00b",
                "../../../etc/passwd", "d%2F..%2F..%2Fspec.json", "..", ".", "%2e%2e", "rootlink/proc/self/environ"]
        puts = ["rootlink/tmp/redteam-evil", "tgt/victim.txt", "tgt/new.txt", "victim.txt", "d/victim.txt", "d/new.txt",
                "%2e%2e/evil", "..%2F..%2Fevil", "/tmp/evil", "passwd", "a%00b"]
        if isolation == "bwrap":
            puts.append("fifo")
        deletes = ["tgt/victim.txt", "d/victim.txt", "rootlink/etc/hostname", "%2e%2e/%2e%2e/etc/hostname"]
        host_passwd = pathlib.Path("/etc/passwd").read_bytes()[:32]
        statuses = {}
        for method, paths in (("GET", gets), ("PUT", puts), ("DELETE", deletes)):
            for p in paths:
                status, body = raw_request(hostile.port, hostile.token, method, base + p, b"EVIL" if method == "PUT" else None)
                statuses[f"{method} {p}"] = status
                assert 400 <= status < 500, (method, p, status, body[:200])
                assert host_passwd not in body and b"original" not in body, (method, p, body[:200])
        assert victim_file.read_text() == "original\n"
        assert sorted(os.listdir(target)) == ["victim.txt"]
        assert not pathlib.Path("/tmp/redteam-evil").exists() and not pathlib.Path("/tmp/evil").exists()
        # control: an ordinary upload and download work, and the listing shows the links as links
        assert api.http.put(f"/v1/sandboxes/{sid}/files/ok/b.txt", content=b"fine").status_code == 201
        assert api.http.get(f"/v1/sandboxes/{sid}/files/ok/b.txt").content == b"fine"
        kinds = {f["path"]: f["type"] for f in api.http.get(f"/v1/sandboxes/{sid}/files").json()["files"]}
        assert kinds["rootlink"] == kinds["d"] == "symlink", kinds
        assert kinds.get("fifo") == ("other" if isolation == "bwrap" else None), kinds
        codes = sorted(set(statuses.values()))
        outcome(17, "airlock path tricks", f"{len(statuses)} hostile requests -> {codes}; host target unchanged")
    finally:
        shutil.rmtree(target, ignore_errors=True)


# ================================================================= probe 18

FORGED_FRAME = json.dumps({"type": "done", "status": "ok", "execution_count": 999, "reason": None, "exec": "x1"}).encode()
FORGED = struct.pack(">I", len(FORGED_FRAME)) + FORGED_FRAME
# What an in-band sync marker would look like: output sync counts bytes (FIONREAD) and never
# scans the stream, so these bytes must come back as plain output.
FAKE_MARKER = b"\x00\x1bSBX-SYNC:" + b"0" * 32 + b"\n"


def test_p18_forged_frames_in_output(hostile, scratch):
    api = hostile.api
    sid = scratch["id"]
    count = done_of(api.run(sid, "pass"))["execution_count"]
    events = api.run(sid, FORGE + f"""
import errno, json, os, sys
forged, marker = {FORGED!r}, {FAKE_MARKER!r}
# the runtime's own channel (FORGE's `channel`) is spared here
fds = {{}}
for name in sorted(os.listdir("/proc/self/fd"), key=int):
    fd = int(name)
    if 3 <= fd <= 20 and fd != channel:
        try:
            os.write(fd, forged + marker)
            fds[fd] = "written"
        except OSError as e:
            fds[fd] = errno.errorcode.get(e.errno)
print(json.dumps(fds))
sys.stdout.flush()
os.write(1, b"A|" + forged + b"|" + marker + b"|")
os.write(2, b"B|" + forged + b"|" + marker + b"|")
sys.stdout.buffer.write(b"\\xff\\xfe")
sys.stdout.flush()
os.write(1, b"|\\xc3")
""")
    done = done_of(events)
    assert done["status"] == "ok" and done["execution_count"] == count + 1 and done["reason"] is None, done
    assert not of_type(events, "error"), events
    out, err = stream_text(events), stream_text(events, "stderr")
    first, rest = out.split("\n", 1)
    fds = json.loads(first)
    expected_out = (b"A|" + FORGED + b"|" + FAKE_MARKER + b"|\xff\xfe|\xc3").decode("utf-8", "replace")
    assert rest == expected_out, (rest, expected_out)
    assert err == (b"B|" + FORGED + b"|" + FAKE_MARKER + b"|").decode(), err
    assert "\ufffd\ufffd|\ufffd" in rest
    again = api.run(sid, "print('next')")
    assert stream_text(again) == "next\n" and done_of(again)["execution_count"] == count + 2
    assert httpx.get(hostile.url + "/v1/health", timeout=10).status_code == 200
    outcome(18, "forged frames in output", f"exact output back, real done (count {count + 1}), invalid UTF-8 -> "
            f"U+FFFD; fds written: {fds}")


def test_p18_channel_forgery_stays_inside_its_sandbox(hostile, victim, scratch):
    """The runtime's channel fd is the cell's own (same process): a cell can forge its own
    execute's events. What must hold is that nothing beyond its own sandbox's answers moves."""
    api = hostile.api
    sid = scratch["id"]
    events = api.run(sid, FORGE + """
os.write(channel, frame({"type": "stream", "exec": runtime.current, "name": "stdout", "text": "FORGED\\n"})
         + frame({"type": "done", "exec": runtime.current, "status": "ok", "execution_count": 999, "reason": None}))
print("real output")
""", timeout_seconds=30)
    forged_done = done_of(events)
    after = api.run(sid, "print('next')", timeout_seconds=30)
    assert stream_text(after) == "next\n" and done_of(after)["status"] == "ok", after
    assert stream_text(api.run(victim["id"], "print('victim ok')")) == "victim ok\n"
    assert httpx.get(hostile.url + "/v1/health", timeout=10).status_code == 200
    outcome(18, "forgery on the runtime channel", f"own execute answered {stream_text(events)!r} and done count "
            f"{forged_done['execution_count']} (forged); next execute, other sandboxes, server unaffected")


def test_p18_channel_garbage_is_reported_promptly(hostile):
    api = hostile.api
    sid = api.create()["id"]
    try:
        events = api.run(sid, FORGE + """
os.write(channel, b"\\x00\\x00\\x00\\x05hello")
print("after the garbage")
""", timeout_seconds=2)
        assert httpx.get(hostile.url + "/v1/health", timeout=10).status_code == 200
        done = done_of(events)
        evalues = " ".join(e["evalue"] for e in of_type(events, "error"))
        assert done["reason"] != "timeout_killed" and "ignored the interrupt" not in evalues, (done, evalues)
        # The runtime never sends a malformed frame: the sandbox is stopped and the cause named.
        assert done["reason"] == "protocol" and done["sandbox_state"] == "dead", done
        assert "protocol" in evalues, evalues
    finally:
        api.delete(sid)


# ================================================================= probe 19


def test_p19_nothing_outlives_delete(hostile, isolation):
    api = hostile.api
    sid = api.create()["id"]
    deleted = False
    try:
        events = api.run(sid, """
import os, shutil, signal, subprocess, time
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:  # the daemon: double-forked, own session, deaf to TERM and HUP
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        nohup = ["nohup"] if shutil.which("nohup") else []  # the gVisor root has none: sleep is deaf enough
        subprocess.Popen(nohup + ["sleep", "3333"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.execvp("python", ["python", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep(4444)"])
    os._exit(0)
os.waitpid(pid, 0)
subprocess.Popen(["sh", "-c", "trap '' TERM HUP; exec sleep 5555"])
time.sleep(1)
print("planted")
""")
        assert stream_text(events) == "planted\n", events
        supervisor = json.loads((hostile.state_dir / "sandboxes" / sid / "state.json").read_text())["supervisor_pid"]
        groups = cgroup_dirs(sid)
        assert groups, "no cgroup found for the sandbox"
        tracked = descendants(supervisor) | {supervisor}
        for group in groups:
            tracked |= {int(p) for p in (group / "cgroup.procs").read_text().split()}
        lines = {pid: command(pid) for pid in tracked}
        if isolation == "gvisor":
            # what the cell planted are the Sentry's processes: seen from inside; on the host,
            # the sandbox's processes are runsc's (run, gofer, the sandbox, its ptrace stubs)
            lines = dict(enumerate(stream_text(api.run(sid, "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():"
                                                           "\n        print(open(f'/proc/{p}/cmdline', 'rb').read()"
                                                           ".replace(b'\\0', b' ').decode())")).splitlines()))
            assert any("runsc" in command(pid) for pid in tracked), {pid: command(pid) for pid in tracked}
        # control: the walk found what the cell planted
        for needle in ("sleep 3333", "time.sleep(4444)", "sleep 5555"):
            assert any(needle in line for line in lines.values()), (needle, lines)
        alive = {proc_identity(pid) for pid in tracked} - {None}
        r = api.delete(sid)
        deleted = True
        assert r.status_code == 200 and r.json()["state"] == "deleted", r.text
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            survivors = {ident for ident in alive if proc_identity(ident[0]) == ident}
            if not survivors and not any(g.exists() for g in groups):
                break
            time.sleep(0.1)
        survivors = {ident for ident in alive if proc_identity(ident[0]) == ident}
        assert survivors == set(), {pid: command(pid) for pid, _ in survivors}
        assert [g for g in groups if g.exists()] == []
        assert sid not in pathlib.Path("/proc/self/mountinfo").read_text()
        outcome(19, "outliving DELETE", f"{len(alive)} host processes (supervisor, bwrap, runtime, daemon, nohup sleep, "
                f"TERM/HUP-deaf sleeps) all gone; {len(groups)} cgroup dirs removed")
    finally:
        if not deleted:
            api.delete(sid)


# ================================================================= probe 20


def test_p20_token_compared_in_constant_time():
    from sandbox.gateway import callers, relay, users
    from sandbox.service import auth

    rule = inspect.getsource(auth.check_bearer)
    assert "hmac.compare_digest(" in rule, rule
    # a user token's signature too (the gateway's user tokens)
    assert "hmac.compare_digest(" in inspect.getsource(users.verify)
    # the one rule, used by the node's middleware and the gateway (its relay and app, through
    # callers.identify), and no other compare
    for source in (rule, inspect.getsource(auth.Auth), inspect.getsource(relay), inspect.getsource(callers),
                   inspect.getsource(users)):
        assert not re.search(r"(given|token|expected|signature)\s*[!=]=", source), source
    assert "check_bearer(" in inspect.getsource(auth.Auth) and "check_bearer(" in inspect.getsource(callers.identify)
    assert "identify(" in inspect.getsource(relay)
    outcome(20, "constant-time token check", "check_bearer and user tokens use hmac.compare_digest (node, gateway "
            "relay and app), no == on a token")


def test_p20_token_file_is_private():
    from sandbox.common.paths import StateDir
    from sandbox.service.server import ensure_token

    state = support.make_state_dir("sk-redteam-token-")
    old = os.umask(0)  # the most permissive umask must not widen it
    try:
        token = ensure_token(StateDir(str(state)), "")
        mode = stat.S_IMODE(os.stat(state / "token").st_mode)
        assert mode == 0o600, oct(mode)
        assert (state / "token").read_text().strip() == token and len(token) >= 32
        assert ensure_token(StateDir(str(state)), "") == token  # read back, not regenerated
    finally:
        os.umask(old)
        shutil.rmtree(state, ignore_errors=True)
    outcome(20, "token file", "0600 even under umask 0")


def test_p20_no_public_listen_without_token():
    state = support.make_state_dir("sk-redteam-public-")
    try:
        r = subprocess.run([sys.executable, "-m", "sandbox", "serve", "--host", "0.0.0.0", "--port",
                            str(support.free_port()), "--state-dir", str(state)],
                           capture_output=True, text=True, timeout=60, env=support.server_env(None),
                           cwd=str(support.REPO))
        assert r.returncode == 2, r
        assert "refusing to listen on 0.0.0.0" in r.stderr and "explicit token" in r.stderr, r.stderr
        assert not (state / "token").exists() and not (state / "server.json").exists()
        # control: with a token the same command gets past that check (and stops at the next one,
        # a state dir under a 0700 directory, so that nothing listens)
        private = pathlib.Path(tempfile.mkdtemp(prefix="redteam-private-")) / "state"
        try:
            r2 = subprocess.run([sys.executable, "-m", "sandbox", "serve", "--host", "0.0.0.0", "--port",
                                 str(support.free_port()), "--state-dir", str(private)],
                                capture_output=True, text=True, timeout=60, env=support.server_env("t" * 32),
                                cwd=str(support.REPO))
        finally:
            shutil.rmtree(private.parent, ignore_errors=True)
        assert r2.returncode == 2 and "refusing to listen" not in r2.stderr and "cannot enter" in r2.stderr, r2.stderr
    finally:
        shutil.rmtree(state, ignore_errors=True)
    outcome(20, "0.0.0.0 without a token", f"exit 2: {r.stderr.strip().splitlines()[-1]!r}")


def test_p20_token_never_echoed_and_bodies_capped(hostile, victim):
    token = hostile.token
    url = hostile.url
    bodies: dict[str, httpx.Response] = {}
    with httpx.Client(base_url=url, timeout=30) as anon:
        bodies["401 missing"] = anon.get("/v1/sandboxes")
        wrong = token[:-1] + ("y" if token.endswith("x") else "x")  # the token itself one run in 64 when always "x"
        bodies["401 wrong"] = anon.get("/v1/sandboxes", headers={"Authorization": f"Bearer {wrong}"})
        bodies["401 prefix"] = anon.get("/v1/sandboxes", headers={"Authorization": f"Bearer {token[:8]}"})
    api = hostile.api.http
    bodies["404 sandbox"] = api.get("/v1/sandboxes/sbx-0000000000000000")
    bodies["404 route"] = api.get("/v1/nothing")
    bodies["405"] = api.put("/v1/health")
    bodies["400 json"] = api.post("/v1/sandboxes", content=b"{not json")
    bodies["422 field"] = api.post("/v1/sandboxes", json={"token": token})
    bodies["info"] = api.get("/v1/info")
    gone = hostile.api.create()["id"]
    hostile.api.delete(gone)
    bodies["410"] = api.get(f"/v1/sandboxes/{gone}")
    big = b'{"code": "' + b"x" * (2 * MiB) + b'"}'
    bodies["413 declared"] = api.post(f"/v1/sandboxes/{victim['id']}/execute", content=big)
    chunks = [big[i:i + 65536] for i in range(0, len(big), 65536)]
    bodies["413 chunked"] = api.post(f"/v1/sandboxes/{victim['id']}/execute", content=iter(chunks))
    expected = {"401 missing": 401, "401 wrong": 401, "401 prefix": 401, "404 sandbox": 404, "404 route": 404, "405": 405,
                "400 json": 400, "422 field": 422, "info": 200, "410": 410, "413 declared": 413, "413 chunked": 413}
    assert {k: r.status_code for k, r in bodies.items()} == expected
    for name, r in bodies.items():
        assert token not in r.text and token not in str(r.headers), name
        if r.status_code >= 400:
            assert set(r.json()) == {"error"} and r.json()["error"]["code"], (name, r.text)
    # an upload declared over the per-file cap is refused before a byte is stored
    with socket.create_connection(("127.0.0.1", hostile.port), timeout=30) as s:
        s.sendall(f"PUT /v1/sandboxes/{victim['id']}/files/huge.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                  f"Content-Length: {200 * MiB}\r\n\r\n".encode())
        head = s.recv(4096).decode(errors="replace")
    assert head.startswith("HTTP/1.1 413"), head
    # the log: written to (control), never the token
    log = hostile.log_text()
    assert "sandbox server on" in log
    assert token not in log
    outcome(20, "token never echoed; 413", f"{len(bodies)} responses (401/404/405/400/422/410/413/info) and "
            f"{len(log)} bytes of log free of the token; 2 MiB body -> 413 (declared and chunked), 200 MiB upload -> 413")


# ================================================================= probe 21


def test_p21_doctor_reports_each_protection(victim, isolation):
    r = subprocess.run([sys.executable, "-m", "sandbox", "doctor", "--json"], capture_output=True, text=True, timeout=60,
                       env=support.server_env(None), cwd=str(support.REPO))
    assert r.returncode == 0, r.stderr
    items = {i["name"]: i for i in json.loads(r.stdout)}
    for name in ("bubblewrap", "namespaces", "network", "seccomp", "memory limit", "pids limit", "cpu limit",
                 "cgroup version"):
        assert name in items, sorted(items)
    iso = victim["isolation"]
    if isolation == "gvisor":
        tier = items["gvisor tier (runsc)"]
        assert tier["status"] == "in force" and iso["runsc_version"] in tier["detail"], (tier, iso)
        assert iso["platform"] in tier["detail"], (tier, iso)
    else:
        assert f"bwrap {iso['bwrap_version']}" in items["bubblewrap"]["detail"]
        assert iso["seccomp"] is True
    for name in ("namespaces", "network", "seccomp"):
        assert items[name]["status"] == "in force", items[name]
    for ctrl in ("memory", "pids", "cpu"):
        if ctrl == "pids" and isolation == "gvisor":
            # The code's limit is the Sentry's own; the cgroup the doctor reports on is the
            # host ceiling above it for gVisor's tasks (docs/security.md, "pids under gVisor").
            assert str(iso["pids"]).startswith("gVisor's Sentry"), iso
            by_cgroup = iso.get("pids_host_ceiling") is not None
        else:
            by_cgroup = str(iso[ctrl]).startswith("cgroup")
        assert (items[f"{ctrl} limit"]["status"] == "in force") == by_cgroup, (items, iso)
    assert iso["cgroup"] in items["cgroup version"]["detail"], items["cgroup version"]
    text = subprocess.run([sys.executable, "-m", "sandbox", "doctor"], capture_output=True, text=True, timeout=60,
                          env=support.server_env(None), cwd=str(support.REPO)).stdout
    for name in items:
        assert re.search(rf"^\[(ok  |weak|MISS)\] {re.escape(name)}\s", text, re.M), (name, text)
    outcome(21, "doctor", "; ".join(f"{n}: {i['status']}" for n, i in items.items()))


def test_p21_missing_protection_refuses_to_start(open_server):
    state = support.make_state_dir("sk-redteam-refuse-")
    try:
        r = subprocess.run([sys.executable, "-m", "sandbox", "serve", "--no-seccomp", "--port", str(support.free_port()),
                            "--state-dir", str(state), "--pool-size", "0"], capture_output=True, text=True, timeout=120,
                           env=support.server_env("t" * 32), cwd=str(support.REPO))
        assert r.returncode == 2, r
        assert "[MISS] seccomp" in r.stderr and "refusing to start" in r.stderr, r.stderr
        assert "--allow-missing-protections" in r.stderr
        assert not (state / "server.json").exists()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    # control: the same flag with --allow-missing-protections starts, says so, and runs without the filter
    log = open_server.log_text()
    assert "WARNING: starting WITHOUT these protections" in log and "seccomp" in log
    info = open_server.api.create()
    try:
        assert info["isolation"]["seccomp"] is False
    finally:
        open_server.api.delete(info["id"])
    outcome(21, "missing protection", "serve --no-seccomp -> exit 2 'refusing to start'; with "
            "--allow-missing-protections it starts with a WARNING and isolation.seccomp false")
