"""The pinned root filesystem of a venv image's sandboxes, on both tiers.

An image on a root of its own (images/debian_root.py) needs none of what follows: that
root is already pinned, and is used as it is (``own_root``). For a venv image:

Binding the host's ``/usr`` would run whatever the host has today and show sandbox code all
of it. And a gVisor sandbox can be checkpointed and restored days later, while a restored
process keeps libraries mapped that it loaded before: they must be the same files. So the
root is a tree of its own, built once per (image, runtime, host libraries) and never
changed; gVisor uses it as it is, bwrap binds its system part (``bwrap_root.py``):

- the image's interpreter and venv layers, at the paths their absolute references expect
  (hard links into the image, which is immutable; a copy where a link cannot be made); an
  image that carries no copy of its interpreter (an ordinary user's, on Debian's
  ``/usr/bin/python3``: nothing of ``/usr`` is copied into the image) gets that interpreter
  here instead, its executables and its standard library copied from the host as they were
  when the root was built (``interpreter_files``),
- the runtime (``/opt/sandbox-kernel``) and the matplotlib font cache,
- the shared libraries all of that needs (the ``ldd`` closure of the interpreter and of every
  extension module) and a few shell tools for ``!ls`` and commands, copied from the host,
- a handful of ``/etc`` files, empty mount points for ``/workspace``, ``/tmp``, ``/proc``, ``/dev``.

Its name is a hash of everything that went in (the image's recipe hash, the runtime's hash,
and each host file's path, size and mtime): a host upgrade makes a new root for new
sandboxes, and a checkpoint records the root it ran on (``rootfs.json``'s ``version``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time

from ..common import statefile
from .bwrap import MPLCACHE_MOUNT, RUNTIME_MOUNT

# Programs a cell's `!cmd` and a command most often run; those the host lacks are left out.
TOOLS = ("sh", "bash", "ls", "cat", "env", "echo", "head", "tail", "wc", "grep", "sed", "sort", "uniq", "cut",
         "tr", "mkdir", "rmdir", "rm", "cp", "mv", "ln", "touch", "chmod", "find", "xargs", "true", "false",
         "sleep", "id", "pwd", "date", "uname", "tee", "diff", "basename", "dirname", "readlink", "stat", "du",
         "df", "which", "kill", "test", "[", "printf", "seq", "md5sum", "sha256sum", "gzip", "tar", "awk", "mawk",
         "setsid", "nohup", "timeout")
# Loaded with dlopen, so ldd does not list them: glibc needs libgcc_s for thread cancellation.
DLOPENED = ("libgcc_s.so.1",)
ETC_FILES = ("/etc/localtime", "/etc/mime.types", "/etc/ssl/certs/ca-certificates.crt")
MERGED_USR = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Parts of a host interpreter's standard library no sandbox needs: its tests, the static
# library and build files (25 MiB of Debian's 54), the Tk GUI, third-party packages.
STDLIB_LEFT_OUT = ("site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "config-")
# Part of every root's version: bumped when the builder lays a root out differently.
LAYOUT = 4
MOUNT_POINTS = ("/workspace", "/tmp", "/proc", "/dev", "/sys", "/etc")
_LDD_PATH = re.compile(r"(?:=> )?(/\S+) \(0x")


def _ldd(paths: list[str]) -> set[str]:
    found: set[str] = set()
    for chunk in range(0, len(paths), 200):
        out = subprocess.run([shutil.which("ldd", path=f"{os.environ.get('PATH', '')}:/usr/bin:/bin") or "ldd",
                              *paths[chunk:chunk + 200]], capture_output=True, text=True).stdout
        found.update(m.group(1) for m in _LDD_PATH.finditer(out))
    return found


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _elf_files(tree: str) -> list[str]:
    found = []
    for root, _, names in os.walk(tree):
        for name in names:
            path = os.path.join(root, name)
            if ((".so" in name or os.access(path, os.X_OK)) and os.path.isfile(path) and not os.path.islink(path)
                    and _is_elf(path)):
                found.append(path)
    return found


def _library_dirs() -> list[str]:
    # ldconfig lives in /sbin, which an ordinary user's PATH often lacks
    ldconfig = shutil.which("ldconfig", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") or "/sbin/ldconfig"
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    return sorted({os.path.dirname(p) for p in re.findall(r"=> (/\S+)", out)})


def image_trees(image: dict) -> list[tuple[str, str]]:
    """(host tree, sandbox path) of each of the image's trees: each venv layer, the
    interpreter copy."""
    return [(m["tree"], m["path"]) for m in image["mounts"]]


def interpreter_files(image: dict) -> list[str]:
    """The host interpreter of a venv image that carries no copy of it (its prefix readable by
    sandbox uids: an ordinary user's image on Debian's ``/usr/bin/python3``, a root server on
    a world-readable Python): the executables its venv names and its standard library, so
    that the root holds them as they were when it was built, and a host upgrade of Python
    reaches a new root, never a running one. Symlinks to directories are not followed."""
    if image.get("python_copy") or image.get("root"):
        return []
    prefix = image["python_prefix"]
    version = ".".join(image["python_version"].split(".")[:2])
    found = [path for path in (os.path.join(prefix, "bin", f"python{n}") for n in (version, version[0], ""))
             if os.path.lexists(path) and not os.path.isdir(path)]
    stdlib = os.path.join(prefix, "lib", f"python{version}")
    for root, dirs, names in os.walk(stdlib):
        if root == stdlib:
            dirs[:] = [d for d in dirs if not d.startswith(STDLIB_LEFT_OUT)]
        for name in names:
            path = os.path.join(root, name)
            if os.path.isfile(path):  # a regular file, or a link to one (followed by _place)
                found.append(path)
    return sorted(found)


def host_files(image: dict) -> list[str]:
    """Every host file (outside the image) the root needs: tools, libraries, /etc files, and
    the interpreter where the image carries no copy of it (``interpreter_files``)."""
    tools = [shutil.which(t, path="/usr/bin:/bin") for t in TOOLS]
    tools = sorted({t for t in tools if t})
    interpreter = interpreter_files(image)
    trees = [tree for tree, _ in image_trees(image)]
    elves = [path for path in interpreter if _is_elf(path)]
    for tree in trees:
        elves += _elf_files(tree)
    wanted = set(tools) | set(interpreter) | _ldd(tools + elves)
    for name in DLOPENED:
        for d in _library_dirs():
            if os.path.exists(os.path.join(d, name)):
                wanted.add(os.path.join(d, name))
                break
    wanted |= {p for p in ETC_FILES if os.path.exists(p)}
    return sorted(p for p in wanted if not any(p.startswith(d.rstrip("/") + "/") for d in trees))


def version_of(image: dict, runtime_dir: str, files: list[str]) -> str:
    digest = hashlib.sha256()
    digest.update(f"{LAYOUT}\0{image['name']}\0{image['hash']}\0{os.path.basename(runtime_dir)}\0".encode())
    for path in files:
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def _place(root: str, host_path: str) -> None:
    """Put a host file into ``root`` at the same path, recreating the symlinks on the way
    (``/lib`` -> ``usr/lib`` on a merged-/usr system, ``libz.so.1`` -> ``libz.so.1.2.13``)."""
    parts = host_path.strip("/").split("/")
    current = "/"
    for i, part in enumerate(parts):
        current = os.path.join(current, part)
        inside = root + current
        if os.path.islink(current):
            target = os.readlink(current)
            if not os.path.lexists(inside):
                os.makedirs(os.path.dirname(inside), exist_ok=True)
                os.symlink(target, inside)
            resolved = os.path.normpath(os.path.join(os.path.dirname(current), target))
            _place(root, os.path.join(resolved, *parts[i + 1:]))
            return
        if i < len(parts) - 1:
            os.makedirs(inside, exist_ok=True)
    if not os.path.exists(root + current):
        shutil.copy2(current, root + current)


def _link_tree(source: str, dest: str) -> None:
    """Hard-link an immutable image tree (copy when the link fails: another filesystem)."""
    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    shutil.copytree(source, dest, symlinks=True, copy_function=link, dirs_exist_ok=True)


def own_root(image: dict, runtime_dir: str) -> dict:
    """An image on a root of its own (images/debian_root.py) is its own pinned root: the
    same tree the bubblewrap tier binds as /, nothing copied from the host. The runtime and
    the font cache come in as read-only binds (gvisor.write_bundle); the version names what
    a checkpoint's processes had mapped: the image (immutable) and the runtime."""
    tree = next(m["tree"] for m in image["mounts"] if m["path"] == "/")
    digest = hashlib.sha256(f"own-root\0{LAYOUT}\0{image['name']}\0{image['hash']}\0"
                            f"{os.path.basename(runtime_dir)}\0".encode()).hexdigest()[:16]
    return {"path": tree, "version": digest, "image": image["name"], "image_hash": image["hash"],
            "runtime": os.path.basename(runtime_dir), "host_files": 0, "own_root": True}


