"""Machinery for the red-team suite (tests/security/test_redteam.py).

The suite's own servers (one with planted secrets, one with seccomp off to show what the
filter stops), whose client returns a probe cell's result, host-side views that only the
red team needs, and the source of the probe cell that runs, unchanged, in a protected
sandbox and in the unprotected one. Servers, events and processes come from tests/support.py.
"""

from __future__ import annotations

import base64
import functools
import json
import pathlib
import typing as t

import httpx

import support

RESULT_MARK = "@@REDTEAM@@"
# what bwrap --dev provides (devices, the /proc/self/fd links, pts and shm)
MINIMAL_DEV = {"console", "core", "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
               "tty", "urandom", "zero"}
# gVisor's /dev is its own devtmpfs, served by the Sentry (no host device node behind it);
# its two extras are useless without capabilities (the sandbox has none, probe 14):
# /dev/net/tun needs CAP_NET_ADMIN, a FUSE mount through /dev/fuse CAP_SYS_ADMIN
GVISOR_DEV = MINIMAL_DEV | {"fuse", "net"}


def minimal_dev(isolation: str) -> set[str]:
    """The names a sandbox's /dev may hold under its tier."""
    return GVISOR_DEV if isolation == "gvisor" else MINIMAL_DEV


# ------------------------------------------------------------------ servers


class Api:
    """The probes' view of a server: events back, and a probe cell's one JSON result."""

    def __init__(self, http: httpx.Client):
        self.http = http

    def create(self, **fields) -> dict:
        return support.create(self.http, **fields)

    def delete(self, sandbox_id: str) -> httpx.Response:
        return self.http.delete(f"/v1/sandboxes/{sandbox_id}")

    def run(self, sandbox_id: str, code: str, **fields) -> list[dict]:
        return support.execute(self.http, sandbox_id, code, **fields)

    def run_json(self, sandbox_id: str, code: str, **fields) -> t.Any:
        """Run a probe cell that ends with ``emit(result)``; return the result."""
        events = self.run(sandbox_id, code, **fields)
        out = support.stream_text(events)
        assert RESULT_MARK in out, f"the probe cell printed no result: {events[-3:]}"
        return json.loads(out.split(RESULT_MARK, 1)[1].splitlines()[0])


class RedteamServer(support.Server):
    """A server of the suite's own, with no warm pool: every sandbox is one a probe made."""

    def __init__(self, state_dir: pathlib.Path, token: str, *args: str, **kwargs: t.Any):
        super().__init__(state_dir, "--pool-size", "0", *args, token=token, **kwargs)

    @functools.cached_property
    def api(self) -> Api:
        return Api(self.client(timeout=120))

    def close(self) -> None:
        self.api.http.close()  # no idle keep-alive connection for the graceful shutdown to wait on
        super().close()


# --------------------------------------------------------------- host views


def veil(secret: str) -> str:
    """A secret as the probe cell receives it: never the literal bytes, so that nothing the
    runtime stores of a cell's source (history, linecache) can be what a scan finds."""
    return base64.b64encode(bytes(b ^ 0x5A for b in secret.encode())).decode()


def cgroup_file(sandbox_id: str, name: str) -> pathlib.Path | None:
    for d in support.cgroup_dirs(sandbox_id):
        if (d / name).exists():
            return d / name
    return None


def vm_rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def host_runtime_pid(sandbox_id: str) -> int:
    """The host pid of a sandbox's Python runtime, found through its cgroup."""
    procs = cgroup_file(sandbox_id, "cgroup.procs")
    assert procs is not None, f"no cgroup for {sandbox_id}"
    pids = [int(p) for p in procs.read_text().split()]
    runtime = [p for p in pids if support.is_runtime(support.command(p))]
    assert len(runtime) == 1, {p: support.command(p) for p in pids}
    return runtime[0]


# ----------------------------------------------------------- the probe cell

