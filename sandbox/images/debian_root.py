"""An image on a root of its own: a Debian tree built with the ecosystem's tools, that every
sandbox of the image sees as ``/`` on both tiers.

A recipe that names Debian packages (``apt``), npm packages (``npm``) or asks for
``"root": "debian"`` is built here rather than as a venv over the host's ``/usr``
(images.py). Nothing of the host's ``/usr`` or ``/etc`` is then visible to the sandbox: a
host upgrade changes no image, and the image's package list is all there is.

The layout (one tree, ``images/NAME/root``, the same for the bubblewrap and gVisor tiers;
what an OCI export packs as a single layer, its paths relative to that directory):

- ``/`` ... a Debian ``minbase`` root made by ``mmdebstrap`` from Debian's mirror, with
  ``python3`` and the recipe's ``apt`` packages (their dependencies, no recommends);
- ``/opt/sandbox-images/NAME`` ... the image's venv, made by uv inside the root from the
  root's own ``/usr/bin/python3``, holding the project's default packages (the runtime's
  IPython, cloudpickle, ...) and the recipe's ``pip`` packages;
- ``/usr/local/lib/node_modules``, ``/usr/local/bin`` ... the recipe's ``npm`` packages,
  installed by the root's own npm (``npm install -g``), found by ``NODE_PATH``;
- empty mount points for what each sandbox brings (``/workspace``, the runtime at
  ``/opt/sandbox-kernel``, its font cache, the egress socket and CA bundle), because the root
  is mounted read-only and a mount needs its point to exist;
- nothing else: the apt lists and caches are removed (the downloaded ``.deb`` files are kept
  in ``images/_apt-cache`` for the next build, as uv and npm keep theirs).

The build runs each tool inside the root (bubblewrap as root, with the host's network and
resolver), so the paths the tools bake in (the venv's ``pyvenv.cfg`` and shebangs, npm's
links, matplotlib's font list) are the sandbox's paths from the start: nothing is rewritten.
The tree is immutable once built, which keeps gVisor checkpoints valid: a restored process
finds the very files it had mapped.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from typing import Callable, Iterator

from .build_steps import ImageError

Progress = Callable[[str], None]

SUITE = "bookworm"  # Debian 12, the release this project is tested on
MIRROR = "http://deb.debian.org/debian"
# The release, its updates and its security fixes: an image built today has today's fixes.
SOURCES = (f"deb {MIRROR} {SUITE} main", f"deb {MIRROR} {SUITE}-updates main",
           f"deb http://deb.debian.org/debian-security {SUITE}-security main")
ALWAYS = ("python3", "ca-certificates")  # the runtime's interpreter; TLS roots for pip/npm in egress sandboxes
# Where the sandbox's own mounts go (isolation/bwrap.py, gvisor.py): created empty in the root.
MOUNT_DIRS = ("/workspace", "/tmp", "/proc", "/dev", "/sys", "/opt/sandbox-kernel", "/opt/sandbox-kernel-mpl",
              "/run/sandbox-egress", "/opt/sandbox-packages", "/etc/sandbox-egress")
MOUNT_FILES = ("/etc/sandbox-egress/ca-bundle.pem", "/etc/passwd", "/etc/group")
NODE_MODULES = "/usr/local/lib/node_modules"  # npm's global prefix in the root; NODE_PATH in sandboxes
# Measured here (2 shared cores, bench/build_bench.py --own-root): minbase + python3 from a
# cold apt cache 44 s and 122 MiB; the venv with the default packages ~30 s and ~300 MiB more.
ESTIMATE = "about 1-3 min and 500 MiB of disk plus the packages' own (less with warm apt, uv and npm caches)"


def available() -> tuple[bool, str]:
    """Whether this host can build a Debian root: mmdebstrap, bubblewrap and root."""
    if shutil.which("mmdebstrap") is None:
        return False, "mmdebstrap is not installed (apt-get install mmdebstrap)"
    if shutil.which("bwrap") is None and _bundled_bwrap() is None:
        return False, "bubblewrap is not installed"
    if os.getuid() != 0:
        return False, "building a root of its own needs the server to run as root (mmdebstrap's root mode)"
    return True, ""


def _bundled_bwrap() -> str | None:
    from ..isolation import bwrap

    found = bwrap.discover()
    return found.path if found else None


@contextlib.contextmanager
def cache_held(cache: str) -> Iterator[None]:
    """The shared ``.deb`` cache, one build at a time (a lock file beside it): apt locks the
    cache, so another build's apt would fail; and mmdebstrap's sync-in read it while another
    build's sync-out wrote it, and its hook failed (exit 13: seen with four images built at once)."""
    with open(cache.rstrip("/") + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def debootstrap(root: str, apt: list[str], cache: str, run: Callable[[list[str]], None]) -> None:
    """``mmdebstrap --variant=minbase`` with python3 and ``apt`` into ``root``, the
    downloaded packages kept in ``cache`` between builds (mmdebstrap's own sync-in/out
    hooks: apt sees them as its archive cache inside the root)."""
    os.makedirs(cache, exist_ok=True)
    packages = ",".join(sorted(set(ALWAYS) | set(apt)))
    with cache_held(cache):
        run(["mmdebstrap", "--variant=minbase", f"--include={packages}", "--skip=download/empty",
             "--skip=essential/unlink", "--aptopt=APT::Install-Recommends \"false\"",
             "--setup-hook=mkdir -p \"$1\"/var/cache/apt/archives/",
             f"--setup-hook=sync-in {cache} /var/cache/apt/archives/",
             f"--customize-hook=sync-out /var/cache/apt/archives {cache}",
             SUITE, root, *SOURCES])


def inside(root: str, argv: list[str], binds: dict[str, str] | None = None, env: dict | None = None,
           read_only: list[str] = ()) -> list[str]:
    """``argv`` run inside ``root`` (writable, the host's network and resolver), with
    ``binds`` (host path -> path in the root) for the tools and caches it needs, and the
    host paths ``read_only`` at the same paths (the host's local package indexes)."""
    exe = shutil.which("bwrap") or _bundled_bwrap()
    cmd = [exe, "--bind", root, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
           "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf", "--clearenv",
           "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    for host, dest in (binds or {}).items():
        cmd += ["--bind", host, dest]
    for path in read_only:
        cmd += ["--ro-bind", path, path]
    for key, value in (env or {}).items():
        cmd += ["--setenv", key, value]
    return cmd + ["--chdir", "/"] + argv


def python_env(root: str, venv: str, packages: list[str], requirements: str | None, uv: str, uv_cache: str,
               uv_env: dict | None, run: Callable[[list[str]], None], create: bool = True) -> None:
    """The image's venv at ``venv`` (a sandbox path) from the root's own python3, and its
    packages, with uv (the host's uv binary and cache, bound in); ``create=False`` adds the
    packages to the venv a base image's root already holds (a layered image)."""
    os.makedirs(uv_cache, exist_ok=True)
    binds = {uv: "/run/uv", uv_cache: "/run/uv-cache"}
    settings = {k: v for k, v in (uv_env or {}).items() if k.startswith("UV_") or k == "SSL_CERT_FILE"}
    # bytecode compiled once here: sandboxes run with PYTHONDONTWRITEBYTECODE, so an image
    # without it would compile numpy and pandas again at every sandbox's first import
    settings.update({"UV_CACHE_DIR": "/run/uv-cache", "UV_LINK_MODE": "copy", "UV_NO_PROGRESS": "1",
                     "UV_PYTHON_DOWNLOADS": "never", "UV_COMPILE_BYTECODE": "1"})
    _touch(root + "/run/uv")
    os.makedirs(root + "/run/uv-cache", exist_ok=True)
    local = local_sources(settings)
    made = sorted({prefix for p in local for prefix in _prefixes(p) if not os.path.lexists(root + prefix)})
    try:
        if create:
            run(inside(root, ["/run/uv", "venv", "-q", "--seed", "--python", "/usr/bin/python3", venv], binds,
                       settings, local))
        if requirements:
            with open(root + "/run/requirements.txt", "w") as f:
                f.write(requirements)
            packages = packages + ["-r", "/run/requirements.txt"]
        if packages:
            run(inside(root, ["/run/uv", "pip", "install", "--python", f"{venv}/bin/python", *packages], binds,
                       settings, local))
    finally:
        for leftover in ("/run/uv", "/run/requirements.txt"):
            if os.path.exists(root + leftover):
                os.unlink(root + leftover)
        os.rmdir(root + "/run/uv-cache")
        _remove_mount_points(root, made)


def local_sources(settings: dict[str, str]) -> list[str]:
    """The host paths pip's configuration names (a wheel directory, a file:// index and
    the directory it is in, a constraints file, a certificate), which uv inside the root must
    find at the same paths."""
    found = []
    for value in settings.values():
        for item in str(value).split():
            # a file:// index's pages link to files beside it (/opt/pypi/simple -> /opt/pypi/files)
            path = os.path.dirname(item[len("file://"):].rstrip("/")) if item.startswith("file://") else item
            if path.startswith("/") and os.path.exists(path) and path not in found:
                found.append(path)
    return found


def _prefixes(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _remove_mount_points(root: str, made: list[str]) -> None:
    """The empty files and directories bwrap made in the root for binds (``made``: they did
    not exist before), gone again, deepest first."""
    for path in sorted(made, key=len, reverse=True):
        current = root + path
        try:
            if os.path.isdir(current) and not os.path.islink(current):
                os.rmdir(current)
            elif os.path.lexists(current) and os.path.getsize(current) == 0:
                os.unlink(current)
        except OSError:
            pass


def apt_install(root: str, apt: list[str], cache: str, run: Callable[[list[str]], None]) -> None:
    """The recipe's Debian packages added to a root that exists (a base image's, seen
    through the layered build's overlay: root_overlay.py) by the root's own apt, from the
    sources mmdebstrap wrote into it; the downloaded packages kept in ``cache``."""
    if not apt:
        return
    os.makedirs(os.path.join(cache, "partial"), exist_ok=True)
    for d in ("/var/lib/apt/lists/partial", "/var/cache/apt/archives", "/var/log/apt"):
        os.makedirs(root + d, exist_ok=True)
    # the root's apt runs as root in the build's namespace: its download user (_apt) would
    # need a setuid the namespace does not give, and there is no terminal for debconf
    options = ["-o", "APT::Sandbox::User=root", "-o", "APT::Install-Recommends=false", "-o", "Dpkg::Use-Pty=false"]
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    binds = {cache: "/var/cache/apt/archives"}
    with cache_held(cache):
        run(inside(root, ["apt-get", *options, "-q", "update"], binds, env))
        run(inside(root, ["apt-get", *options, "-q", "-y", "install", *sorted(set(apt))], binds, env))


def npm_install(root: str, packages: list[str], npm_cache: str, run: Callable[[list[str]], None]) -> None:
    """The recipe's npm packages, installed globally by the root's own npm (Debian's nodejs)."""
    if not packages:
        return
    if not os.path.exists(root + "/usr/bin/npm"):
        raise ImageError("npm packages need npm in the image: add \"npm\" (and \"nodejs\") to its apt packages")
    os.makedirs(npm_cache, exist_ok=True)
    os.makedirs(root + "/run/npm-cache", exist_ok=True)
    binds, env = {npm_cache: "/run/npm-cache"}, {}
    trust = host_trust()
    if trust:  # the host's roots (a TLS-inspecting proxy's CA among them), as the host's own npm uses
        _touch(root + "/run/host-ca.pem")
        binds[trust] = "/run/host-ca.pem"
        env["NODE_EXTRA_CA_CERTS"] = "/run/host-ca.pem"
    try:
        run(inside(root, ["/usr/bin/npm", "install", "-g", "--prefix", "/usr/local", "--no-fund", "--no-audit",
                          "--registry", host_registry(), "--cache", "/run/npm-cache", *packages], binds, env))
    finally:
        os.rmdir(root + "/run/npm-cache")
        if os.path.exists(root + "/run/host-ca.pem"):
            os.unlink(root + "/run/host-ca.pem")


def host_trust() -> str | None:
    """The CA bundle the host's Node.js trusts beyond its own (NODE_EXTRA_CA_CERTS), else
    the host's system bundle; None if there is neither."""
    for path in (os.environ.get("NODE_EXTRA_CA_CERTS"), "/etc/ssl/certs/ca-certificates.crt"):
        if path and os.path.isfile(path):
            return path
    return None


def host_registry() -> str:
    """The npm registry the host's npm is configured with (a mirror), else npm's default."""
    npm = shutil.which("npm")
    if npm:
        try:
            out = subprocess.run([npm, "config", "get", "registry"], capture_output=True, text=True, timeout=60)
            if out.returncode == 0 and out.stdout.strip().startswith("http"):
                return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return "https://registry.npmjs.org/"


def finish(root: str) -> None:
    """Mount points for the sandbox's own mounts; apt's lists and caches out (they are the
    host's business at build time, and hundreds of MiB nobody in a sandbox needs)."""
    for d in MOUNT_DIRS:
        os.makedirs(root + d, exist_ok=True)
    for f in MOUNT_FILES:
        _touch(root + f)
    for d in ("/var/lib/apt/lists", "/var/cache/apt", "/var/cache/debconf", "/var/log"):
        for name in os.listdir(root + d) if os.path.isdir(root + d) else []:
            path = os.path.join(root + d, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            elif name != "lock":
                os.unlink(path)
    os.chmod(root, 0o755)


def unmount_under(path: str) -> None:
    """Unmount every mount below ``path``, deepest first (lazily where busy): what a build
    that died mid-way left in its root, before the root is removed."""
    prefix = os.path.realpath(path).rstrip("/") + "/"
    try:
        with open("/proc/self/mounts") as f:
            points = [line.split()[1].replace("\\040", " ") for line in f]
    except OSError:
        return
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)


def python_version(root: str) -> str:
    out = subprocess.run(inside(root, ["/usr/bin/python3", "-c", "import sys; print(sys.version.split()[0])"]),
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def site_packages(venv: str, version: str) -> str:
    major_minor = ".".join(version.split(".")[:2]) if version != "unknown" else f"{sys.version_info[0]}.{sys.version_info[1]}"
    return f"{venv}/lib/python{major_minor}/site-packages"


def _touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path):
        open(path, "w").close()
