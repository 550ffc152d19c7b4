"""Starting sandboxes: the runtime copy, a sandbox's directory and spec, its host uid, its
supervisor process (fresh, or restored from a checkpoint with ``--restore``), forked by the
supervisor template where it runs (supervisor_template.py), else a new interpreter.

The supervisor gets a clean environment and reports on a pipe once it is ready (its
state) or why it could not start; a sandbox that fails to start is filed as ended and its
logs kept in its directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys

from ..common import statefile
from ..isolation import testonly
from .config import ServiceConfig
from ..egress.policy import EgressPolicy
from ..egress.service import EgressService
from ..common.errors import ApiError
from .handles import Handle
from ..common.ids import new_sandbox_id
from ..images.images import ImageStore
from ..isolation import bwrap, bwrap_root, disk, gvisor, host, workspace_store
from ..common.paths import (SUPERVISOR_DIR_ENV, SUPERVISOR_LOG, SUPERVISOR_MODULE, SUPERVISOR_TEMPLATE_LOG, StateDir,
                            open_private_log)
from .registry import Registry
from ..runtime import vocabulary as V
from .supervisor_template import SupervisorTemplate

log = logging.getLogger("sandbox.core.manager")


def runtime_source() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime")


def install_runtime(runtimes_dir: str) -> str:
    """Copy the in-sandbox runtime where sandbox uids can read it, keyed by its content."""
    src = runtime_source()
    files = sorted(f for f in os.listdir(src) if f.endswith(".py"))
    digest = hashlib.sha256()
    for name in files:
        with open(os.path.join(src, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    dest = os.path.join(runtimes_dir, digest.hexdigest()[:16])
    pkg = os.path.join(dest, "sandbox_runtime")
    if not os.path.isdir(pkg):
        tmp = dest + f".tmp{os.getpid()}"
        os.makedirs(os.path.join(tmp, "sandbox_runtime"), exist_ok=True)
        for name in files:
            shutil.copy(os.path.join(src, name), os.path.join(tmp, "sandbox_runtime", name))
            os.chmod(os.path.join(tmp, "sandbox_runtime", name), 0o644)
        os.chmod(os.path.join(tmp, "sandbox_runtime"), 0o755)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, dest)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def pins(image: dict) -> bool:
    """Whether a bwrap sandbox of ``image`` runs on its pinned root: every venv image does,
    whether it carries a copy of its interpreter or its root copies the host's (an ordinary
    user's image on Debian's ``/usr/bin/python3``: rootfs.interpreter_files). An image on a
    Debian root of its own is its own root already."""
    return not image.get("root")


def supervisor_env() -> dict[str, str]:
    """The environment every supervisor starts with (the template's too): the server's
    own is not passed on (its token, its settings), only what finding Python needs."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH")}


def choose_backend(config: ServiceConfig, request: dict) -> str:
    """The isolation a create asks for (else the server's default), checked before anything starts."""
    backend = request.get("isolation") or config.default_isolation
    if backend == V.GVISOR:
        ok, why = gvisor.available()
        if not ok:
            # Said so that a notebook's first cell on "Python (sandbox, gVisor)" names the way on.
            raise ApiError(422, "invalid_request", f"isolation 'gvisor' is not available on this server: {why}; the "
                           "bwrap tier is (in Jupyter: the kernel \"Python (sandbox)\"; through the API: no "
                           "isolation, or 'bwrap')")
    if request.get("egress") and backend == V.GVISOR:
        raise ApiError(422, "invalid_request", "egress is not available with isolation 'gvisor' yet (its proxy "
                                               "reaches the sandbox through a host socket, which a checkpoint cannot save)")
    if request.get("on_idle") == V.ON_IDLE_PAUSE and backend != V.GVISOR:
        raise ApiError(422, "invalid_request", "on_idle 'pause' needs isolation 'gvisor' (only a gVisor sandbox "
                                               "can be checkpointed)")
    return backend


