"""The gvisor backend: ``runsc run`` (or ``runsc restore``) in the foreground, as the
supervisor's child; the runtime's channel is the container's stdin and stdout.

What runsc runs and how (the bundle, the pinned root, the flags) is in
``sandbox/isolation/gvisor.py``; what a checkpoint was taken under, in
``sandbox/isolation/checkpoints.py``. runsc needs root: it runs as root inside the sandbox's cgroup
(``child_setup`` only joins it), and the code inside runs as the sandbox's own uid.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
from typing import Callable

from .. import checkpoints
from .. import gvisor
from .base import STDIO, Launch


class GvisorBackend:
    name = "gvisor"
    channel = STDIO
    as_root = True

    async def spawn(self, launch: Launch) -> asyncio.subprocess.Process:
        spec, sandbox_dir, isolation = launch.spec, launch.sandbox_dir, launch.isolation
        binary = gvisor.discover()
        if binary is None:
            raise RuntimeError("the gvisor backend needs runsc (apt-get install runsc)")
        if launch.restore:
            record = checkpoints.read(sandbox_dir)
            root = isolation.get("rootfs_version"), isolation.get("rootfs_path")
            checkpoints.check_restorable(record, binary.version, spec, root[0], os.path.isdir(root[1] or "/nonexistent"))
            argv = gvisor.restore_argv(binary, sandbox_dir, spec, checkpoints.image_path(sandbox_dir))
        else:
            root = await asyncio.to_thread(gvisor.ensure_root, spec)
            await asyncio.to_thread(gvisor.write_bundle, sandbox_dir, spec, root)
            isolation.update({
                "backend": self.name,
                "runsc_version": binary.version,
                "platform": gvisor.PLATFORM,
                "kernel": "gVisor's Sentry (the host kernel serves only its filtered calls)",
                "rootfs": f"the image's own, pinned and read-only (version {root['version']})",
                "rootfs_version": root["version"],
                "rootfs_path": root["path"],
                "seccomp": "gVisor's own filters on the Sentry and the gofer",
                "network": "none (runsc --network=none: loopback only)",
                "user_namespace": True,
            })
            argv = gvisor.run_argv(binary, sandbox_dir, spec)
        gvisor.clear_container_state(sandbox_dir)
        return await asyncio.create_subprocess_exec(
            *argv, preexec_fn=_dying_with_the_supervisor(launch.child_setup), env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, cwd=sandbox_dir,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )


PR_SET_PDEATHSIG = 1


def _dying_with_the_supervisor(child_setup: Callable[[], None]) -> Callable[[], None]:
    """``child_setup``, then SIGKILL for runsc when its supervisor dies (bwrap's
    ``--die-with-parent``): runsc's sandbox and gofer end with ``runsc run`` (it starts them
    attached), so a sandbox whose code ignores its closed channel cannot outlive a
    supervisor killed while no server is left to reap it."""

    def setup() -> None:
        child_setup()
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")

    return setup
