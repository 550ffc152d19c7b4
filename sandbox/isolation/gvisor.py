"""The gVisor backend: one ``runsc`` container per sandbox, from an OCI bundle of its own.

gVisor puts a kernel of its own (the Sentry, a Go program) between the sandbox's code and
the host's: the code's system calls are served by the Sentry, which itself uses a small,
filtered set of host calls; files come through a separate gofer process. On this kind of
host only the ``ptrace`` platform works (no nested virtualisation for ``kvm``, and Debian's
runsc release predates ``systrap``): each system call of the sandbox is trapped with ptrace,
which is slower than bwrap but keeps the host kernel out of the sandbox's reach.

The bundle (``SANDBOX/bundle/config.json``) points at a pinned root filesystem shared by the
sandboxes of one image (``rootfs.py``), binds the sandbox's ``/workspace`` and its own
``/etc/passwd``, and runs the same runtime with the same protocol as bwrap. The runtime's
channel is the container's stdin and stdout (two host pipes): runsc re-attaches a restored
container's stdio to the restoring process's, while a host socket passed in would make the
checkpoint fail (``Cannot save endpoint with bound host socket``). The supervisor runs
``runsc run`` (and ``runsc restore``) in the foreground, as the parent it waits on; runsc's
own cgroup handling is off (``--ignore-cgroups``): it runs inside the sandbox's cgroup, so the
Sentry, the gofer and everything the code starts count against the sandbox's limits.

The ``pids`` limit is the exception: the host cgroup counts gVisor's own host tasks, which
are not the code's (``host_pids_ceiling``), so the limit on the code is the Sentry's: the
container's ``RLIMIT_NPROC`` is ``pids``, which the Sentry counts over the tasks of the
sandbox's uid inside it (the code's processes and threads) and enforces as Linux does, a
fork or clone past it failing with ``EAGAIN``. gVisor's own pids controller
(``linux.resources.pids`` in the spec) is not applied under ``--ignore-cgroups``: a bomb got
every task it asked for. The host cgroup keeps a ceiling above that, for gVisor's tasks.

Traps this module steers clear of: ``checkpoint --leave-running`` hangs in this release, a
checkpoint taken while a ``runsc exec`` is attached cannot be restored (commands run inside
the runtime, never through ``exec``), and ``runsc delete`` takes seconds (the per-sandbox
``--root`` directory is removed instead, once every process of the container is gone).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ..runtime.protocol import STDIO_CHANNEL
from . import rootfs
from .bwrap import MPLCACHE_MOUNT, RUNTIME_MOUNT, sandbox_environment

PLATFORM = "ptrace"

# A gVisor sandbox's host tasks, measured with this runsc (20221219, ptrace, 2 CPUs): at rest,
# 55 with the runtime (``runsc run``, the Sentry's Go threads, the gofer, the runtime's stub;
# a bare ``sleep``: 39). On ptrace each guest address space (process) gets a host stub
# thread for every Sentry thread that has run it, and the Sentry grows a thread for each
# guest task running at once, so the count grows with processes times concurrent tasks:
# guest at its limit (RLIMIT_NPROC), 28 sleeping children of the runtime (pids 32) 225;
# 31 processes of one spinning thread (pids 32) 264; 16 processes of two spinning threads
# (pids 32) 713, of four (pids 64) 1502; 64 of two (pids 128) 5393; 30 threads in one
# process 44 to 80. Per guest thread that is from under 1 to over 40 host tasks.
HOST_TASKS_BASE = 64
# cgroup pids.max accepts up to PID_MAX_LIMIT (4194304 on 64-bit)
PIDS_MAX_LIMIT = 1 << 22


def host_pids_ceiling(pids: int) -> int:
    """The host cgroup's pids.max for a gVisor sandbox whose code may have ``pids`` tasks:
    the Sentry's threads (up to ``pids`` running tasks and 16 of its own), each with a
    ptrace stub in up to ``pids`` address spaces, plus ``HOST_TASKS_BASE`` for runsc, the
    gofer and the Sentry at rest. Well above every peak measured (pids 32: 1648, against
    713); a backstop for the host, not the code's limit (that is the Sentry's RLIMIT_NPROC)."""
    pids = int(pids)
    return min(PIDS_MAX_LIMIT, (pids + 16) * (pids + 1) + HOST_TASKS_BASE)


@dataclass(frozen=True)
class RunscBinary:
    path: str
    version: str


# (path, inode, size, mtime) of a runsc binary -> what its --version said
_versions: dict[tuple[str, int, int, int], RunscBinary] = {}


def discover() -> RunscBinary | None:
    """The runsc on PATH and its version. ``runsc --version`` starts the Go binary (tens of
    ms, blocking), and every spawn and restore asks (a checkpoint names the version that
    wrote it): so the answer is kept per binary file, and an upgraded runsc (another inode,
    size or mtime) is asked again. The supervisor template asks once before it forks, so a
    supervisor's restore asks nobody (bench/README.md, the sleep benchmark)."""
    path = shutil.which("runsc") or ("/usr/bin/runsc" if os.path.exists("/usr/bin/runsc") else None)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _versions:
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        m = re.search(r"runsc version (\S+)", out)
        if not m:
            return None
        _versions[key] = RunscBinary(path, m.group(1))
    return _versions[key]


def available() -> tuple[bool, str]:
    """Whether gVisor sandboxes can run here, and why (not)."""
    binary = discover()
    if binary is None:
        return False, "runsc not found (apt-get install runsc)"
    if os.geteuid() != 0:
        return False, "runsc needs the server to run as root"
    return True, f"runsc {binary.version} at {binary.path}, platform {PLATFORM}"


