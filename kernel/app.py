"""The kernel process: ipykernel's application, minus the parts a wrapper kernel has no use for."""

from __future__ import annotations

import os
import typing as t

from ipykernel.kernelapp import IPKernelApp
from traitlets import DottedObjectName, default

from .kernel import SandboxKernel
from .parent_watch import watch_for


class SandboxKernelApp(IPKernelApp):
    """IPKernelApp without the parts that cost every cell and serve no wrapper kernel.

    It leaves the process's own stdout and stderr alone. Cell output comes from the
    sandbox and is published message by message; nothing a cell does writes to this
    process's streams. ipykernel would still replace them with `OutStream`s (and watch
    fds 1 and 2 with a thread), and every execute_request then flushes both with a round
    trip to the IOPub thread: a cost on every cell for output that never exists. Left
    alone, whatever this process prints (warnings, logs) goes to the kernel's log, where
    it belongs, rather than into someone's notebook.
    """

    outstream_class = DottedObjectName(None, allow_none=True).tag(config=True)

    def init_sockets(self) -> None:
        """No shell-channel thread: shell messages are handled on the main loop itself.

        ipykernel 7 reads the shell socket in a thread of its own, to route messages to
        subshells, and hands each one to the main thread and each reply back over inproc
        sockets: two thread hops per request. Subshells let a kernel run code concurrently
        with a running cell; a sandbox runs one cell at a time, so this kernel does not
        offer them (kernel_info then leaves "kernel subshells" out of its features).
        """
        super().init_sockets()
        self.shell_channel_thread = None

    @default("parent_handle")
    def _parent_handle_default(self) -> int:
        """JPY_PARENT_PID as the process is at start-up: ipykernel reads it when its module
        is imported, which in a forked kernel was the fork server, long before this
        kernel's environment existed."""
        return int(os.environ.get("JPY_PARENT_PID") or 0)

    def init_poller(self) -> None:
        """Watch the Jupyter server itself when it is not this process's parent (a kernel
        forked by the fork server: kernel/parent_watch.py), else as ipykernel does."""
        watch = watch_for(self.parent_handle)
        if watch is None:
            super().init_poller()
        else:
            self.poller = watch

    def initialize(self, argv: t.Any = None) -> None:
        """The logger at the level its handlers keep.

        traitlets sets the application's logger to DEBUG and filters at its handlers
        (WARNING unless --log-level says otherwise), so each of the debug lines ipykernel's
        message loop logs for every request built a record that nothing kept.
        """
        super().initialize(argv)
        levels = [handler.level for handler in self.log.handlers]
        if levels and all(levels):  # a handler at NOTSET keeps everything: leave it so
            self.log.setLevel(min(levels))


def main() -> None:
    SandboxKernelApp.launch_instance(kernel_class=SandboxKernel)
