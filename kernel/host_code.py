"""Which names in the notebook's folder a host program would run, import or read as config.

`%pull` writes bytes the sandbox chose into the notebook's folder. The host kernel itself
never imports from there (its kernelspec starts it with `python -P`, and it refuses to run
with its folder on `sys.path`: `kernel/safe_path.py`), but other host programs do: a
`%%host` cell, a script or `python` started in that folder, Jupyter and IPython reading
their config, a shell's dotfiles, direnv's `.envrc`, git's hooks. So a file whose landing
name makes it one of those is pulled only with an explicit `--allow-code`; without it the
cell says why and writes nothing of it. The judgement is made on the *local* path the bytes
land at (every component), never on what the sandbox says the file is.
"""

from __future__ import annotations

import fnmatch
import typing as t

ALLOW_FLAG = "--allow-code"

#: Suffixes of files Python imports or executes from a folder on `sys.path`: modules,
#: bytecode, extension modules, and `.pth` files (whose `import` lines run at start-up).
_PYTHON_SUFFIXES = (".py", ".pyw", ".pyc", ".pyo", ".so", ".pyd", ".pth", ".egg-link")
#: Names that host Python, IPython, Jupyter or a kernel launcher read as code or config,
#: whatever their suffix.
_CONFIG_NAMES = (
    "sitecustomize*", "usercustomize*", "__init__*", "__main__*", "__pycache__",
    "ipython_config.*", "ipython_kernel_config.*", "jupyter_*_config.*", "jupyter_config.*",
    "kernel.json", "pyvenv.cfg", "custom.js", "custom.css",
)


def why_host_code(parts: t.Sequence[str]) -> str | None:
    """Why a file at these path components (relative to the notebook's folder) could be run,
    imported or read as config by a host program; None if nothing on the host acts on it."""
    for index, name in enumerate(parts):
        last = index == len(parts) - 1
        if name.startswith("."):
            what = "a dotfile" if last else f"inside the hidden folder {name!r}"
            return (f"{what}: shells, git, direnv and Jupyter (.ipynb_checkpoints) read such names "
                    "from the folder they run in")
        lowered = name.lower()
        for pattern in _CONFIG_NAMES:
            if fnmatch.fnmatchcase(lowered, pattern):
                return (f"{name!r} is a name Python, IPython, Jupyter or a kernel launcher reads as code or "
                        "configuration")
        if last and lowered.endswith(_PYTHON_SUFFIXES):
            return ("a Python module, extension or .pth file: a host Python started in this folder "
                    "(a %%host cell, a script, `python -m`) would import it")
    return None


def refusal(shown: str, reason: str) -> str:
    """The message for a code-like file pulled without the flag: what, why, and the two ways on."""
    return (f"%pull: not writing {shown!r}: {reason}. Add {ALLOW_FLAG} to pull it anyway, "
            f"or give it another local name (%pull REMOTE {shown}.txt)")
