"""Images: Python environments built once on the host and mounted read-only into sandboxes.

An image is a venv made from a pip recipe, plus what it needs to run where the sandbox's
unprivileged uid can read it: a copy of the base interpreter when the host's lives somewhere
that uid cannot enter (pyenv under ``/root``), mounted back at its original path so its
absolute paths (rpath, ``pyvenv.cfg``) keep working. A named custom image is a second venv
layered on the default one through a ``.pth`` file, so it adds packages without copying
numpy and pandas again.

A sandbox sees each venv at a neutral path (``/opt/sandbox-images/NAME``), never at its host
path in the state directory: the venv is built on the host, then the paths it baked in
(``pyvenv.cfg``, scripts' shebangs, ``.pth`` files, the font cache's list) are rewritten to
the sandbox's. Each tree (venv, interpreter copy) is also packed into a read-only ext4 image
(``isolation/imagefs.py`` says why and how it is mounted); ``mounts`` in ``image.json`` lists
them. ``format`` is the layout's version: an image of another format is built again.

An image is complete when its ``image.json`` exists; a build writes it last and removes the
directory on failure, so there is never a half-built image to select. Images are immutable:
building the same recipe again reuses the image; another recipe under the same name is refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from contextlib import contextmanager
from typing import Callable, Iterable

from . import debian_root, image_packages, own_root
from .build_steps import BUILD_STEPS, STEP_RE, ImageError, Progress, step_line  # noqa: F401 (their home before)
from .build_steps import dir_size as _dir_size, run as _run, tree_mount as _tree_mount
from .installer import Installer
from ..common import statefile
from ..isolation import disk, imagefs
from ..common.paths import StateDir, world_reachable

DEFAULT_IMAGE = "default"
IMAGE_FORMAT = 2  # 2: venvs at neutral sandbox paths, trees packed into ext4 images
SANDBOX_IMAGES = "/opt/sandbox-images"  # where a sandbox sees each image's venv, by name
# ipywidgets 8.1 speaks widget protocol 2, the one of JupyterLab's widget manager
# (jupyterlab_widgets 3, the `lab` extra); tqdm for its notebook progress bars; cloudpickle
# saves a namespace by value, lambdas and cell-defined classes too (runtime/saving.py).
DEFAULT_PACKAGES = ["ipython", "matplotlib-inline", "numpy", "pandas", "matplotlib", "ipywidgets>=8.1,<9", "tqdm",
                    "cloudpickle"]
# What a warm sandbox imports while it waits. Not matplotlib: it holds about 29 MiB more per
# sandbox (PSS of an interpreter with IPython, numpy and pandas: 61 -> 90 MiB with pyplot),
# which every idle kernel would carry, like a plain ipykernel it imports on the first figure.
DEFAULT_PRELOAD = ["numpy", "pandas"]
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")

# Recipes shipped with the project: `sandbox-kernel image build NAME` (or POST /v1/images
# with just the name) builds NAME from its recipe, layered on the default image. The
# data-science one is close to what managed agent sandboxes preinstall, so that code a
# model wrote for one of them finds its imports here too; there is no `pip install` in a
# sandbox (no network), so what is not in the image is not available at all.
RECIPES: dict[str, dict] = {
    # The seed's example analysis image, on a Debian root of its own (nothing of the host's /usr).
    "gemini-analysis": {"root": "debian", "pip": ["polars", "duckdb", "scipy"], "preload": DEFAULT_PRELOAD},
    # Node.js, TypeScript and Bun beside Python, for polyglot notebooks and `commands.run(["node", ...])`;
    # Bun from its npm package, which carries the binary (Debian has none): `bun script.js`.
    "nodejs": {"apt": ["nodejs", "npm"], "npm": ["bun", "typescript"], "pip": [], "preload": DEFAULT_PRELOAD},
    # R beside Python (`Rscript`, `%%script Rscript`): Debian's R without its recommends
    # (no compilers, no recommended CRAN packages), 100 s and 630 MiB here (tests/images/test_r_image.py).
    "r": {"root": "debian", "apt": ["r-base-core"], "pip": [], "preload": DEFAULT_PRELOAD},
    # Java beside Python (`javac`, `java Main.java`): Debian's headless JDK (OpenJDK 17) without
    # its recommends, 46 s and 790 MiB here from empty caches (tests/images/test_java_image.py);
    # a JVM's heap is a quarter of the sandbox's memory_mb (isolation/runtime_limits.py).
    "java": {"root": "debian", "apt": ["default-jdk-headless"], "pip": [], "preload": DEFAULT_PRELOAD},
    # Go beside Python (`go run`, `go build`; the standard library only: no module proxy
    # without egress): Debian's golang-go (Go 1.19), 46 s and 945 MiB here from empty caches
    # (tests/images/test_go_image.py).
    "go": {"root": "debian", "apt": ["golang-go"], "pip": [], "preload": DEFAULT_PRELOAD},
    "datascience": {
        "pip": ["scipy", "scikit-learn", "seaborn", "statsmodels", "pyarrow", "openpyxl", "xlrd",
                "polars", "duckdb", "sympy", "networkx", "plotly", "tabulate"],
        "preload": DEFAULT_PRELOAD,
    },
}

# What a first build of the default image costs, measured on 2 cores (docs/getting-started.md, The first run):
# said before it starts, so that nobody wonders whether the first cell hangs.
# With uv: 24-35 s here under load (bench/build_bench.py), more where PyPI is far.
DEFAULT_BUILD_ESTIMATE = "about 30-90 s and 750 MiB of disk (1 GiB as root, with a copy of the interpreter)"


def first_build_plan(store: "ImageStore", name: str = DEFAULT_IMAGE) -> str | None:
    """What a server about to build the default image says first, before anything slow (the
    protection probes, the sockets): the steps, the time and the disk, so that the kernel's
    status line shows the plan from the start. None when the image is built."""
    if store.get(name) is not None:
        return None
    return (f"the {name!r} image is not built yet; building it first: {BUILD_STEPS} steps (the Python environment, "
            f"its packages with {Installer().name}, bytecode, checks, packing), {DEFAULT_BUILD_ESTIMATE}")


def recipe_hash(recipe: dict) -> str:
    """The recipe's identity: a venv image's fields, and an own-root image's only where set
    (so that the hashes of images built before own roots existed do not change)."""
    fields = {k: recipe.get(k) for k in ("base", "pip", "requirements", "preload")}
    # base_hash: a layered own-root image names its base's build, not only its name
    fields.update({k: recipe[k] for k in ("root", "apt", "npm", "base_hash") if recipe.get(k)})
    canonical = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


DEBIAN_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")  # a Debian package, optionally =version
NPM_SPEC_RE = re.compile(r"^(@[a-z0-9][\w.-]*/)?[a-z0-9][\w.-]*(@[\w.^~<>=*| -]+)?$")


def _clean(values: Iterable[str], pattern: re.Pattern | None, kind: str) -> list[str]:
    cleaned = sorted({v.strip() for v in values or () if v and v.strip()})
    for spec in cleaned:
        bad = spec.startswith("-") or any(c in spec for c in "\n\r\0") or (pattern and not pattern.match(spec))
        if bad:
            raise ImageError(f"{spec!r} is not {kind}")
    return cleaned


def make_recipe(name: str, pip: Iterable[str], requirements: str | None, preload: Iterable[str] | None,
                apt: Iterable[str] = (), npm: Iterable[str] = (), root: str | None = None,
                base: str | None = None) -> dict:
    """A build request as a recipe, checked: a shipped recipe where only its name is given;
    the default packages in the default image and in an image on a root of its own (which
    has no base image: the runtime's packages must be in its own venv). A ``base`` other
    than the default image is an image on a root of its own that this one adds packages to
    (the store checks that it is one: ImageStore.build)."""
    if not NAME_RE.match(name or ""):
        raise ImageError(f"image name {name!r} is not valid: use lowercase letters, digits, '.', '_' and '-'")
    pip = _clean(pip, None, "a package requirement")
    apt = _clean(apt, DEBIAN_NAME_RE, "a Debian package name (NAME or NAME=VERSION)")
    npm = _clean(npm, NPM_SPEC_RE, "an npm package (NAME or NAME@VERSION)")
    if root not in (None, "debian"):
        raise ImageError(f"root {root!r} is not known: an image's own root is \"debian\" (or leave it out)")
    if name in RECIPES and not pip and not requirements and not apt and not npm and root is None and base is None:
        shipped = RECIPES[name]
        pip, apt, npm = sorted(shipped["pip"]), sorted(shipped.get("apt", [])), sorted(shipped.get("npm", []))
        root, base = shipped.get("root"), shipped.get("base")
        preload = shipped["preload"] if preload is None else preload
    if base is not None and base != DEFAULT_IMAGE:
        if not NAME_RE.match(base) or base == name:
            raise ImageError(f"base image {base!r} is not valid: name another image (built or shipped)")
        if not pip and not requirements and not apt and not npm:
            raise ImageError(f"an image layered on {base!r} needs packages: --pip, --requirements, --apt or --npm")
        return {"name": name, "base": base, "root": "debian", "apt": apt, "npm": npm, "pip": pip,
                "requirements": requirements, "preload": list(preload if preload is not None else DEFAULT_PRELOAD)}
    if base == DEFAULT_IMAGE and (apt or npm or root):
        raise ImageError("the default image is a venv over the host's /usr: Debian and npm packages need a root of "
                         "its own (leave the base out, or layer on an image that has one)")
    if apt or npm or root == "debian":
        return {"name": name, "base": None, "root": "debian", "apt": apt, "npm": npm,
                "pip": sorted(set(DEFAULT_PACKAGES) | set(pip)), "requirements": requirements,
                "preload": list(preload if preload is not None else DEFAULT_PRELOAD)}
    if name == DEFAULT_IMAGE:
        return {"name": name, "base": None, "pip": sorted(set(DEFAULT_PACKAGES) | set(pip)),
                "requirements": requirements, "preload": list(preload or DEFAULT_PRELOAD)}
    if not pip and not requirements:
        raise ImageError("a custom image needs packages: --pip PKG, --requirements FILE, --apt PKG or --npm PKG "
                         f"(recipes shipped with the project: {', '.join(sorted(RECIPES))})")
    return {"name": name, "base": DEFAULT_IMAGE, "pip": pip, "requirements": requirements,
            "preload": list(preload if preload is not None else DEFAULT_PRELOAD)}


def package_name(spec: str) -> str:
    """The distribution a pip requirement names, normalised ("ipywidgets>=8.1,<9" -> "ipywidgets")."""
    return re.split(r"[<>=!~\[;@ ]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def missing_defaults(image: dict) -> list[str]:
    """The project's default packages a default image was built without: an image built by an
    older version of this project, before the package joined the default recipe (widgets need
    ipywidgets in the image; the server that finds one builds it again, `refresh_default`)."""
    have = {package_name(p) for p in image.get("pip", [])}
    return [p for p in DEFAULT_PACKAGES if package_name(p) not in have]


class ImageStore:
    def __init__(self, state: StateDir, installer: Installer | None = None):
        self.state = state
        self.installer = installer  # None: uv where installed, else pip (installer.py)

    def path(self, name: str) -> str:
        return os.path.join(self.state.images, name)

    def get(self, name: str) -> dict | None:
        """A built image of this format (one of another format counts as not built)."""
        info = self._read(name)
        return info if info is not None and info.get("format") == IMAGE_FORMAT else None

    def _read(self, name: str) -> dict | None:
        if not NAME_RE.match(name or ""):
            return None
        return statefile.read_json(os.path.join(self.path(name), "image.json"))

    def list(self) -> list[dict]:
        images = []
        try:
            names = sorted(os.listdir(self.state.images))
        except FileNotFoundError:
            return []
        for name in names:
            info = self.get(name)
            if info is not None:
                images.append(info)
        return images

    # ---------------------------------------------------------------- building
    def lock(self, name: str):
        """Held while an image of this name is built, imported or removed."""
        return self._lock(name)

    @contextmanager
    def _lock(self, name: str):
        os.makedirs(self.state.images, exist_ok=True)
        with open(os.path.join(self.state.images, f".{name}.lock"), "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def ensure_default(self, progress: Progress = print) -> dict:
        return self.build(DEFAULT_IMAGE, progress=progress)

    def refresh_default(self, sandboxes: int, progress: Progress = print) -> None:
        """Build the default image again when an older version of this project built it without
        some of today's default packages, keeping the packages it was built with beyond the
        defaults. Not while `sandboxes` (sandbox directories a restarted server will adopt, or
        paused ones) may still run on it, nor under images layered on it: then say what is
        missing and how to rebuild, and leave it."""
        image = self.get(DEFAULT_IMAGE)
        missing = missing_defaults(image) if image is not None else []
        if not missing:
            return
        layered = sorted(i["name"] for i in self.list() if i.get("base") == DEFAULT_IMAGE)
        if sandboxes or layered:
            users = ", ".join(filter(None, [f"{sandboxes} sandbox(es)" if sandboxes else "",
                                            f"the images {', '.join(layered)}" if layered else ""]))
            progress(f"warning: the default image was built by an older version without {', '.join(missing)} "
                     f"(widgets, progress bars and saves by value need them); it is kept because {users} use it: once they are "
                     f"gone, stop the server, run `sandbox-kernel image rm {DEFAULT_IMAGE}` and start it again")
            return
        progress(f"the default image was built by an older version without {', '.join(missing)}: building it again")
        defaults = {package_name(p) for p in DEFAULT_PACKAGES}
        extra = [p for p in image.get("pip", []) if package_name(p) not in defaults]
        self.remove(DEFAULT_IMAGE, in_use=lambda name: 0)
        self.build(DEFAULT_IMAGE, pip=extra, requirements=image.get("requirements"),
                   preload=image.get("preload"), progress=progress)

    def build(self, name: str, pip: Iterable[str] = (), requirements: str | None = None,
              preload: Iterable[str] | None = None, progress: Progress = print, apt: Iterable[str] = (),
              npm: Iterable[str] = (), root: str | None = None, base: str | None = None) -> dict:
        recipe = make_recipe(name, pip, requirements, preload, apt, npm, root, base)
        own_base = self._own_root_base(recipe, progress) if recipe["base"] not in (None, DEFAULT_IMAGE) else None
        if own_base is not None:
            recipe["base_hash"] = own_base["hash"]
        recipe["hash"] = recipe_hash(recipe)
        with self._lock(name):
            stale = self._read(name)
            if stale is not None and stale.get("format") != IMAGE_FORMAT:
                progress(f"image {name!r} was built in format {stale.get('format', 1)}, this version's is "
                         f"{IMAGE_FORMAT}: building it again")
            existing = self.get(name)
            if existing is not None:
                if existing.get("hash") == recipe["hash"]:
                    progress(f"image {name!r} is already built from this recipe; reusing it")
                    return existing
                raise ImageError(f"image {name!r} already exists with another recipe; images are immutable: "
                                 f"remove it first (sandbox-kernel image rm {name})", code="conflict")
            base = None
            if recipe["base"] == DEFAULT_IMAGE:
                base = self.get(recipe["base"]) or self.ensure_default(progress)
            target = self.path(name)
            if os.path.exists(target):
                _discard(target)  # leftovers of a build that died, or an image of another format
            try:
                if own_base is not None:
                    info = own_root.build_layered(self.state.images, target, recipe, own_base, IMAGE_FORMAT, progress)
                    statefile.write_json(os.path.join(target, "image.json"), info, mode=0o644)
                elif recipe.get("root") == "debian":
                    info = own_root.build(self.state.images, target, recipe, f"{SANDBOX_IMAGES}/{name}", IMAGE_FORMAT,
                                          progress)
                    statefile.write_json(os.path.join(target, "image.json"), info, mode=0o644)
                else:
                    info = self._build(target, recipe, base, progress)
            except BaseException:
                _discard(target)
                raise
            return info

    def _own_root_base(self, recipe: dict, progress: Progress) -> dict:
        """The image a layered recipe builds on: built already, or a shipped recipe built
        now; it must have a root of its own (a venv image's packages live over the host's
        /usr, which a layer cannot add Debian packages to)."""
        name = recipe["base"]
        base = self.get(name)
        if base is None and name in RECIPES:
            progress(f"the base image {name!r} is not built yet: building it first")
            base = self.build(name, progress=progress)
        if base is None:
            raise ImageError(f"no image named {name!r} to build {recipe['name']!r} on: build it first", code="not_found")
        if base.get("root") != "debian":
            raise ImageError(f"image {name!r} has no root of its own: an image is layered on the default image "
                             "(leave the base out) or on an image with a root of its own")
        return base

    def _python_copy(self, progress: Progress) -> tuple[dict | None, str]:
        """The mount of a copy of the base interpreter that sandbox uids can read (None if
        not needed), and the interpreter's prefix."""
        prefix = os.path.realpath(sys.base_prefix)
        blocked = world_reachable(prefix)
        if blocked is None or os.getuid() != 0:
            return None, prefix
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        tag = hashlib.sha256(f"{prefix}:{sys.version}".encode()).hexdigest()[:12]
        dest = os.path.join(self.state.images, "_python", tag)
        if os.path.exists(os.path.join(dest, ".complete")):
            return _tree_mount(dest, prefix, dest + ".ext4", progress), prefix
        progress(f"copying the base interpreter {prefix} (not readable by sandbox uids: {blocked} is private)")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        stdlib = os.path.join("lib", f"python{version}")
        skip = {os.path.join(stdlib, "site-packages"), os.path.join(stdlib, "test"),
                os.path.join(stdlib, "idlelib"), os.path.join(stdlib, "tkinter")}
        for entry in ("bin", "lib"):
            src_root = os.path.join(prefix, entry)
            if not os.path.isdir(src_root):
                continue
            for root, dirs, files in os.walk(src_root):
                rel = os.path.relpath(root, prefix)
                dirs[:] = [d for d in dirs if os.path.join(rel, d) not in skip]
                os.makedirs(os.path.join(dest, rel), exist_ok=True)
                for name in files:
                    src = os.path.join(root, name)
                    if entry == "lib" and rel == "lib" and not name.startswith("libpython"):
                        continue
                    if entry == "bin" and not name.startswith("python"):
                        continue
                    shutil.copy2(src, os.path.join(dest, rel, name), follow_symlinks=False)
        os.makedirs(os.path.join(dest, stdlib, "site-packages"), exist_ok=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j0", os.path.join(dest, stdlib)],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _open_up(dest)
        open(os.path.join(dest, ".complete"), "w").close()
        return _tree_mount(dest, prefix, dest + ".ext4", progress), prefix

    def _build(self, target: str, recipe: dict, base: dict | None, progress: Progress) -> dict:
        started = time.time()
        name = recipe["name"]
        count = _announce(recipe, base, progress)
        if base:
            python, python_prefix = None, base["python_prefix"]
        else:
            python, python_prefix = self._python_copy(progress)
        os.makedirs(target)
        venv = os.path.join(target, "venv")
        sandbox_venv = f"{SANDBOX_IMAGES}/{name}"
        base_python = getattr(sys, "_base_executable", sys.executable)
        installer = self.installer or Installer()
        _run(installer.venv_command(base_python, venv), progress, env=installer.env())
        venv_python = os.path.join(venv, "bin", "python")
        layers = [sandbox_venv]
        if base:
            site = _site_packages(venv)
            with open(os.path.join(site, "_sandbox_base_image.pth"), "w") as f:
                f.write(_site_packages(_tree_of(base, base["venv"])) + "\n")  # rewritten below
            layers = [sandbox_venv] + base["layers"]
        args, env = installer.command(venv_python), installer.env()
        progress(step_line(2, f"downloading and installing {count} packages (with {installer.name})"))
        if recipe["pip"]:
            _run(args + recipe["pip"], progress, env=env)
        if recipe.get("requirements"):
            req = os.path.join(target, "requirements.txt")
            with open(req, "w") as f:
                f.write(recipe["requirements"])
            _run(args + ["-r", req], progress, env=env)
        progress(step_line(3, "compiling bytecode"))
        # Packages' own test suites (a third of the default image's sources: pandas/tests, ...)
        # are left uncompiled: no notebook imports them, and compiling them was a third of
        # this step.
        _run([venv_python, "-m", "compileall", "-q", "-j0", "-x", r"/tests?/", _site_packages(venv)], progress,
             check=False)
        mplcache = _check_image(venv_python, target, recipe, progress)
        packages = _freeze(venv_python)
        sites = {_site_packages(venv): name}
        sites.update({_site_packages(_tree_of(base, layer)): os.path.basename(layer) for layer in (base or {}).get("layers", [])})
        package_list = image_packages.inventory(venv_python, sites)
        moves = {venv: sandbox_venv}  # and the base's venv, which a .pth and the font list name
        moves.update({_tree_of(base, layer): layer for layer in (base or {}).get("layers", [])})
        _relocate(_baked_paths(venv, mplcache), moves)
        _open_up(target)
        size = _dir_size(target)
        progress(step_line(5, "packing the image"))
        mount = _tree_mount(venv, sandbox_venv, os.path.join(target, "venv.ext4"), progress)
        mounts = [mount] + (base["mounts"] if base else [python] if python else [])
        info = {
            "name": name,
            "hash": recipe["hash"],
            "base": recipe["base"],
            "pip": recipe["pip"],
            "requirements": recipe.get("requirements"),
            "preload": recipe["preload"],
            "format": IMAGE_FORMAT,
            "venv": sandbox_venv,
            "layers": layers,
            "mounts": mounts,
            "python_copy": next((m["tree"] for m in mounts if m["path"] == python_prefix), None),
            "python_prefix": python_prefix,
            "python_version": sys.version.split()[0],
            "mplcache": mplcache,
            "packages": packages,
            "package_list": package_list,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.time() - started, 1),
            "size_bytes": size,
        }
        statefile.write_json(os.path.join(target, "image.json"), info, mode=0o644)
        progress(f"image {name!r} built in {info['build_seconds']} s ({info['size_bytes'] // (1024 * 1024)} MiB)")
        return info

    def remove(self, name: str, in_use: Callable[[str], int]) -> None:
        if self._read(name) is None:
            raise ImageError(f"no image named {name!r}", code="not_found")
        users = in_use(name)
        if users:
            raise ImageError(f"image {name!r} is in use by {users} sandbox(es); delete them first", code="conflict")
        layered = sorted(i["name"] for i in self.list() if i.get("base") == name)
        if layered:
            raise ImageError(f"other images are built on image {name!r} ({', '.join(layered)}); remove them first",
                             code="conflict")
        with self._lock(name):
            target = self.path(name)
            os.unlink(os.path.join(target, "image.json"))  # unselectable first, then gone
            _discard(target)


def _check_image(venv_python: str, target: str, recipe: dict, progress: Progress) -> str:
    """A built image's step 4: matplotlib's font cache built once (not by every sandbox),
    and its preload imports tried; the font cache's directory."""
    name = recipe["name"]
    progress(step_line(4, "checking the image (font cache, preload imports)"))
    mplcache = os.path.join(target, "mplcache")
    os.makedirs(mplcache)
    probe = subprocess.run([venv_python, "-c", "import matplotlib"], capture_output=True)
    if probe.returncode == 0:
        progress("building the matplotlib font cache")
        env = dict(os.environ, MPLCONFIGDIR=mplcache, MPLBACKEND="Agg")
        _run([venv_python, "-c", "import matplotlib.pyplot as plt; plt.figure(); plt.plot([1]); plt.savefig('/dev/null', format='png')"],
             progress, env=env)
    if recipe["preload"]:
        progress(f"checking preload imports: {', '.join(recipe['preload'])}")
        check = subprocess.run([venv_python, "-c", "import " + ", ".join(recipe["preload"])],
                               capture_output=True, text=True, env=dict(os.environ, MPLBACKEND="Agg", MPLCONFIGDIR=mplcache))
        if check.returncode != 0:
            raise ImageError(f"a preload import of image {name!r} fails: {check.stderr.strip().splitlines()[-1:]}")
    return mplcache


def _announce(recipe: dict, base: dict | None, progress: Progress) -> int:
    """Say what a build will cost before it starts; the number of packages asked for."""
    count = len(recipe["pip"]) + len([r for r in (recipe.get("requirements") or "").splitlines()
                                       if r.strip() and not r.lstrip().startswith("#")])
    cost = DEFAULT_BUILD_ESTIMATE if not base else "time and disk as its packages need (on top of the default image)"
    progress(f"building image {recipe['name']!r} ({count} packages: {', '.join(recipe['pip']) or 'requirements file'})"
             f": {cost}")
    progress(step_line(1, "creating the Python environment"))
    return count


def _discard(target: str) -> None:
    """Remove an image's directory, its pack (a venv's, or an own root's) unmounted first,
    and whatever an interrupted mmdebstrap left mounted in its root (/proc, /sys, /dev/pts)."""
    imagefs.unmount([os.path.join(target, "venv.ext4"), os.path.join(target, "root.ext4")])
    debian_root.unmount_under(target)
    shutil.rmtree(target, ignore_errors=True)


def _tree_of(image: dict, sandbox_path: str) -> str:
    """The host tree the sandbox sees at ``sandbox_path``."""
    return next(m["tree"] for m in image["mounts"] if m["path"] == sandbox_path)


def _baked_paths(venv: str, mplcache: str) -> list[str]:
    """The files of a venv (and of its font cache) that name its absolute path: pyvenv.cfg,
    the scripts in bin (shebangs, activate), .pth files, matplotlib's font list."""
    bindir, site = os.path.join(venv, "bin"), _site_packages(venv)
    files = [os.path.join(venv, "pyvenv.cfg")] + [os.path.join(bindir, n) for n in os.listdir(bindir)]
    files += [os.path.join(site, n) for n in os.listdir(site) if n.endswith(".pth")]
    for root, _, names in os.walk(mplcache):
        files += [os.path.join(root, n) for n in names if n.endswith(".json")]
    return files


def _relocate(files: list[str], moves: dict[str, str]) -> None:
    """Rewrite each host path of ``moves`` in ``files`` to where the sandbox sees it (the
    longest first); links and binaries are left as they are."""
    for path in files:
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if data.startswith(b"\x7fELF"):
            continue
        new = data
        for old in sorted(moves, key=len, reverse=True):
            new = new.replace(old.encode(), moves[old].encode())
        if new != data:
            with open(path, "wb") as f:
                f.write(new)


def _site_packages(venv: str) -> str:
    return os.path.join(venv, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")


def _open_up(path: str) -> None:
    """Readable by sandbox uids, writable by nobody but root (images are read-only anyway)."""
    for root, dirs, files in os.walk(path):
        for d in dirs:
            p = os.path.join(root, d)
            if not os.path.islink(p):
                os.chmod(p, 0o755)
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                mode = os.lstat(p).st_mode
                os.chmod(p, 0o755 if mode & 0o111 else 0o644)
    os.chmod(path, 0o755)


def _freeze(python: str) -> list[str]:
    out = subprocess.run([python, "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
                         capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line and "==" in line]