def _closure_index(rootfs_dir: str, image: dict, runtime_dir: str) -> str:
    """Where the host files of the image's last root are listed: one list per image, runtime
    and builder (what it looks for: a new tool makes a new list)."""
    builder = hashlib.sha256(repr((LAYOUT, TOOLS, DLOPENED, ETC_FILES)).encode()).hexdigest()[:8]
    return os.path.join(rootfs_dir, f".{image['name']}-{image['hash']}-{os.path.basename(runtime_dir)}-{builder}.files.json")


def _known(rootfs_dir: str, image: dict, runtime_dir: str) -> dict | None:
    """The root built from the host files the image's last root was built from, if those
    files are still as they were (same sizes and times: the same version): finding the files
    runs ldd over every extension module of the image, seconds on a busy host, while their
    stat calls take a millisecond. A changed file (an upgraded library or tool) gives another
    version, and the closure is then found again."""
    index = statefile.read_json(_closure_index(rootfs_dir, image, runtime_dir))
    if index is None:
        return None
    try:
        version = version_of(image, runtime_dir, index["files"])
    except (OSError, KeyError, TypeError):
        return None
    return statefile.read_json(os.path.join(rootfs_dir, version, "rootfs.json"))


def ensure(rootfs_dir: str, image: dict, runtime_dir: str) -> dict:
    """The root for ``image`` (built now if it is not there yet): ``{"path", "version"}``."""
    if image.get("root"):
        return own_root(image, runtime_dir)
    rootfs_dir = os.path.realpath(rootfs_dir)  # the record's paths must outlive a link that led here
    record = _known(rootfs_dir, image, runtime_dir)
    if record is not None:
        return record
    files = host_files(image)
    version = version_of(image, runtime_dir, files)
    os.makedirs(rootfs_dir, mode=0o755, exist_ok=True)
    record = statefile.read_json(os.path.join(rootfs_dir, version, "rootfs.json"))
    if record is None:
        with open(os.path.join(rootfs_dir, f".{version}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            record = statefile.read_json(os.path.join(rootfs_dir, version, "rootfs.json"))
            if record is None:
                record = _build(os.path.join(rootfs_dir, version), image, runtime_dir, files, version)
    statefile.write_json(_closure_index(rootfs_dir, image, runtime_dir), {"files": files}, mode=0o644)
    return record


def _build(target: str, image: dict, runtime_dir: str, files: list[str], version: str) -> dict:
    started = time.time()
    tmp = target + ".building"
    shutil.rmtree(tmp, ignore_errors=True)
    root = os.path.join(tmp, "root")
    os.makedirs(root)
    for name in MERGED_USR:  # /bin -> usr/bin and the like, as on the host
        if os.path.islink("/" + name):
            os.symlink(os.readlink("/" + name), os.path.join(root, name))
    for path in files:
        _place(root, path)
    for source, tree in image_trees(image):
        _link_tree(source, root + tree)
    _link_tree(runtime_dir, root + RUNTIME_MOUNT)
    if image.get("mplcache"):
        _link_tree(image["mplcache"], root + MPLCACHE_MOUNT)
    for d in MOUNT_POINTS:
        os.makedirs(root + d, exist_ok=True)
    for name in ("passwd", "group"):  # each sandbox binds its own over these
        open(os.path.join(root, "etc", name), "wb").close()
    os.chmod(root, 0o755)
    record = {"path": os.path.join(target, "root"), "version": version, "image": image["name"],
              "image_hash": image["hash"], "runtime": os.path.basename(runtime_dir), "host_files": len(files),
              "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "build_seconds": round(time.time() - started, 2)}
    statefile.write_json(os.path.join(tmp, "rootfs.json"), record, mode=0o644)
    os.rename(tmp, target)
    return record
