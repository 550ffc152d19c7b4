"""Seccomp filter handed to bwrap via ``--seccomp FD``.

Why a deny-list (default ALLOW) rather than an allow-list: the sandbox runs a
full CPython/IPython runtime plus whatever compiled extensions a notebook
imports (numpy, pandas, ...), and the set of syscalls those legitimately need
is large, grows with every glibc and kernel release, and is hard to enumerate
without breaking users in ways that look like random crashes.  The sandbox's
real containment comes from the namespaces and mounts that bwrap sets up; this
filter exists to take away the kernel attack surface and escape primitives
that namespaces do not cover: creating further namespaces, mounting,
tracing other processes, keyrings, eBPF, perf, io_uring, userfaultfd (a
favourite exploit helper), module loading, clock changes, terminal injection
(TIOCSTI) and every network family other than AF_UNIX (a sandbox with an egress
policy also gets AF_INET/AF_INET6 sockets, never raw ones, for its loopback).

Architecture: only the native ABI is in the filter, and the bad-arch action is
set to KILL_PROCESS.  On x86_64 that means i386 syscalls made with
``int 0x80`` (reported with AUDIT_ARCH_I386) and x32 syscalls (native arch
but ``nr | 0x40000000``, which libseccomp checks for explicitly) kill the
process instead of slipping past rules written for 64-bit numbers.  Adding the
x86/x32 ABIs with translated rules would only widen what is reachable; nothing
in a 64-bit Python runtime uses them.  KILL_PROCESS rather than libseccomp's
default KILL_THREAD so a multithreaded process cannot be left half-alive.

bwrap installs the filter just before it execs the sandboxed command, so its
own setup (clone with namespace flags, mount, pivot_root) is unaffected.

pyseccomp is imported lazily so that importing this module never fails on a
host without libseccomp; ``available()`` reports why instead.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os

__all__ = [
    "DENIED_SYSCALLS",
    "build_filter",
    "filter_fd",
    "available",
    "skipped_syscalls",
]

# Denied outright with EPERM.  EPERM (not ENOSYS) because that is what the
# same calls return for an unprivileged user, so library code already copes.
DENIED_SYSCALLS: tuple[str, ...] = (
    # debugging / cross-process memory access
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    # mounts and namespaces: the filesystem view is bwrap's job, not the child's
    "mount",
    "umount2",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    # large, historically buggy kernel subsystems
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # host administration
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "quotactl",
    "lookup_dcookie",
    # handle-based opens bypass the mount-namespace path walk
    "name_to_handle_at",
    "open_by_handle_at",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "vhangup",
    "nfsservctl",
    "uselib",
    "fanotify_init",
)

_AF_UNIX = 1
_AF_INET = 2
_AF_INET6 = 10
_RAW_TYPES = (3, 4, 10)  # SOCK_RAW, SOCK_RDM, SOCK_PACKET

_CLONE_NS_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x02000000,  # CLONE_NEWCGROUP
    # CLONE_NEWTIME only takes effect via clone3/unshare; for clone() 0x80
    # sits inside the exit-signal byte, where no valid signal sets it, so
    # denying it costs nothing.
    0x00000080,
)

_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C

_skipped: list[str] = []


def _deny_except_zero_and_all_ones(flt, sc, syscall: str, arg: int, action: int) -> None:
    """Deny unless the low 32 bits of ``arg`` are all 0 or all 1.

    libseccomp refuses two comparisons on one argument in a rule, and an
    ALLOW rule under an ALLOW default, so "not 0 and not 0xffffffff" cannot be
    written directly.  A 32-bit value that is neither all zeros nor all ones
    has, going round the bits cyclically, some bit i set with bit i+1 clear;
    one MASKED_EQ rule per i catches exactly those values.  Masks are 32-bit,
    matching the kernel, which takes these arguments as ``unsigned int``.
    """
    for i in range(32):
        bit, nxt = 1 << i, 1 << ((i + 1) % 32)
        flt.add_rule(action, syscall, sc.Arg(arg, sc.MASKED_EQ, bit | nxt, bit))


def _resolve(sc, name: str) -> int | None:
    # pyseccomp returns libseccomp's __NR_SCMP_ERROR (-1) for unknown names;
    # other negative numbers are pseudo-syscalls libseccomp handles itself.
    nr = sc.resolve_syscall(sc.Arch.NATIVE, name)
    return None if nr == -1 else nr


def _build(sc, inet: bool = False) -> bytes:
    """Build the filter and return the raw ``struct sock_filter`` array."""
    flt = sc.SyscallFilter(sc.ALLOW)
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    eperm = sc.ERRNO(errno.EPERM)
    skipped: list[str] = []

    def known(name: str) -> bool:
        if _resolve(sc, name) is None:
            skipped.append(name)
            return False
        return True

    for name in DENIED_SYSCALLS:
        if not known(name):
            continue
        try:
            flt.add_rule(eperm, name)
        except OSError:
            skipped.append(name)

    # personality: the 0xffffffff query (how callers read the persona) and
    # PER_LINUX stay allowed; ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC and the
    # rest would weaken exploit mitigations for anything exec'd later.
    if known("personality"):
        _deny_except_zero_and_all_ones(flt, sc, "personality", 0, eperm)

    if known("clone"):
        for flag in _CLONE_NS_FLAGS:
            flt.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 passes its flags in a struct seccomp cannot read, so make it look
    # absent; glibc then falls back to clone(), whose flags we can inspect.
    if known("clone3"):
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")

    # Compared as full 64-bit values: the kernel truncates the family to int,
    # so garbage in the upper half can only turn an allow into a deny.
    # A sandbox with an egress policy also gets AF_INET/AF_INET6 (stream and datagram, never
    # raw): its namespace holds only loopback, where the egress forwarder listens.
    nosupport = sc.ERRNO(errno.EAFNOSUPPORT)
    for name in ("socket", "socketpair"):
        if not known(name):
            continue
        if not inet or name == "socketpair":
            flt.add_rule(nosupport, name, sc.Arg(0, sc.NE, _AF_UNIX))
            continue
        flt.add_rule(nosupport, name, sc.Arg(0, sc.LT, _AF_UNIX))
        flt.add_rule(nosupport, name, sc.Arg(0, sc.GT, _AF_INET6))
        for family in range(_AF_UNIX + 1, _AF_INET6):
            if family != _AF_INET:
                flt.add_rule(nosupport, name, sc.Arg(0, sc.EQ, family))
        for family in (_AF_INET, _AF_INET6):
            for kind in _RAW_TYPES:  # the low byte of type is the kind; the rest are flags
                flt.add_rule(eperm, name, sc.Arg(0, sc.EQ, family), sc.Arg(1, sc.MASKED_EQ, 0xFF, kind))

    # The kernel reads cmd as unsigned int, so mask to 32 bits: otherwise
    # 0x1_00005412 would skip an EQ rule yet still be TIOCSTI (CVE-2019-10063).
    if known("ioctl"):
        for cmd in (_TIOCSTI, _TIOCLINUX):
            flt.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, cmd))

    fd = os.memfd_create("sandbox-seccomp-build", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as f:
        flt.export_bpf(f)
        f.seek(0)
        data = f.read()
    _skipped[:] = skipped
    return data


@functools.cache
def build_filter(inet: bool = False) -> bytes:
    """Return the BPF program for ``bwrap --seccomp``; built once per process (and variant).
    ``inet``: the variant for a sandbox with an egress policy (see `_build`).

    Raises ImportError/RuntimeError/OSError when libseccomp is unusable.
    """
    import pyseccomp

    return _build(pyseccomp, inet)


def skipped_syscalls() -> tuple[str, ...]:
    """Names libseccomp did not know on this architecture (so not filtered)."""
    build_filter()
    return tuple(_skipped)


def filter_fd(inet: bool = False) -> int:
    """Return a fresh fd at offset 0 holding the filter; the caller closes it.

    Fresh per call because bwrap reads the fd to EOF, so a shared one would be
    empty for the next sandbox.  The fd is close-on-exec; list it in
    subprocess ``pass_fds`` to hand it to bwrap.  The memfd is sealed so
    nothing holding a copy can rewrite the program between now and bwrap
    reading it.
    """
    data = build_filter(inet)
    fd = os.memfd_create("sandbox-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(
            fd,
            fcntl.F_ADD_SEALS,
            fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE,
        )
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def available() -> tuple[bool, str]:
    """Whether the filter can be built here, and why not (for ``doctor``)."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        return False, f"libseccomp could not be loaded: {exc}"
    try:
        data = build_filter()
    except (OSError, ValueError, AttributeError, RuntimeError) as exc:
        return False, f"building the seccomp filter failed: {exc}"
    try:
        api = pyseccomp.get_api()
    except NotImplementedError:
        api = "unknown"
    reason = (
        f"libseccomp {getattr(pyseccomp, '_libseccomp_path', '?')} (API level {api}), "
        f"filter of {len(data) // 8} BPF instructions"
    )
    if _skipped:
        reason += f"; unknown on this arch, not filtered: {', '.join(_skipped)}"
    return True, reason
