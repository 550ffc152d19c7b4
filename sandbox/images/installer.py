"""The command that installs an image's packages: uv where it is installed, else pip.

uv (a dependency of the project, a binary wheel) resolves and installs the default recipe
about twice as fast as pip on a cold cache and several times faster on a warm one
(bench/build_bench.py), which is most of a first start's wait. It installs the same
distributions as pip, records them the same way (``INSTALLER``, ``REQUESTED``,
``direct_url.json``: the image's package list and SBOM read those), and is pointed at the
same places pip would use: pip's own configuration (``PIP_*`` variables, ``pip.conf``) is
read with ``pip config list`` and translated into uv's variables, so a machine whose pip uses
a mirror or a local wheel directory builds images from it with uv too, and a fresh machine
(CI) with no pip configuration uses PyPI with both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# pip's setting -> uv's variable. Several values of one setting are joined with spaces, as
# both tools read them. `extra-index-url` also asks uv to pick the best version across all
# indexes, which is pip's behaviour (uv's default takes the first index that has a package).
PIP_TO_UV = {
    "index-url": "UV_INDEX_URL",
    "extra-index-url": "UV_EXTRA_INDEX_URL",
    "find-links": "UV_FIND_LINKS",
    "constraint": "UV_CONSTRAINT",
    "no-index": "UV_NO_INDEX",
    "cert": "SSL_CERT_FILE",
}
# `pip config list` has merged the files already (``section.name``); of the sections, the
# environment (``:env:``) wins over [install], which wins over [global], as in pip.
_SECTION_RANK = {"global": 0, "install": 1, ":env:": 2}


def uv_binary() -> str | None:
    """The uv executable installed with the project, or one on PATH; None if there is none
    (the build then uses pip)."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def pip_settings(python: str = sys.executable) -> dict[str, str]:
    """pip's effective settings that say where packages come from, as ``pip config list``
    reports them (files and ``PIP_*`` variables), the winning value of each."""
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or section not in _SECTION_RANK:
            continue
        rank = _SECTION_RANK[section]
        value = value.strip().strip("'\"")
        if name in PIP_TO_UV and (name not in found or rank >= found[name][0]):
            found[name] = (rank, value)
    return {name: value for name, (_, value) in found.items()}


def uv_environment(settings: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for uv that makes it use what pip's ``settings`` name."""
    env = dict(os.environ if base is None else base)
    for name, value in settings.items():
        variable = PIP_TO_UV[name]
        if name == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                env[variable] = "1"
            continue
        env[variable] = " ".join(value.split())
    if "extra-index-url" in settings:
        env["UV_INDEX_STRATEGY"] = "unsafe-best-match"  # pip's: the best version over every index
    env.setdefault("UV_NO_PROGRESS", "1")
    env.setdefault("UV_PYTHON_DOWNLOADS", "never")  # the host's interpreter, never one uv fetches
    return env


class Installer:
    """How to run "install these into this venv" (``command``, with ``env``): ``uv pip
    install --python VENV_PYTHON`` where uv is available and ``use_uv``, else the venv's pip."""

    def __init__(self, use_uv: bool = True, cache_dir: str | None = None) -> None:
        self.uv = uv_binary() if use_uv else None
        self.cache_dir = cache_dir
        self.name = "uv" if self.uv else "pip"
        self._env: dict[str, str] | None = None

    def command(self, venv_python: str) -> list[str]:
        if self.uv:
            argv = [self.uv, "pip", "install", "--python", venv_python]
            return argv + (["--cache-dir", self.cache_dir] if self.cache_dir else [])
        argv = [venv_python, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"]
        return argv + (["--cache-dir", self.cache_dir] if self.cache_dir else [])

    def venv_command(self, base_python: str, venv: str) -> list[str]:
        """Create the venv, with pip in it (a sandbox with egress installs with it): ``uv venv
        --seed`` takes about a second where ``python -m venv``'s ensurepip took 19-35 s on a
        busy host."""
        if self.uv:
            return [self.uv, "venv", "-q", "--seed", "--python", base_python, venv]
        return [base_python, "-m", "venv", venv]

    def env(self) -> dict[str, str] | None:
        """uv's environment (pip's settings translated, read once); None (inherit) for pip."""
        if not self.uv:
            return None
        if self._env is None:
            self._env = uv_environment(pip_settings())
        return self._env
