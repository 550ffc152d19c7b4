"""The run's images on a root of their own, shared by every test that needs one: each built
once into the run's image home (kept between runs with SANDBOX_KERNEL_TEST_STATE_DIR, where
building it again reuses it: images are content-addressed) under a name that carries the
recipe's hash, then lent to the session server as its other images are
(support.make_state_dir). Import the fixtures by name.

- ``own_root_image``: Debian packages (gcc, nodejs, npm), npm packages (Bun, the JavaScript
  runtime, whose npm package carries its binary; left-pad) and a pip package;
- ``r_image``: the shipped ``r`` recipe (Debian's R), about 100 s and 630 MiB here;
- ``java_image``: the shipped ``java`` recipe (Debian's headless JDK), about 46 s and 790 MiB here;
- ``go_image``: the shipped ``go`` recipe (Debian's Go), about 46 s and 945 MiB here.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

import support
import testrun

from sandbox.images import debian_root
from sandbox.images.images import RECIPES

RECIPE = {"apt": ["gcc", "libc6-dev", "nodejs", "npm"], "npm": ["bun", "left-pad"], "pip": ["six"]}
NAME = "own-root-" + hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:8]


def shipped(recipe_name: str) -> tuple[str, dict]:
    """A shipped recipe's build fields, and the run's name for its image: the recipe's name
    and its fields' hash, so that a changed recipe is built again rather than reused."""
    recipe = {k: RECIPES[recipe_name][k] for k in ("root", "apt", "pip")}
    return f"{recipe_name}-" + hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:8], recipe


def labelled_lines(events: list[dict]) -> dict[str, str]:
    """A cell's stdout lines as {first word: the rest}: the tests' cells print "label value"."""
    text = support.stream_text(events)
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in text.splitlines() if " " in line}


def run_labelled(api, new_sandbox, image: dict, tier: str, cell: str) -> tuple[dict, list[dict], dict[str, str]]:
    """A sandbox of ``image`` on ``tier`` runs ``cell`` (which must succeed): the sandbox, the
    cell's events and its labelled lines. Prints what the image's build cost."""
    print(f"{image['name']} image: built in {image['build_seconds']} s, {image['size_bytes'] // 2**20} MiB")
    sbx = new_sandbox(image=image["name"], isolation=tier)
    events = support.ok(support.execute(api, sbx["id"], cell))
    return sbx, events, labelled_lines(events)


def check_runs_the_listed_version(image: dict, package: str, running: str, separator: str) -> None:
    """The program that ran reports ``running``, the upstream part of the Debian version the
    image's package list gives ``package`` (upstream, then ``separator``, then the rest)."""
    deb = deb_package(image, package)
    assert deb["version"].startswith(running + separator), (deb["version"], running)


def deb_package(image: dict, name: str) -> dict:
    """The Debian package ``name`` in ``image``'s package list (its ecosystem ``deb``)."""
    return next(p for p in image["package_list"] if p.get("ecosystem") == "deb" and p["name"] == name)


def check_sbom_names(image: dict, package: str) -> None:
    """The image's CycloneDX SBOM lists ``package`` (the recipe's one apt package) once, at the
    version its package list gives, marked as asked for."""
    from sandbox.images import image_packages

    listed = deb_package(image, package)
    assert listed["requested"] and listed["version"], listed
    bom = json.loads(image_packages.sbom(image))
    found = [c for c in bom["components"] if c["purl"].startswith(f"pkg:deb/debian/{package}@")]
    assert [c["version"] for c in found] == [listed["version"]], found
    assert image["root"] == "debian" and image["apt"] == [package]


def check_not_in_default_image(api, new_sandbox, programs: tuple[str, ...]) -> None:
    """The control of a language image: a sandbox of the default image finds none of
    ``programs``, so the ones the image's sandbox ran are the image's (skipped, with the
    reason, where the host has one: it could be lent to a default-image sandbox)."""
    on_host = [p for p in programs if shutil.which(p)]
    if on_host:
        pytest.skip(f"the host has {', '.join(on_host)}: a default-image sandbox would see it, the control cannot tell")
    sbx = new_sandbox(isolation="bwrap")
    events = support.ok(support.execute(api, sbx["id"], f"import shutil; print([shutil.which(p) for p in {list(programs)!r}])"))
    assert str([None] * len(programs)) in support.stream_text(events), events


def build_argv(name: str, recipe: dict) -> list[str]:
    """`sandbox image build NAME` of ``recipe`` (root, base, apt, npm, pip) into the run's image home."""
    argv = [sys.executable, "-m", "sandbox", "image", "build", name, "--state-dir", str(testrun.image_home())]
    for key in ("root", "base"):
        if recipe.get(key):
            argv += [f"--{key}", recipe[key]]
    for key in ("apt", "npm", "pip"):
        if recipe.get(key):
            argv += [f"--{key}", *recipe[key]]
    return argv


def build_and_lend(server: support.Server, name: str, recipe: dict) -> tuple[dict, str]:
    """``recipe`` built (or reused) as ``name`` in the run's image home and known to
    ``server``; its record and the build's output (its progress lines)."""
    ok, why = debian_root.available()
    if not ok:
        pytest.skip(f"an image on a root of its own cannot be built here: {why}")
    r = subprocess.run(build_argv(name, recipe), capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    source = testrun.image_home() / "images" / name / "image.json"
    lend(server, source)
    return json.loads(source.read_text()), r.stdout + r.stderr


def lend(server: support.Server, image_json: pathlib.Path) -> None:
    dest = server.state_dir / "images" / image_json.parent.name
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    shutil.copy2(image_json, dest / "image.json")


@pytest.fixture(params=("bwrap", "gvisor"))
def tier(request) -> str:
    """A sandbox tier for one test (function scope: a file's tests stay one group, so that its
    module's fixtures are built once); the gVisor half skipped, with the reason, where runsc
    cannot run."""
    if request.param == "gvisor":
        from sandbox.isolation import gvisor

        ok, why = gvisor.available()
        if not ok:
            pytest.skip(f"gvisor backend unavailable here: {why}")
    return request.param


@pytest.fixture(scope="session")
def own_root_image(sandbox_server) -> dict:
    """The recipe's image, built once per run (or reused from the kept image home), and
    known to the session server."""
    return build_and_lend(sandbox_server, NAME, RECIPE)[0]


@pytest.fixture(scope="session")
def r_image(sandbox_server) -> dict:
    """The shipped ``r`` recipe's image (Debian's r-base-core), built once per run."""
    return build_and_lend(sandbox_server, *shipped("r"))[0]


@pytest.fixture(scope="session")
def java_image(sandbox_server) -> dict:
    """The shipped ``java`` recipe's image (Debian's default-jdk-headless), built once per run."""
    return build_and_lend(sandbox_server, *shipped("java"))[0]


@pytest.fixture(scope="session")
def go_image(sandbox_server) -> dict:
    """The shipped ``go`` recipe's image (Debian's golang-go), built once per run."""
    return build_and_lend(sandbox_server, *shipped("go"))[0]
