"""The interactive shell a sandbox runs: IPython's own, with output turned into events."""

from __future__ import annotations

from IPython.core import page, payloadpage
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from . import hints
from . import vocabulary as V
from .display import EventDisplayHook, EventDisplayPublisher
from .frontend import KernelStandIn


# The colour scheme of tracebacks: ipykernel's (it keeps InteractiveShell's default).
TRACEBACK_COLORS = "neutral"


class SandboxShell(InteractiveShell):
    """InteractiveShell whose tracebacks become one ``error`` event per failing cell."""

    runtime = None
    kernel = None  # frontend.KernelStandIn: what ipywidgets looks for on get_ipython()

    def _showtraceback(self, etype, evalue, stb):
        hint = hints.for_exception(evalue) if isinstance(evalue, BaseException) else None
        self.runtime.publish_error(etype, evalue, list(stb) + [hint] if hint else stb)

    def system(self, cmd):
        """``!cmd`` and ``%pip``: as IPython runs them, then a hint when pip failed offline."""
        super().system(cmd)
        hint = hints.after_command(cmd, self.user_ns.get("_exit_code", 0))
        if hint:
            self.runtime.publish_stream(V.STDERR, hint + "\n")

    def ask_exit(self):
        # exit()/quit() in a cell would end the shell; a sandbox ends by delete or TTL.
        self.runtime.publish_stream(V.STDERR, "exit() has no effect in a sandbox; delete the sandbox to end it.\n")

    def set_next_input(self, text, replace=False):
        """``%load``: the frontend puts the text in the next cell (a payload, as ipykernel)."""
        self.payload_manager.write_payload({"source": "set_next_input", "text": text, "replace": replace})

    def get_parent(self):
        """The frontend's request being run, as ipykernel's shell says it (ipywidgets'
        ``Output`` widget captures output by its id)."""
        return self.kernel.get_parent()

    def set_parent(self, parent):
        pass  # the runtime knows which request runs

    def enable_gui(self, gui=None):
        if gui not in (None, "inline"):
            raise RuntimeError("GUI event loops are not available in a sandbox")


def make_shell(runtime) -> SandboxShell:
    config = Config()
    config.HistoryManager.enabled = False  # in-memory history: nothing written to disk
    # Tracebacks in IPython's default colour scheme ("neutral"), the one ipykernel leaves in
    # place: its colours are chosen to read on a light and a dark background alike, which is
    # what JupyterLab's error output needs. ("linux" drew names in white: on JupyterLab's
    # pink error background `share = total / count` read `= /`.)
    shell = SandboxShell.instance(
        config=config,
        displayhook_class=EventDisplayHook,
        display_pub_class=EventDisplayPublisher,
        colors=TRACEBACK_COLORS,
    )
    shell.runtime = runtime
    shell.kernel = KernelStandIn(runtime)
    # `len?` pages its help into the execute reply (ipykernel's hook), not to a terminal.
    shell.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)
    shell.displayhook.runtime = runtime
    shell.display_pub.runtime = runtime
    return shell
