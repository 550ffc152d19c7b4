"""One line that says what to do, after the dead ends of a sandbox without network.

A sandbox has no network unless its creator asked for egress (docs/agents.md, "Egress on request"),
so ``pip install``, a DNS look-up, a connection, or an import of a package that is not in
the image fail there with messages written for a machine that is merely offline. Each of
these ends with a line naming the way out: an image with the package, or an egress policy,
as a notebook user gets either (a kernel of that image; the kernel's egress setting) and as
an API caller does.
The line is the last of the traceback (the error's name and value are unchanged) or, after
a failed ``!pip``/``%pip``, a line on stderr.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import typing as t

# Import names whose package is named otherwise on the package index.
PACKAGE_OF = {"sklearn": "scikit-learn", "cv2": "opencv-python-headless", "PIL": "pillow", "yaml": "pyyaml",
              "bs4": "beautifulsoup4", "dateutil": "python-dateutil", "skimage": "scikit-image"}
# What a socket call meets without a network: the seccomp filter refuses AF_INET sockets
# (EAFNOSUPPORT); a namespace with only loopback has no route.
NO_ROUTE = {errno.EAFNOSUPPORT, errno.ENETUNREACH, errno.EHOSTUNREACH}
PIP_VALUE_OPTIONS = {"--retries", "--timeout", "-i", "--index-url", "--extra-index-url", "-r", "--requirement",
                     "-c", "--constraint", "-t", "--target", "--trusted-host", "-f", "--find-links", "--proxy"}
PIP_INSTALL = re.compile(r"\bpip3?(\.\d+)?\s+install\b|-m\s+pip\s+install\b")


def has_egress() -> bool:
    return bool(os.environ.get("SANDBOX_EGRESS_SOCKET"))


def pip_allowed() -> bool:
    return has_egress() and bool(os.environ.get("PIP_INDEX_URL"))


# Who may give a sandbox network: its creator, before it exists. In a notebook that is the
# person choosing the kernel (its setting, in the kernel's environment or kernelspec),
# never a cell, which runs inside the sandbox; through the API, the create call.
NOTEBOOK_EGRESS = ("in a notebook, by you before the kernel starts (the kernel setting SANDBOX_KERNEL_EGRESS={policy} "
                   "in its environment or its kernelspec's env; a cell cannot grant it)")


def package_hint(package: str) -> str:
    if pip_allowed():
        return f"hint: this sandbox's egress allows pip: %pip install {package}"
    return (f"hint: this sandbox has no network, so {package} cannot be installed here: use an image with it "
            f"(sandbox-kernel image build NAME --pip {package}; in Jupyter, `sandbox-kernel install --image NAME` "
            'adds the kernel "Python (sandbox: NAME)"), or let pip through when the sandbox is made: '
            + NOTEBOOK_EGRESS.format(policy="'{\"pip\": true}'")
            + '; through the API, {"egress": {"pip": true}}')


NETWORK_HINT = ("hint: this sandbox has no network: ask for the hosts you need when it is made: "
                + NOTEBOOK_EGRESS.format(policy="'{\"allow\": [\"HOST\"]}'")
                + '; through the API, {"egress": {"allow": ["HOST"]}} (docs/agents.md, "Egress on request")')


def _chain(exc: BaseException | None) -> t.Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        reason = getattr(exc, "reason", None)  # urllib's URLError wraps the socket error
        if isinstance(reason, BaseException):
            yield reason
        exc = exc.__cause__ or exc.__context__


def for_exception(exc: BaseException) -> str | None:
    """The hint line for an exception a cell raised, or None."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and not exc.name.startswith("."):
        top = exc.name.split(".")[0]
        return package_hint(PACKAGE_OF.get(top, top))
    if has_egress():
        return None  # the egress proxy explains its own refusals
    for link in _chain(exc):
        if isinstance(link, socket.gaierror) or (isinstance(link, OSError) and link.errno in NO_ROUTE):
            return NETWORK_HINT
    return None


def after_command(cmd: str, exit_code: int) -> str | None:
    """The hint line after a shell command a cell ran (``!pip install x``), or None."""
    if exit_code == 0 or not PIP_INSTALL.search(cmd) or pip_allowed():
        return None
    words = cmd.split()
    after = words[words.index("install") + 1:] if "install" in words else []
    packages = [w for i, w in enumerate(after)
                if not w.startswith("-") and (i == 0 or after[i - 1] not in PIP_VALUE_OPTIONS)]
    return package_hint(" ".join(packages) or "PACKAGE")
