"""The build of an image on a root of its own (the layout: debian_root.py), in the same
five steps as any image, its plan said before the first: the Debian root, the Python
packages, the npm packages, the checks, the package list and the pack.

The result is an ``image.json`` record like a venv image's, with ``root`` set to
``"debian"`` and a single mount at ``/``: the backends (isolation/bwrap.py, gvisor.py) bind
that tree as the sandbox's root instead of the host's ``/usr``.
"""

from __future__ import annotations

import os
import shutil
import time

from . import debian_root, image_packages, os_packages, root_overlay
from .build_steps import ImageError, Progress, dir_size, run, step_line, tree_mount
from .installer import Installer, uv_binary

MPLCACHE_IN_ROOT = "/opt/sandbox-kernel-mpl"  # where the sandbox sees the font cache (isolation/bwrap.py)


def plan(recipe: dict) -> str:
    """What the build will do and cost, said before it starts."""
    parts = [f"{len(recipe['apt'])} Debian packages ({', '.join(recipe['apt']) or 'python3 only'})",
             f"{len(recipe['pip'])} Python packages"]
    if recipe.get("npm"):
        parts.append(f"{len(recipe['npm'])} npm packages ({', '.join(recipe['npm'])})")
    return (f"building image {recipe['name']!r} on a Debian root of its own: {'; '.join(parts)}; 5 steps "
            f"(the Debian root with mmdebstrap, the Python packages with uv, the npm packages, checks, the "
            f"package list and packing): {debian_root.ESTIMATE}")


def build(images_dir: str, target: str, recipe: dict, venv: str, image_format: int, progress: Progress) -> dict:
    """Build ``recipe`` into ``target`` (a new directory); its ``image.json`` record."""
    ok, why = debian_root.available()
    if not ok:
        raise ImageError(f"image {recipe['name']!r} needs a root of its own, which this host cannot build: {why}")
    uv = uv_binary()
    if uv is None:
        raise ImageError("an image on a root of its own is built with uv, which is not installed (pip install uv)")
    started = time.time()
    progress(plan(recipe))
    root = os.path.join(target, "root")
    os.makedirs(target)
    os.chmod(target, 0o755)

    def tool(label: str):
        return lambda argv: run(argv, progress, label=label)

    progress(step_line(1, f"the Debian root (mmdebstrap {debian_root.SUITE} minbase + {len(recipe['apt'])} packages)"))
    debian_root.debootstrap(root, recipe["apt"], os.path.join(images_dir, "_apt-cache"), tool("mmdebstrap"))
    progress(step_line(2, f"the Python environment and {len(recipe['pip'])} packages (with uv)"))
    debian_root.python_env(root, venv, list(recipe["pip"]), recipe.get("requirements"), uv,
                           os.path.join(images_dir, "_uv-cache"), Installer().env(), tool("uv"))
    progress(step_line(3, f"{len(recipe.get('npm') or [])} npm packages"))
    debian_root.npm_install(root, recipe.get("npm") or [], os.path.join(images_dir, "_npm-cache"), tool("npm"))
    mplcache = _check(root, target, venv, recipe, progress)
    progress(step_line(5, "listing the packages and packing the image"))
    version = debian_root.python_version(root)
    pip_list = image_packages.inventory(f"{venv}/bin/python", {debian_root.site_packages(venv, version): recipe["name"]},
                                        wrap=lambda argv: debian_root.inside(root, argv))
    package_list = (os_packages.debian(root, set(recipe["apt"]) | set(debian_root.ALWAYS))
                    + os_packages.npm(root, {_npm_name(p) for p in recipe.get("npm") or []})
                    + [dict(p, ecosystem="pypi") for p in pip_list])
    return _pack(target, root, recipe, {"base": None, "venv": venv, "layers": [venv], "python_version": version,
                                        "mplcache": mplcache, "pip_list": pip_list, "package_list": package_list},
                 image_format, started, progress)


