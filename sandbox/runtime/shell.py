"""The interactive shell a sandbox runs: IPython's own, with output turned into events."""

from __future__ import annotations

from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from . import vocabulary as V
from .display import EventDisplayHook, EventDisplayPublisher


class SandboxShell(InteractiveShell):
    """InteractiveShell whose tracebacks become one ``error`` event per failing cell."""

    runtime = None

    def _showtraceback(self, etype, evalue, stb):
        self.runtime.publish_error(etype, evalue, stb)

    def ask_exit(self):
        # exit()/quit() in a cell would end the shell; a sandbox ends by delete or TTL.
        self.runtime.publish_stream(V.STDERR, "exit() has no effect in a sandbox; delete the sandbox to end it.\n")

    def enable_gui(self, gui=None):
        if gui not in (None, "inline"):
            raise RuntimeError("GUI event loops are not available in a sandbox")


def make_shell(runtime) -> SandboxShell:
    config = Config()
    config.HistoryManager.enabled = False  # in-memory history: nothing written to disk
    shell = SandboxShell.instance(
        config=config,
        displayhook_class=EventDisplayHook,
        display_pub_class=EventDisplayPublisher,
        colors="linux",
    )
    shell.runtime = runtime
    shell.displayhook.runtime = runtime
    shell.display_pub.runtime = runtime
    return shell