# Runs unchanged in a protected sandbox and in one whose server has seccomp off; every
# probe records what happened (exception name and errno, or the value) rather than
# asserting, so the test decides and the control can show the same call succeeding.
PROBE_CELL = r'''
import base64, ctypes, errno, json, os, socket, stat, subprocess, sys, time
P = json.loads(__PARAMS__)
R = {}

def unveil(s):
    return bytes(b ^ 0x5A for b in base64.b64decode(s))

NEEDLES = {k: unveil(v) for k, v in P["needles"].items()}

def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except Exception as e:
        num = getattr(e, "errno", None)
        return {"ok": False, "exc": type(e).__name__, "errno": errno.errorcode.get(num, num) if num else None,
                "msg": str(e)[:300]}

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def syscall(*args):
    # syscall(2) is variadic: a bare Python int goes as a 32-bit int whose register's upper half
    # is whatever was there, and the kernel reads all 64 bits (process_vm_readv's flags then
    # came out nonzero now and then: EINVAL). Widen every argument to a long.
    ctypes.set_errno(0)
    ret = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return {"ret": ret, "errno": errno.errorcode.get(ctypes.get_errno()) if ret < 0 else None}

def hits(data):
    return sorted(name for name, needle in NEEDLES.items() if needle in data)

# ---- probe 1: environment, processes, files
R["environ_hits"] = hits("\n".join(f"{k}={v}" for k, v in os.environ.items()).encode())
R["environ_keys"] = sorted(os.environ)
procs = {}
for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    entry = {}
    for what in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                data = f.read()
            entry[what + "_hits"] = hits(data)
            if what == "cmdline":
                entry["cmdline"] = data.replace(b"\0", b" ").decode(errors="replace").strip()
            else:
                entry["environ_keys"] = sorted({kv.split(b"=", 1)[0].decode(errors="replace") for kv in data.split(b"\0") if kv})
        except OSError as e:
            entry[what] = errno.errorcode.get(e.errno)
    procs[pid] = entry
R["procs"] = procs

def walk_and_read(roots, skip, content_skip, max_size=1 << 20):
    names, content, read, unreadable = [], {}, 0, 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
            for name in dirnames + filenames:
                if any(n in name for n in P["name_needles"]):
                    names.append(os.path.join(dirpath, name))
            if any(dirpath == c or dirpath.startswith(c.rstrip("/") + "/") for c in content_skip):
                continue
            for name in filenames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                    if not stat.S_ISREG(st.st_mode) or st.st_size > max_size:
                        continue
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    unreadable += 1
                    continue
                read += 1
                for h in hits(data):
                    content.setdefault(h, []).append(path)
    return {"names": names, "content": content, "files_read": read, "unreadable": unreadable}

if P["scan"]:
    R["scan"] = walk_and_read(["/"], {"/proc", "/sys"}, P["content_skip"])
R["mounts"] = []
with open("/proc/self/mountinfo") as f:
    for line in f:
        fields = line.split()
        R["mounts"].append([fields[3], fields[4]])

# ---- probe 2: host files and the tree
R["read"] = {p: attempt(lambda p=p: open(p, "rb").read(64).decode("latin-1")) for p in P["host_files"]}
R["top"] = sorted(os.listdir("/"))
R["ls"] = {d: attempt(lambda d=d: sorted(os.listdir(d)))
           for d in ["/root", "/etc", "/home", "/var", "/dev", "/opt"] + P["host_dirs"]}

# ---- leaked descriptors: any fd of any process here that leads out of the sandbox's tree
escapes = []
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        for route in (f"/proc/{pid}/fd/{fd}/" + "../" * 24, f"/proc/{pid}/fd/{fd}/"):
            for target in P["host_only_files"]:
                try:
                    with open(route + target.lstrip("/"), "rb") as f:
                        f.read(1)
                    escapes.append(route + target.lstrip("/"))
                except OSError:
                    pass
R["fd_escapes"] = escapes
R["own_fds"] = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        R["own_fds"][fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass

# ---- probe 4: writes outside /workspace
def write_in(d):
    path = os.path.join(d, ".redteam-write-probe")
    with open(path, "w") as f:
        f.write("x")
    os.unlink(path)
    return "written"
R["write"] = {d: attempt(lambda d=d: write_in(d)) for d in P["ro_dirs"] + ["/workspace", "/tmp"]}
R["mkdir_root"] = attempt(lambda: os.mkdir("/redteam-dir"))

# ---- probe 5: network
def tcp(host, port, timeout=3):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((host, port))
        return "connected"
    finally:
        s.close()
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        return s.sendto(b"redteam-udp", (host, port))
    finally:
        s.close()
def unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(path)
        return "connected"
    finally:
        s.close()
def make(family, kind, proto=0):
    socket.socket(family, kind, proto).close()
    return "created"
R["net"] = {
    "tcp_host_listener": attempt(lambda: tcp("127.0.0.1", P["tcp_port"])),
    "udp_host_listener": attempt(lambda: udp("127.0.0.1", P["udp_port"])),
    "tcp_server_port": attempt(lambda: tcp("127.0.0.1", P["server_port"])),
    "tcp_outside": attempt(lambda: tcp("1.1.1.1", 443)),
    "udp_outside": attempt(lambda: udp("8.8.8.8", 53)),
    "dns": attempt(lambda: socket.getaddrinfo("example.com", 80)),
    "dns_localhost": attempt(lambda: socket.getaddrinfo("localhost", 80)),
    "inet_stream": attempt(lambda: make(socket.AF_INET, socket.SOCK_STREAM)),
    "inet_dgram": attempt(lambda: make(socket.AF_INET, socket.SOCK_DGRAM)),
    "inet6": attempt(lambda: make(socket.AF_INET6, socket.SOCK_STREAM)),
    "raw": attempt(lambda: make(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
    "netlink": attempt(lambda: make(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
    "packet": attempt(lambda: make(socket.AF_PACKET, socket.SOCK_RAW, 0)),
    "socketpair_inet": attempt(lambda: socket.socketpair(socket.AF_INET, socket.SOCK_STREAM)),
    "unix": attempt(lambda: make(socket.AF_UNIX, socket.SOCK_STREAM)),
    "abstract_unix": attempt(lambda: unix("\0" + P["abstract_name"])),
    "control_socket": attempt(lambda: unix(P["control_socket"])),
}

# ---- probe 12: ptrace and cross-process memory
child = subprocess.Popen(["sleep", "60"])
R["ptrace_attach"] = syscall(101, 16, child.pid, 0, 0)  # PTRACE_ATTACH
child.kill(); child.wait()
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
src, dst = ctypes.create_string_buffer(b"redteam!"), ctypes.create_string_buffer(8)
local, remote = iovec(ctypes.cast(dst, ctypes.c_void_p), 8), iovec(ctypes.cast(src, ctypes.c_void_p), 8)
R["process_vm_readv"] = syscall(310, os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)

# ---- probe 13: /proc, /sys, /dev
R["kcore"] = attempt(lambda: open("/proc/kcore", "rb").read(1) and "read")
R["kmsg"] = attempt(lambda: open("/proc/kmsg", "rb").close() or "opened")
R["kallsyms"] = attempt(lambda: open("/proc/kallsyms").readline().split()[0])
R["sysctl_write"] = attempt(lambda: open("/proc/sys/kernel/hostname", "w").close() or "opened")
R["sys"] = attempt(lambda: os.listdir("/sys"))

# ---- probe 14: setuid, setuid binaries, capabilities
R["setuid0"] = attempt(lambda: os.setuid(0))
R["setgroups0"] = attempt(lambda: os.setgroups([0]))
def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=20)
    return {"rc": r.returncode, "out": r.stdout[-300:], "err": r.stderr[-300:]}
R["su"] = attempt(lambda: run(["su", "root", "-c", "id -u"]))
R["sudo"] = attempt(lambda: run(["sudo", "-n", "id", "-u"]))
R["mount_bin"] = attempt(lambda: run(["mount", "-t", "tmpfs", "none", "/workspace"]))
setuid_bins = {}
for d in ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/libexec"):
    for dirpath, dirnames, filenames in os.walk(d):
        if dirpath.count("/") > 4:
            dirnames[:] = []
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_ISUID:
                setuid_bins[path] = st.st_uid
R["setuid_bins"] = setuid_bins
status = {}
for line in open("/proc/self/status"):
    key, _, value = line.partition(":")
    status[key] = value.strip()
R["caps"] = {k: status.get(k) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")}
R["uid"] = [os.getuid(), os.geteuid()]

# ---- probe 15: keyrings
R["keyctl"] = syscall(250, 0, ctypes.c_long(-3), 0)  # KEYCTL_GET_KEYRING_ID, session keyring
R["add_key"] = syscall(248, b"user", b"redteam", b"payload", 7, ctypes.c_long(-3))

# ---- probe 16: mount, namespaces, nested sandboxes
R["mount"] = syscall(165, b"none", b"/workspace", b"tmpfs", 0, None)
single = ("import ctypes, errno, json; libc = ctypes.CDLL(None, use_errno=True); out = {}\n"
          "for name, flag in (('user', 0x10000000), ('mnt', 0x20000), ('net', 0x40000000), ('pid', 0x20000000)):\n"
          "    r = libc.unshare(flag); out[name] = errno.errorcode.get(ctypes.get_errno()) if r else 'ok'\n"
          "print(json.dumps(out))")
R["unshare"] = attempt(lambda: json.loads(subprocess.run([sys.executable, "-c", single], capture_output=True, text=True).stdout))
R["unshare_cmd"] = attempt(lambda: run(["unshare", "-r", "true"]))
R["bwrap_on_path"] = attempt(lambda: __import__("shutil").which("bwrap"))
R["bwrap_host_path"] = attempt(lambda: run([P["host_bwrap"], "--version"]))

print(P["mark"] + json.dumps(R))
'''


def probe_cell(params: dict) -> str:
    return PROBE_CELL.replace("__PARAMS__", repr(json.dumps(params)))