def build_layered(images_dir: str, target: str, recipe: dict, base: dict, image_format: int,
                  progress: Progress) -> dict:
    """Build ``recipe`` on ``base`` (an image on a root of its own) into ``target``: the
    recipe's Debian, Python and npm packages added to the base's root through an overlay,
    then laid over the base's root shared by hard links (root_overlay.py); the base's
    image is neither rebuilt nor changed. Its ``image.json`` record."""
    ok, why = debian_root.available()
    if not ok:
        raise ImageError(f"image {recipe['name']!r} is layered on a root of its own, which this host cannot build: {why}")
    started = time.time()
    base_root, venv = _tree_of(base, "/"), base["venv"]
    progress(f"building image {recipe['name']!r} on the root of image {base['name']!r} (shared, not rebuilt): "
             f"{len(recipe['apt'])} Debian, {len(recipe['pip'])} Python and {len(recipe.get('npm') or [])} npm "
             f"packages more; 5 steps; the time and disk its packages need")
    os.makedirs(target)
    os.chmod(target, 0o755)

    def tool(label: str):
        return lambda argv: run(argv, progress, label=label)

    with root_overlay.overlay(base_root, os.path.join(target, "layer")) as (merged, upper):
        progress(step_line(1, f"{len(recipe['apt'])} Debian packages on the root of {base['name']!r} (apt, in an overlay)"))
        debian_root.apt_install(merged, recipe["apt"], os.path.join(images_dir, "_apt-cache"), tool("apt-get"))
        progress(step_line(2, f"{len(recipe['pip'])} Python packages in the environment of {base['name']!r} (with uv)"))
        if recipe["pip"] or recipe.get("requirements"):
            uv = uv_binary()
            if uv is None:
                raise ImageError("an image on a root of its own is built with uv, which is not installed (pip install uv)")
            debian_root.python_env(merged, venv, list(recipe["pip"]), recipe.get("requirements"), uv,
                                   os.path.join(images_dir, "_uv-cache"), Installer().env(), tool("uv"), create=False)
        progress(step_line(3, f"{len(recipe.get('npm') or [])} npm packages"))
        debian_root.npm_install(merged, recipe.get("npm") or [], os.path.join(images_dir, "_npm-cache"), tool("npm"))
    root = os.path.join(target, "root")
    root_overlay.link_tree(base_root, root)
    applied = root_overlay.lay_over(upper, root)
    shutil.rmtree(os.path.join(target, "layer"))
    progress(f"the layer's {applied} entries laid over the root of {base['name']!r}, shared by hard links")
    mplcache = _check(root, target, venv, recipe, progress, base_cache=base.get("mplcache"))
    progress(step_line(5, "listing the packages and packing the image"))
    version = debian_root.python_version(root)
    pip_list = image_packages.inventory(f"{venv}/bin/python", {debian_root.site_packages(venv, version): recipe["name"]},
                                        wrap=lambda argv: debian_root.inside(root, argv))
    package_list = layered_list(base, recipe["name"],
                                os_packages.debian(root, set(recipe["apt"]))
                                + os_packages.npm(root, {_npm_name(p) for p in recipe.get("npm") or []})
                                + [dict(p, ecosystem="pypi") for p in pip_list])
    return _pack(target, root, recipe, {"base": base["name"], "base_hash": base["hash"], "venv": venv,
                                        "layers": base["layers"], "python_version": version, "mplcache": mplcache,
                                        "pip_list": pip_list, "package_list": package_list},
                 image_format, started, progress, shared_with=base_root)


def layered_list(base: dict, name: str, found: list[dict]) -> list[dict]:
    """A layered image's packages, each with the image that brought it: the base's (its
    record as the base lists it, requested or not there) where the base has the same
    version, else this image's."""
    inherited = {(p.get("ecosystem"), p["name"], p["version"]): p for p in base.get("package_list") or []}
    listed = []
    for package in found:
        from_base = inherited.get((package.get("ecosystem"), package["name"], package["version"]))
        listed.append(dict(from_base, image=from_base.get("image") or base["name"]) if from_base
                      else dict(package, image=name))
    return listed


