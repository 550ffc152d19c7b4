"""A sandbox's host resources: what it holds on the host outside its process tree.

Its cgroup (memory, pids, cpu), the rlimits that stand in for missing cgroup
controllers, and its workspace's filesystem image. The supervisor acquires them before
its backend starts the sandbox and releases them in its teardown; a sandbox whose
supervisor died without a teardown is released from its state record
(``HostResources.left_behind``) by the server, and by the benchmarks after a run.
"""

from __future__ import annotations

import os
import resource
import sys

from ..runtime import vocabulary as V
from . import cgroups, disk, gvisor, workspace_store


# How long a paused sandbox's workspace may take to be free of its last run (a lazily
# detached mount writing its last data) before a restore or a fork gives up on it.
SETTLE_SECONDS = 30.0


def workspace_dir(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "workspace")


def workspace_image(sandbox_dir: str) -> str:
    return os.path.join(sandbox_dir, "workspace.img")


class HostResources:
    """What a sandbox holds on the host outside its process tree: its cgroup and its
    workspace's filesystem image, with the baselines its death is diagnosed against."""

    def __init__(self, sandbox_dir: str, spec: dict):
        self.spec = spec
        self.workspace = workspace_dir(sandbox_dir)
        self.workspace_image = workspace_image(sandbox_dir)
        self.cgroup: cgroups.SandboxCgroup | None = None
        self.oom_baseline = 0
        self.pids_baseline = 0
        self.rlimits: list[tuple[int, int]] = []

    def acquire(self, isolation: dict, restoring: bool = False) -> None:
        """Create the cgroup and the workspace filesystem (mount the kept one when
        ``restoring`` a paused sandbox); report both in ``isolation``."""
        spec, limits = self.spec, self.spec["limits"]
        support = cgroups.detect() if spec.get("use_cgroups", True) else cgroups.CgroupSupport(None, {}, "disabled")
        enforced: dict[str, str] = {}
        if support.version:
            self.cgroup = cgroups.SandboxCgroup(support, spec["id"])
            enforced = self.cgroup.create(limits.get("memory_mb"), self.cgroup_pids(limits), limits.get("cpus"))
            self.oom_baseline = self.cgroup.oom_kills()
            self.pids_baseline = self.cgroup.pids_limit_hits()
        self.rlimits = self._rlimits(support)
        for res, _ in self.rlimits:
            name = {resource.RLIMIT_NPROC: "pids", resource.RLIMIT_AS: "memory"}.get(res)
            if name and name not in enforced:
                enforced[name] = "rlimit"
        for key in ("memory", "pids", "cpu"):
            enforced.setdefault(key, "none")
        if self.in_gvisor and limits.get("pids"):
            # The code's limit is the Sentry's RLIMIT_NPROC; the host cgroup only a ceiling
            # for gVisor's own tasks (isolation/gvisor.py, host_pids_ceiling).
            host = enforced["pids"]
            ceiling = self.cgroup_pids(limits) if host.startswith("cgroup") else None
            enforced["pids"] = (f"gVisor's Sentry (RLIMIT_NPROC {int(limits['pids'])}: fork and clone fail with EAGAIN "
                                f"past it; " + (f"host {host} ceiling of {ceiling} tasks for gVisor's own)"
                                                if ceiling else "no host ceiling: no pids cgroup)"))
            isolation["pids_host_ceiling"] = ceiling
        store = spec.get("workspace_store")  # the state directory whose store holds the image, or None
        if spec.get("disk_quota") and restoring:
            if store and workspace_store.in_store(self.workspace_image):
                workspace_store.ensure(store)  # mounted again after a reboot
            if not disk.wait_free(self.workspace_image, SETTLE_SECONDS):  # two mounts of one image corrupt it
                raise RuntimeError(disk.held_reason("the workspace image", self.workspace))
            disk.mount(self.workspace_image, self.workspace)
            disk_mode = f"ext4 loop filesystem of {limits['disk_mb']} MiB"
        elif spec.get("disk_quota"):
            if store:
                workspace_store.place(store, spec["id"], self.workspace_image)
            disk.create(self.workspace_image, self.workspace, limits["disk_mb"], spec.get("uid"))
            disk_mode = f"ext4 loop filesystem of {limits['disk_mb']} MiB"
        else:
            disk_mode = "none (plain directory)"
        if spec.get("disk_quota") and workspace_store.in_store(self.workspace_image):
            disk_mode += " in a store whose copies share blocks (a fork's workspace costs no copy)"
        isolation.update({"cgroup": support.version or "none", "cgroup_detail": support.reason, **enforced,
                          "host_uid": spec.get("uid"), "disk": disk_mode})

    @property
    def in_gvisor(self) -> bool:
        return self.spec.get("isolation_backend") == V.GVISOR

    def cgroup_pids(self, limits: dict) -> int | None:
        """The cgroup's pids.max for ``limits``: their ``pids`` (bwrap), or under gVisor, whose
        own host tasks (the Sentry's threads, the gofer, ptrace stubs) count there and which
        holds the code to ``pids`` itself, a ceiling above it."""
        pids = limits.get("pids")
        if pids and self.in_gvisor:
            return gvisor.host_pids_ceiling(pids)
        return pids

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

    def child_setup(self, as_root: bool = False):
        """What the forked child does before it executes the backend's tool: join the
        cgroup and, unless the tool must run as root (runsc, whose container carries its
        own rlimits and uid), set the rlimits and drop to the sandbox's uid."""
        cgroup, rlimits, uid = self.cgroup, self.rlimits, self.spec.get("uid")
        if as_root:
            rlimits, uid = [], None

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

    def kill_processes(self) -> None:
        """Every process left in the cgroup (a sandbox's forks may outlive its pid 1)."""
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def release(self, keep_workspace: bool = False) -> None:
        """Give it all back: kill what is left in the cgroup and remove it, unmount and
        delete the workspace image (only unmount it with ``keep_workspace``: a paused
        sandbox's files wait on disk for its restore). Safe on resources half acquired, and twice."""
        self.kill_processes()
        if self.cgroup is not None:
            self.cgroup.remove()
        if keep_workspace:  # and written to its image before a restore or a fork reads it
            if not disk.unmount(self.workspace, SETTLE_SECONDS, self.workspace_image):
                print(f"supervisor: the workspace is still held {SETTLE_SECONDS:g} s after its sandbox stopped; "
                      "its restore or fork waits for it", file=sys.stderr, flush=True)
        else:
            disk.destroy(self.workspace_image, self.workspace)

    @classmethod
    def left_behind(cls, sandbox_dir: str, record: dict) -> "HostResources":
        """What a sandbox whose supervisor is gone (killed, or ended before its teardown)
        may have left on the host, from its state record: the one teardown for the
        server's re-adoption and for tools that clean up after a run."""
        resources = cls(sandbox_dir, {})
        if record.get("cgroup_dirs"):
            resources.cgroup = cgroups.SandboxCgroup.from_dirs(record["cgroup_dirs"])
        return resources
