"""The host kernel never imports from the notebook's folder.

`%pull` writes bytes a sandbox chose into the kernel's working directory (the notebook's
folder). `python -m kernel` would put that folder first on `sys.path`, and then a pulled
`markdown_it.py` (a module the kernel imports lazily, to render Markdown) or `kernel.py` (at
the next start in that folder) runs in the host kernel with the user's rights. The
kernelspecs therefore start the kernel with `python -P` (no script or working directory
on `sys.path`), and the kernel checks at start-up, before it imports anything lazily, that
neither its working directory nor `''` is on `sys.path` (`PYTHONPATH=.`, an older spec, a
launcher that drops `-P`): if one is, it refuses to run and says why, rather than work
normally over a folder whose files it might import.
"""

from __future__ import annotations

import os
import sys
import typing as t


def unsafe_entries(path: t.Sequence[str], cwd: str) -> list[str]:
    """The entries of `path` that resolve to `cwd` (the folder `%pull` writes to): `''`,
    `.`, a relative entry, or another spelling of the same directory."""
    try:
        here = os.stat(cwd)
    except OSError:
        return []
    found = []
    for entry in path:
        if entry == "" or not os.path.isabs(entry):
            found.append(entry)
            continue
        try:
            st = os.stat(entry)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino):
            found.append(entry)
    return found


def refusal(entries: t.Sequence[str], cwd: str) -> str:
    shown = ", ".join(repr(e) for e in entries)
    return (f"sandbox kernel: not starting: its working directory {cwd} (the notebook's folder, where %pull "
            f"writes files a sandbox chose) is on sys.path as {shown}, so the host kernel would import them. "
            f"Start it with `python -P -m kernel` (as the installed kernelspecs do: reinstall them with "
            f"`sandbox-kernel install`) and keep '.' out of PYTHONPATH.")


def check_or_exit(path: t.Sequence[str] | None = None, cwd: str | None = None) -> None:
    """Exit with status 2 and the reason on stderr if the working directory is on `sys.path`."""
    cwd = cwd if cwd is not None else os.getcwd()
    entries = unsafe_entries(sys.path if path is None else path, cwd)
    if entries:
        print(refusal(entries, cwd), file=sys.stderr, flush=True)
        raise SystemExit(2)