def runsc_root(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "runsc")


def bundle_dir(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "bundle")


def global_flags(binary: RunscBinary, sandbox_dir: str) -> list[str]:
    return [binary.path, "--root", runsc_root(sandbox_dir), "--platform", PLATFORM, "--network", "none",
            "--ignore-cgroups"]


def container_id(spec: dict) -> str:
    return spec["id"]


def run_argv(binary: RunscBinary, sandbox_dir: str, spec: dict) -> list[str]:
    return global_flags(binary, sandbox_dir) + ["run", "--bundle", bundle_dir(sandbox_dir), container_id(spec)]


def restore_argv(binary: RunscBinary, sandbox_dir: str, spec: dict, image_path: str) -> list[str]:
    return global_flags(binary, sandbox_dir) + ["restore", "--image-path", image_path, "--bundle",
                                                bundle_dir(sandbox_dir), container_id(spec)]


def checkpoint_argv(binary: RunscBinary, sandbox_dir: str, spec: dict, image_path: str) -> list[str]:
    return global_flags(binary, sandbox_dir) + ["checkpoint", "--image-path", image_path, container_id(spec)]


def clear_container_state(sandbox_dir: str) -> None:
    """Forget runsc's record of a container whose processes are all gone (instead of the
    slow ``runsc delete``): a restore under the same id needs a clean ``--root``."""
    shutil.rmtree(runsc_root(sandbox_dir), ignore_errors=True)


def passwd_files(uid: int) -> tuple[bytes, bytes]:
    passwd = f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/sh\n"
    group = f"root:x:0:\nsandbox:x:{uid}:\n"
    return passwd.encode(), group.encode()


def write_bundle(sandbox_dir: str, spec: dict, root: dict) -> str:
    """Write the sandbox's OCI bundle (config.json, its passwd and group) and return its path."""
    uid = spec["uid"]
    limits = spec["limits"]
    bundle = bundle_dir(sandbox_dir)
    os.makedirs(bundle, mode=0o700, exist_ok=True)
    passwd, group = passwd_files(uid)
    for name, data in (("passwd", passwd), ("group", group)):
        with open(os.path.join(bundle, name), "wb") as f:
            f.write(data)
        os.chmod(os.path.join(bundle, name), 0o644)
    no_caps = {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}
    rlimits = [{"type": "RLIMIT_NOFILE", "hard": int(limits["open_files"]), "soft": int(limits["open_files"])},
               {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}]
    if limits.get("file_mb"):
        size = int(limits["file_mb"]) * 1024 * 1024
        rlimits.append({"type": "RLIMIT_FSIZE", "hard": size, "soft": size})
    if limits.get("pids"):
        # the code's process limit, enforced by the Sentry (see the module's docstring)
        rlimits.append({"type": "RLIMIT_NPROC", "hard": int(limits["pids"]), "soft": int(limits["pids"])})
    ro = ["ro", "nosuid", "nodev", "noexec"]
    config = {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": uid},
            "args": [os.path.join(spec["image_info"]["venv"], "bin", "python"), "-m", "sandbox_runtime", STDIO_CHANNEL],
            "env": [f"{k}={v}" for k, v in sandbox_environment(spec).items()],
            "cwd": "/workspace",
            "capabilities": no_caps,
            "rlimits": rlimits,
            "noNewPrivileges": True,
        },
        "root": {"path": root["path"], "readonly": True},
        "hostname": "sandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777", f"size={int(limits['tmp_mb'])}m"]},
            # as under bwrap: a /dev/shm of shm_mb the sandbox's uid can write (gVisor's own
            # /dev/shm is root's, so POSIX shared memory and multiprocessing's locks failed)
            {"destination": "/dev/shm", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "noexec", "mode=1777", f"size={int(limits.get('shm_mb', 64))}m"]},
            {"destination": "/etc/passwd", "type": "bind", "source": os.path.join(bundle, "passwd"), "options": ["bind", *ro]},
            {"destination": "/etc/group", "type": "bind", "source": os.path.join(bundle, "group"), "options": ["bind", *ro]},
            {"destination": "/workspace", "type": "bind", "source": spec["workspace"],
             "options": ["bind", "rw", "nosuid", "nodev"]},
        ] + [
            # An image under /tmp (a state directory there) is shadowed by the tmpfs above:
            # its trees come back as binds of the root's own copies, mounted after it.
            {"destination": tree, "type": "bind", "source": root["path"] + tree, "options": ["bind", *ro[:3]]}
            for _, tree in rootfs.image_trees(spec["image_info"]) if tree.startswith("/tmp/")
        ] + _own_root_binds(spec, ro),
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]},
    }
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return bundle


def _own_root_binds(spec: dict, ro: list[str]) -> list[dict]:
    """On an image's own root, what a venv image's root has copied in: the runtime and the
    font cache, bound read-only at the points the image's build left for them."""
    image = spec["image_info"]
    if not image.get("root"):
        return []
    binds = [(spec["runtime_dir"], RUNTIME_MOUNT)]
    if image.get("mplcache"):
        binds.append((image["mplcache"], MPLCACHE_MOUNT))
    return [{"destination": dest, "type": "bind", "source": source, "options": ["bind", *ro]} for source, dest in binds]


def ensure_root(spec: dict) -> dict:
    """The pinned root filesystem of the sandbox's image (built once per version)."""
    state_root = os.path.dirname(os.path.dirname(os.path.dirname(spec["workspace"])))
    return rootfs.ensure(os.path.join(state_root, "rootfs"), spec["image_info"], spec["runtime_dir"])
