"""The Debian and npm packages of an image on a root of its own (debian_root.py), read from
the root itself when the image is built: what ``dpkg-query`` lists in the root's dpkg
database, and every ``package.json`` under its npm prefix.

Licences come from where the metadata gives them: a Debian package's
``/usr/share/doc/PKG/copyright`` when it is machine-readable (DEP-5: each ``License:``
field's name), an npm package's ``license`` field. Sorted and free of build times, like the
pip list (image_packages.py), so two builds that resolve the same versions list the same.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

from .debian_root import MIRROR, NODE_MODULES

DEP5 = re.compile(r"^Format:\s*https?://www\.debian\.org/doc/packaging-manuals/copyright-format/", re.M)
LICENSE_FIELD = re.compile(r"^License:[ \t]*(\S[^\n]*)$", re.M)
NPM_REGISTRY = "https://registry.npmjs.org"


def _in_root(root: str, path: str) -> str:
    """``path`` (a path inside the root) on the host, its links resolved inside the root."""
    current = root
    for part in path.strip("/").split("/"):
        candidate = os.path.join(current, part)
        for _ in range(20):
            if not os.path.islink(candidate):
                break
            target = os.readlink(candidate)
            candidate = root + os.path.normpath(target) if target.startswith("/") else \
                os.path.normpath(os.path.join(os.path.dirname(candidate), target))
        current = candidate
    return current


def debian_licenses(root: str, package: str) -> list[str]:
    """The licence names a package's machine-readable copyright file gives ([] when it is
    free-form: Debian does not require the format)."""
    try:
        with open(_in_root(root, f"/usr/share/doc/{package}/copyright"), errors="replace") as f:
            text = f.read(200_000)
    except OSError:
        return []
    if not DEP5.search(text):
        return []
    return sorted({m.group(1).strip() for m in LICENSE_FIELD.finditer(text)})


def debian(root: str, requested: set[str]) -> list[dict]:
    """Every package dpkg has installed in the root, with its version and licences."""
    out = subprocess.run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W",
                          "-f=${db:Status-Status}\t${Package}\t${Version}\t${Architecture}\n"],
                         capture_output=True, text=True, check=True).stdout
    packages = []
    for line in out.splitlines():
        status, name, version, arch = (line.split("\t") + ["", "", ""])[:4]
        if status != "installed":
            continue
        packages.append({"name": name, "version": version, "layer": "debian", "source": MIRROR,
                         "requested": name in requested, "installer": "apt", "ecosystem": "deb",
                         "arch": arch, "licenses": debian_licenses(root, name)})
    return sorted(packages, key=lambda p: p["name"])


def _npm_license(meta: dict) -> list[str]:
    value = meta.get("license") or meta.get("licenses")
    if isinstance(value, dict):
        value = value.get("type")
    if isinstance(value, list):
        return sorted({(v.get("type") if isinstance(v, dict) else str(v)) or "" for v in value} - {""})
    return [str(value)] if value else []


def npm(root: str, requested: set[str]) -> list[dict]:
    """Every package under the root's global node_modules (their dependencies' nested ones
    too), each name@version once."""
    found: dict[tuple[str, str], dict] = {}
    top = root + NODE_MODULES
    for where, dirs, files in os.walk(top):
        dirs.sort()
        parent = os.path.dirname(where)
        package_dir = os.path.basename(parent) == "node_modules" or (
            os.path.basename(parent).startswith("@") and os.path.basename(os.path.dirname(parent)) == "node_modules")
        if "package.json" not in files or not package_dir:
            continue
        try:
            with open(os.path.join(where, "package.json")) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        name, version = meta.get("name"), meta.get("version")
        if not name or not version or (name, version) in found:
            continue
        top_level = os.path.dirname(where) == top or os.path.dirname(os.path.dirname(where)) == top
        found[(name, version)] = {"name": name, "version": version, "layer": "npm", "source": NPM_REGISTRY,
                                  "requested": top_level and name in requested, "installer": "npm",
                                  "ecosystem": "npm", "licenses": _npm_license(meta)}
    return [found[key] for key in sorted(found)]