def preload_of(image_info: dict, pooled: bool, config: ServiceConfig) -> list[str]:
    """The modules a new sandbox imports before its first cell: the image's preload, for a
    warm-pool sandbox only (unless ``pool_preload`` is off). Preloading pays the imports
    ahead, while nobody waits, so that a claimed sandbox's first `import pandas` is instant;
    a sandbox started for a caller who waits (none warm, the gVisor tier, egress) would make
    them wait for imports they may never use (about a CPU-second; a gVisor create took 3.7 s
    with them, 2.2 s without), so it imports on first use instead. Each preloaded warm
    sandbox holds about 80 MiB more (the default image's three)."""
    return list(image_info.get("preload", [])) if pooled and config.pool_preload else []


class Launcher:
    def __init__(self, config: ServiceConfig, state_dir: StateDir, images: ImageStore, registry: Registry,
                 egress: EgressService):
        self.config = config
        self.state_dir = state_dir
        self.images = images
        self.registry = registry
        self.egress = egress
        self.root = os.geteuid() == 0
        self.disk_quota = disk.available()[0]
        self.workspace_store: str | None = None  # where gVisor workspaces live: see prepare()
        self.runtime_dir = ""
        self.bwrap_path: str | None = None
        self.bwrap_version: list[int] | None = None
        self.pinned_roots: dict[tuple[str, str], dict] = {}  # (image, its hash) -> bwrap_root.ensure's view
        self.pinned_root_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.template = SupervisorTemplate(os.path.join(state_dir.root, SUPERVISOR_TEMPLATE_LOG))

    def prepare(self) -> None:
        """Blocking start-up work: the runtime copy and the server's own bwrap."""
        self.runtime_dir = install_runtime(self.state_dir.runtimes)
        # gVisor sandboxes fork: their workspaces go to a store that shares blocks, unless
        # the state directory's own filesystem already does (or no store can be made here)
        if (self.config.workspace_store and self.disk_quota and workspace_store.available()[0]
                and not workspace_store.shares_blocks(self.state_dir.root)):  # (not in sandboxes/: re-adoption reads it)
            self.workspace_store = self.state_dir.root
        binary = bwrap.discover()
        self.bwrap_path = bwrap.install_copy(binary, os.path.join(self.state_dir.root, "bwrap")) if binary else None
        self.bwrap_version = list(binary.version) if binary else None

    def start_template(self) -> None:
        """Start the supervisor template (``supervisor_template``), off any request's path."""
        if self.config.supervisor_template:
            self.template.start(supervisor_env())

    def allocate_uid(self) -> int | None:
        """A host uid no live sandbox has (a root server only: otherwise all run as the server)."""
        if not self.root:
            return None
        used = {h.uid for h in self.registry.live.values()}
        for _ in range(1000):
            uid = self.config.uid_base + secrets.randbelow(self.config.uid_count)
            if uid not in used:
                return uid
        raise ApiError(503, "unavailable", "no free sandbox uid")

    async def spawn(self, image: str, limits: dict, ttl: int, max_life: int, *, pooled: bool,
                    metadata: dict | None = None, egress: EgressPolicy | None = None, owner: int | None = None,
                    isolation: str = V.BWRAP, on_idle: str = V.ON_IDLE_DELETE) -> Handle:
        image_info = self.images.get(image)  # image.json, read once per sandbox
        system_root = (await self.pinned_root(image_info)
                       if isolation == V.BWRAP and self.config.bwrap_system == "pinned" and pins(image_info)
                       else None)
        sandbox_id = new_sandbox_id(self.config.node_id)
        d = self.state_dir.sandbox(sandbox_id)
        os.makedirs(d, mode=0o711)
        os.chmod(d, 0o711)
        uid = self.allocate_uid()
        workspace = host.workspace_dir(d)
        os.makedirs(workspace, mode=0o700)
        if uid is not None:
            os.chown(workspace, uid, uid)
        spec = {
            "id": sandbox_id, "image": image, "image_info": image_info, "uid": uid,
            "limits": limits, "ttl_seconds": ttl, "max_lifetime_seconds": max_life,
            "pooled": pooled, "preload": preload_of(image_info, pooled, self.config),
            "metadata": metadata or {}, "runtime_dir": self.runtime_dir,
            "workspace": workspace, "seccomp": self.config.seccomp, "use_cgroups": self.root,
            "disk_quota": self.disk_quota, "bwrap_path": self.bwrap_path, "bwrap_version": self.bwrap_version,
            "unsafe_test_only_layers_off": testonly.honoured(self.config),
            "isolation_backend": isolation, "on_idle": on_idle,
            "workspace_store": self.workspace_store if isolation == V.GVISOR else None,
            "usage_record_seconds": self.config.usage_record_seconds,
        }
        if system_root is not None:
            spec["bwrap_root"] = system_root
        if egress is not None:
            spec["egress"] = await self.egress.prepare(sandbox_id, d, egress, uid, owner)
        statefile.write_json(os.path.join(d, "spec.json"), spec)
        # Until the supervisor reports, a pool sandbox must already look pooled (hidden from
        # GET /v1/sandboxes and from get), not like a user's sandbox with no state.
        handle = Handle(sandbox_id, d, image, uid, record={"state": V.POOLED if pooled else V.BOOTING})
        ready = await self.start_supervisor(handle)
        if not ready.get("ok"):
            self.egress.close(sandbox_id)
            await self.registry.wait_for_exit(handle)
            self.registry.live.pop(sandbox_id, None)
            self.registry.ended.pop(sandbox_id, None)
            log.error("sandbox %s failed to start: %s (logs kept in %s)", sandbox_id, ready.get("error"), d)
            raise ApiError(503, "unavailable", f"the sandbox could not start: {ready.get('error')}")
        handle.record = ready["state"]
        return handle

    async def pinned_root(self, image_info: dict) -> dict:
        """The bwrap view of the image's pinned root, built (in a thread) by the first sandbox
        of the image in this state directory, which is the warm pool's for the default image,
        then remembered: finding a root's version runs ldd over the whole image (about a
        second), too slow for every create. A host upgrade reaches sandboxes once the server
        restarts (the root's version names the host files' sizes and times)."""
        key = (image_info["name"], image_info["hash"])
        async with self.pinned_root_locks.setdefault(key, asyncio.Lock()):
            if key not in self.pinned_roots:
                try:
                    self.pinned_roots[key] = await asyncio.to_thread(
                        bwrap_root.ensure, os.path.join(self.state_dir.root, "rootfs"), image_info, self.runtime_dir,
                        pack=self.root)
                except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
                    log.error("the pinned root of image %s could not be built: %s", key[0], exc)
                    raise ApiError(503, "unavailable", f"the pinned root of image {key[0]!r} could not be built "
                                   f"({exc}); a server with bwrap_system=host runs on the host's /usr") from None
        return self.pinned_roots[key]

    async def start_supervisor(self, handle: Handle, *extra: str) -> dict:
        """Start a sandbox's supervisor (``--restore``: from its checkpoint) and return what
        it reported once ready (``ok``, ``state``) or why it could not start."""
        d, sandbox_id = handle.dir, handle.id
        read_fd, write_fd = os.pipe()
        log_file = open_private_log(os.path.join(d, SUPERVISOR_LOG))
        try:
            # Forked by the template (handled by pid, like a re-adopted one), else a process of its own.
            handle.process = None
            handle.pid = (await asyncio.to_thread(self.template.fork, d, write_fd, log_file.fileno(), list(extra))
                          if self.template.running else None)
            if handle.pid is None:
                handle.process = _popen_supervisor(d, write_fd, log_file, extra)
                handle.pid = handle.process.pid
        finally:
            os.close(write_fd)
            log_file.close()
        self.registry.live[sandbox_id] = handle
        line = await asyncio.to_thread(_read_line, read_fd)
        try:
            ready = json.loads(line) if line else {"ok": False, "error": "the supervisor exited during start-up"}
        except ValueError:
            ready = {"ok": False, "error": f"the supervisor said: {line[:200]!r}"}
        return ready


def _popen_supervisor(d: str, write_fd: int, log_file, extra: tuple[str, ...]) -> subprocess.Popen:
    """A supervisor as a new interpreter (where no template forks one)."""
    env = supervisor_env()
    env[SUPERVISOR_DIR_ENV] = d  # not in argv: other users read every command line in ps, and d names the id
    return subprocess.Popen(
        [sys.executable, "-m", SUPERVISOR_MODULE, "--ready-fd", str(write_fd), *extra],
        pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
        start_new_session=True, env=env, cwd="/",
    )


def _read_line(fd: int) -> str:
    with os.fdopen(fd, "rb") as f:
        line = f.readline()
    return line.decode("utf-8", "replace").strip()