def _pack(target: str, root: str, recipe: dict, made: dict, image_format: int, started: float,
          progress: Progress, shared_with: str | None = None) -> dict:
    """The root finished (mount points, no apt lists) and packed; the image's record. Its
    size is the disk it adds: a layered image's files shared with its base's root
    (``shared_with``) are the base's."""
    debian_root.finish(root)
    size = dir_size(target) if shared_with is None else _unshared_size(target, shared_with)
    mount = tree_mount(root, "/", os.path.join(target, "root.ext4"), progress)
    pip_list, package_list = made.pop("pip_list"), made.pop("package_list")
    info = {
        "name": recipe["name"], "hash": recipe["hash"], "root": "debian",
        "apt": recipe["apt"], "npm": recipe.get("npm") or [], "pip": recipe["pip"],
        "requirements": recipe.get("requirements"), "preload": recipe["preload"], "format": image_format,
        **made, "mounts": [mount], "python_copy": None, "python_prefix": "/usr",
        "packages": [f"{p['name']}=={p['version']}" for p in pip_list],
        "package_list": package_list,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(time.time() - started, 1), "size_bytes": size,
    }
    progress(f"image {recipe['name']!r} built in {info['build_seconds']} s ({size // (1024 * 1024)} MiB, "
             f"{len(package_list)} packages)")
    return info


def _unshared_size(tree: str, base_root: str) -> int:
    """The bytes of the files under ``tree`` that are not hard links to files of ``base_root``."""
    shared = set()
    for where, _, names in os.walk(base_root):
        for name in names:
            st = os.lstat(os.path.join(where, name))
            shared.add((st.st_dev, st.st_ino))
    total = 0
    for where, _, names in os.walk(tree):
        for name in names:
            st = os.lstat(os.path.join(where, name))
            total += 0 if (st.st_dev, st.st_ino) in shared else st.st_size
    return total


def _tree_of(image: dict, sandbox_path: str) -> str:
    return next(m["tree"] for m in image["mounts"] if m["path"] == sandbox_path)


def _check(root: str, target: str, venv: str, recipe: dict, progress: Progress, base_cache: str | None = None) -> str:
    """Step 4: matplotlib's font cache built once inside the root (its paths the sandbox's;
    a layered image's copied from its base's, whose fonts and venv it shares), the preload
    imports tried; the font cache's host directory."""
    progress(step_line(4, "checking the image (font cache, preload imports)"))
    mplcache = os.path.join(target, "mplcache")
    if base_cache and os.path.isdir(base_cache):
        shutil.copytree(base_cache, mplcache, symlinks=True)
    else:
        os.makedirs(mplcache)
    os.makedirs(root + MPLCACHE_IN_ROOT, exist_ok=True)
    env = {"MPLCONFIGDIR": MPLCACHE_IN_ROOT, "MPLBACKEND": "Agg"}
    binds = {mplcache: MPLCACHE_IN_ROOT}
    python = f"{venv}/bin/python"
    run(debian_root.inside(root, [python, "-c", "import importlib.util, sys; "
                                  "import matplotlib.pyplot as plt; plt.figure(); plt.plot([1]); "
                                  "plt.savefig('/dev/null', format='png')"
                                  if "matplotlib" in " ".join(recipe["pip"]) else "pass"], binds, env),
        progress, label="matplotlib's font cache")
    if recipe["preload"]:
        try:
            run(debian_root.inside(root, [python, "-c", "import " + ", ".join(recipe["preload"])], binds, env),
                progress, label="the preload imports")
        except ImageError as exc:
            raise ImageError(f"a preload import of image {recipe['name']!r} fails: {exc}") from None
    for root_dir, _, names in os.walk(mplcache):
        for name in names:
            os.chmod(os.path.join(root_dir, name), 0o644)
        os.chmod(root_dir, 0o755)
    return mplcache


def _npm_name(spec: str) -> str:
    """The package an npm spec names ("typescript@5" -> "typescript", "@types/node@20" -> "@types/node")."""
    at = spec.find("@", 1)
    return spec if at < 0 else spec[:at]
