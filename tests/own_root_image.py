"""The run's one image on a root of its own (Debian packages, an npm and a pip package),
shared by every test that needs one: built once into the run's image home (kept between
runs with SANDBOX_KERNEL_TEST_STATE_DIR, where building it again reuses it: images are
content-addressed) under a name that carries the recipe's hash, then lent to the session
server as its other images are (support.make_state_dir). Import the fixture by name."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

import testrun

from sandbox.images import debian_root

RECIPE = {"apt": ["gcc", "libc6-dev", "nodejs", "npm"], "npm": ["left-pad"], "pip": ["six"]}
NAME = "own-root-" + hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:8]


@pytest.fixture(scope="session")
def own_root_image(sandbox_server) -> dict:
    """The recipe's image, built once per run (or reused from the kept image home), and
    known to the session server."""
    ok, why = debian_root.available()
    if not ok:
        pytest.skip(f"an image on a root of its own cannot be built here: {why}")
    home = testrun.image_home()
    argv = [sys.executable, "-m", "sandbox", "image", "build", NAME, "--state-dir", str(home),
            "--apt", *RECIPE["apt"], "--npm", *RECIPE["npm"], "--pip", *RECIPE["pip"]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    source = home / "images" / NAME / "image.json"
    dest = sandbox_server.state_dir / "images" / NAME
    dest.mkdir(mode=0o755, parents=True, exist_ok=True)
    shutil.copy2(source, dest / "image.json")
    return json.loads(source.read_text())
