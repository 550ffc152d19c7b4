"""Launching a sandbox: the host resources it holds, its backend's process, its first frame.

Every backend shares what is set up here: the cgroup (memory, pids, cpu), the rlimits
that stand in for missing cgroup controllers, the workspace's filesystem image, the
channel's socket pair and the capped runtime log. The isolation tool itself is the
backend's (``sandbox/backends``).
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
from dataclasses import dataclass

from .. import testonly
from ..backends import Launch, backend_for
from ..isolation import cgroups, disk
from ..runtime import framecheck
from ..runtime import vocabulary as V
from ..runtime.protocol import ProtocolError, read_payload

RUNTIME_LOG_BYTES = 1024 * 1024
RUNTIME_READY_TIMEOUT = 180.0


class HostResources:
    """What a sandbox holds on the host outside its process tree: its cgroup and its
    workspace's filesystem image, with the baselines its death is diagnosed against."""

    def __init__(self, sandbox_dir: str, spec: dict):
        self.spec = spec
        self.workspace_image = os.path.join(sandbox_dir, "workspace.img")
        self.cgroup: cgroups.SandboxCgroup | None = None
        self.oom_baseline = 0
        self.pids_baseline = 0
        self.rlimits: list[tuple[int, int]] = []

    def acquire(self, isolation: dict) -> None:
        """Create the cgroup and the workspace filesystem; report both in ``isolation``."""
        spec, limits = self.spec, self.spec["limits"]
        support = cgroups.detect() if spec.get("use_cgroups", True) else cgroups.CgroupSupport(None, {}, "disabled")
        enforced: dict[str, str] = {}
        if support.version:
            self.cgroup = cgroups.SandboxCgroup(support, spec["id"])
            enforced = self.cgroup.create(limits.get("memory_mb"), limits.get("pids"), limits.get("cpus"))
            self.oom_baseline = self.cgroup.oom_kills()
            self.pids_baseline = self.cgroup.pids_limit_hits()
        self.rlimits = self._rlimits(support)
        for res, _ in self.rlimits:
            name = {resource.RLIMIT_NPROC: "pids", resource.RLIMIT_AS: "memory"}.get(res)
            if name and name not in enforced:
                enforced[name] = "rlimit"
        for key in ("memory", "pids", "cpu"):
            enforced.setdefault(key, "none")
        if spec.get("disk_quota"):
            disk.create(self.workspace_image, spec["workspace"], limits["disk_mb"], spec.get("uid"))
            disk_mode = f"ext4 loop filesystem of {limits['disk_mb']} MiB"
        else:
            disk_mode = "none (plain directory)"
        isolation.update({"cgroup": support.version or "none", "cgroup_detail": support.reason, **enforced,
                          "host_uid": spec.get("uid"), "disk": disk_mode})

    @property
    def cgroup_dirs(self) -> list[str]:
        return sorted(set(self.cgroup.dirs.values())) if self.cgroup is not None else []

    def _rlimits(self, support: cgroups.CgroupSupport) -> list[tuple[int, int]]:
        limits = self.spec["limits"]
        rl = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, int(limits["open_files"]))]
        if limits.get("file_mb"):
            rl.append((resource.RLIMIT_FSIZE, int(limits["file_mb"]) * 1024 * 1024))
        if "pids" not in support.parents and self.spec.get("uid") is not None and limits.get("pids"):
            rl.append((resource.RLIMIT_NPROC, int(limits["pids"])))
        if "memory" not in support.parents and limits.get("memory_mb"):
            # Address space, not resident memory: a blunt fallback, reported as such.
            rl.append((resource.RLIMIT_AS, (int(limits["memory_mb"]) + 2048) * 1024 * 1024))
        return rl

    def child_setup(self):
        """What the forked child does before it executes the backend's tool."""
        cgroup, rlimits, uid = self.cgroup, self.rlimits, self.spec.get("uid")

        def in_child() -> None:
            if cgroup is not None:
                cgroup.join()
            for res, value in rlimits:
                resource.setrlimit(res, (value, value))
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

        return in_child

    async def kill_processes(self) -> None:
        """Every process left in the cgroup (a sandbox's forks may outlive its pid 1)."""
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.kill_all)


@dataclass
class Launched:
    proc: asyncio.subprocess.Process
    channel: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ready: dict
    log_task: asyncio.Task


async def launch(sandbox_dir: str, spec: dict, host: HostResources, isolation: dict) -> Launched:
    """Start the sandbox (its host resources acquired) and wait for its runtime's `ready`;
    the backend completes ``isolation``.

    Raises RuntimeError saying why (LaunchFailed, with the runtime log's tail, once there
    is a process to end) if it does not start.
    """
    backend = backend_for(spec)
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    plan = Launch(spec=spec, channel_fd=child_sock.fileno(), child_setup=host.child_setup(), isolation=isolation)
    try:
        proc = await backend.spawn(plan)
    finally:
        # The channel's socket object closes its own fd: an os.close() here would leave the
        # object to close the same number again when it is collected, by then quite
        # possibly the control socket's listener.
        child_sock.close()
    isolation.update(testonly.isolation_notes(spec))
    log_task = asyncio.create_task(keep_log(proc.stdout, runtime_log(sandbox_dir)))
    reader, writer = await asyncio.open_unix_connection(sock=parent_sock)
    launched = Launched(proc, (reader, writer), {}, log_task)
    try:
        ready = framecheck.load(await asyncio.wait_for(read_payload(reader, framecheck.FRAME_SLACK),
                                                       RUNTIME_READY_TIMEOUT))
    except (EOFError, asyncio.TimeoutError, ProtocolError) as exc:
        code = await exit_code(proc, 1.0)
        raise LaunchFailed(launched, f"the sandbox runtime did not start ({type(exc).__name__}, exit code {code}); "
                                     f"see {runtime_log(sandbox_dir)}: {log_tail(sandbox_dir)}") from None
    if ready.get("type") != V.READY:
        raise LaunchFailed(launched, f"unexpected first frame from the runtime: {ready.get('type')!r}")
    launched.ready = ready
    return launched


class LaunchFailed(RuntimeError):
    """The process started but its runtime never became ready: the caller still owns it."""

    def __init__(self, launched: Launched, message: str):
        super().__init__(message)
        self.launched = launched


def runtime_log(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "runtime.log")


def log_tail(sandbox_dir: str, n: int = 800) -> str:
    try:
        with open(runtime_log(sandbox_dir), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


async def exit_code(proc: asyncio.subprocess.Process, wait: float) -> int | None:
    try:
        return await asyncio.wait_for(proc.wait(), wait)
    except asyncio.TimeoutError:
        return None


async def keep_log(stream: asyncio.StreamReader, path: str) -> None:
    """bwrap's and the runtime's own diagnostics, kept up to a cap: the sandbox writes
    them, so they must not become a way around its disk limit."""
    written = 0
    with open(path, "ab") as log:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            if written < RUNTIME_LOG_BYTES:
                chunk = chunk[:RUNTIME_LOG_BYTES - written]
                log.write(chunk)
                log.flush()
                written += len(chunk)
                if written >= RUNTIME_LOG_BYTES:
                    log.write(b"\n[runtime log truncated]\n")
