"""Custom images: built once from a pip recipe, layered on the default image, selected per
sandbox, immutable, reused for the same recipe, removable only when unused.

`six` is the small pure-Python package under test: it is not in the default image (checked
here, so the test cannot pass by accident if the default image ever gains it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sandbox.images.installer import Installer

import support

PACKAGE = "six"


def build(api, **fields) -> tuple[list[dict], dict]:
    events = support.stream_events(api, "POST", "/v1/images", json=fields, timeout=600)
    assert events and events[-1]["type"] == "done"
    return events[:-1], events[-1]


def result_text(events: list[dict]) -> str:
    return "".join(e.get("text", "") for e in events if e["type"] == "stream") + "".join(
        e["data"].get("text/plain", "") for e in events if e["type"] == "execute_result")


@pytest.fixture(scope="module")
def tiny_image(sandbox_server):
    import httpx

    # Removing the image ends its warm sandboxes first: more than httpx's default 5 s on a busy box.
    with httpx.Client(base_url=sandbox_server.url, headers={"Authorization": f"Bearer {sandbox_server.token}"},
                      timeout=httpx.Timeout(30, read=120)) as api:
        progress, done = build(api, name="tiny", pip=[PACKAGE], preload=["six"])
        assert done["status"] == "ok", done
        yield done["image"]
        api.delete("/v1/images/tiny")


@pytest.mark.slow
def test_build_lists_the_image_with_its_recipe(api, tiny_image):
    assert tiny_image["name"] == "tiny"
    assert tiny_image["base"] == "default"
    assert tiny_image["pip"] == [PACKAGE]
    assert any(p.lower().startswith(f"{PACKAGE}==") for p in tiny_image["packages"])
    listed = {i["name"]: i for i in api.get("/v1/images").json()["images"]}
    assert "tiny" in listed and "default" in listed
    assert listed["tiny"]["size_bytes"] > 0 and listed["tiny"]["built_at"]


def test_sandbox_on_the_image_imports_the_package_and_the_base_ones(new_sandbox, run, tiny_image):
    sbx = new_sandbox(image="tiny")
    assert sbx["image"] == "tiny"
    events = run(sbx["id"], "import six, numpy, pandas\nprint(six.__name__, numpy.__name__, pandas.__name__)")
    assert events[-1]["status"] == "ok", events
    assert "six numpy pandas" in result_text(events)


def test_default_image_does_not_have_it(new_sandbox, run, tiny_image):
    sbx = new_sandbox()
    events = run(sbx["id"], "import six")
    errors = [e for e in events if e["type"] == "error"]
    assert [e["ename"] for e in errors] == ["ModuleNotFoundError"]


def test_pip_install_still_fails_inside(new_sandbox, run, tiny_image):
    sbx = new_sandbox(image="tiny")
    events = run(sbx["id"], "import subprocess, sys\n"
                            "r = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', '--retries', '0', "
                            "'--timeout', '3', 'requests'], capture_output=True, text=True)\n"
                            "print('exit', r.returncode)\n"
                            "import importlib.util; print('found', importlib.util.find_spec('requests') is not None)", timeout_seconds=120)
    text = result_text(events)
    assert "exit 0" not in text and "exit " in text
    assert "found False" in text


@pytest.mark.slow
def test_rm_refused_while_in_use_then_allowed(api, new_sandbox, sandbox_server):
    progress, done = build(api, name="tiny-rm", pip=[PACKAGE])
    assert done["status"] == "ok", done
    sbx = new_sandbox(image="tiny-rm")
    r = api.delete("/v1/images/tiny-rm")
    assert r.status_code == 409
    assert "in use" in r.json()["error"]["message"]
    assert api.get("/v1/images/tiny-rm").status_code == 200
    api.delete(f"/v1/sandboxes/{sbx['id']}")
    r = api.delete("/v1/images/tiny-rm")
    assert r.status_code == 200, r.text
    assert api.get("/v1/images/tiny-rm").status_code == 404
    assert not os.path.exists(os.path.join(sandbox_server.state_dir, "images", "tiny-rm"))
    r = api.post("/v1/sandboxes", json={"image": "tiny-rm"})
    assert r.status_code == 404 and "tiny-rm" in r.json()["error"]["message"]


def test_same_recipe_is_reused_and_another_recipe_refused(api, tiny_image):
    progress, done = build(api, name="tiny", pip=[PACKAGE], preload=["six"])
    assert done["status"] == "ok"
    assert done["image"]["built_at"] == tiny_image["built_at"]
    assert any("reusing" in p["message"] for p in progress)
    progress, done = build(api, name="tiny", pip=[PACKAGE, "wheel"])
    assert done["status"] == "error" and done["error"]["code"] == "conflict"


def test_bad_package_fails_cleanly_and_leaves_nothing(api, sandbox_server):
    progress, done = build(api, name="broken", pip=["this-package-does-not-exist-sbk-4242"])
    assert done["status"] == "error"
    assert "this-package-does-not-exist-sbk-4242" in done["error"]["message"]
    assert api.get("/v1/images/broken").status_code == 404
    assert not os.path.exists(os.path.join(sandbox_server.state_dir, "images", "broken"))


def test_invalid_recipes_are_refused(api):
    assert api.post("/v1/images", json={"name": "Bad Name", "pip": ["six"]}).status_code == 422
    assert api.post("/v1/images", json={"name": "x", "pip": "six"}).status_code == 422
    progress, done = build(api, name="flagged", pip=["--index-url=http://evil"])
    assert done["status"] == "error" and "not a package requirement" in done["error"]["message"]


def test_cli_lists_images(sandbox_server, tiny_image):
    out = subprocess.run([sys.executable, "-m", "sandbox", "image", "ls", "--state-dir", str(sandbox_server.state_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("tiny "))
    assert PACKAGE in line


def test_kernel_runs_on_the_image_its_kernelspec_names(sandbox_server, tiny_image, api, tmp_path, monkeypatch):
    """`sandbox-kernel install --image tiny` gives a kernel whose sandbox has the package."""
    import pathlib


    from kernel.install import install_kernelspec

    spec_dir = pathlib.Path(install_kernelspec(prefix=str(tmp_path), image="tiny"))
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["display_name"] == "Python (sandbox: tiny)"
    env = support.kernel_environ(sandbox_server, tmp_path / "share" / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", env["JUPYTER_PATH"])  # where this process looks the spec up
    km, kc = support.start_kernel(spec_dir.name, env=env, cwd=str(tmp_path), startup_timeout=120)
    try:
        run = support.run_cell(kc, "import six; print(six.__name__)", timeout=120)
        assert run.status == "ok", run.errors
        assert run.stdout.strip() == "six"
        kernel_sandboxes = [s for s in api.get("/v1/sandboxes").json()["sandboxes"]
                            if s["metadata"].get("kernel_pid") == km.provisioner.pid]
        assert [s["image"] for s in kernel_sandboxes] == ["tiny"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def _pip_list_in_a_cell(new_sandbox, run, image: str) -> dict[str, str]:
    sbx = new_sandbox(image=image)
    events = run(sbx["id"], "import subprocess, sys\n"
                            "print(subprocess.run([sys.executable, '-m', 'pip', 'list', '--format=json', "
                            "'--disable-pip-version-check'], capture_output=True, text=True).stdout)")
    assert events[-1]["status"] == "ok", events
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(result_text(events))}


def test_package_list_matches_pip_list_in_a_cell(api, new_sandbox, run, tiny_image):
    image = api.get("/v1/images/tiny").json()
    listed = {p["name"].lower().replace("_", "-"): p["version"] for p in image["package_list"]}
    assert listed == _pip_list_in_a_cell(new_sandbox, run, "tiny")
    by_name = {p["name"].lower(): p for p in image["package_list"]}
    assert by_name[PACKAGE]["layer"] == "tiny" and by_name[PACKAGE]["requested"] is True
    assert by_name["numpy"]["layer"] == "default"  # from the base image the recipe is layered on
    assert by_name[PACKAGE]["source"] == "package index"
    assert by_name[PACKAGE]["installer"] == Installer().name  # uv, where installed (sandbox/images/installer.py)


def test_image_inspect_and_its_cyclonedx_sbom(sandbox_server, tiny_image, tmp_path):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    def inspect(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sandbox", "image", "inspect", "tiny", "--state-dir",
                               str(sandbox_server.state_dir), *extra], capture_output=True, text=True, timeout=120)

    shown = inspect("--format", "json", "--sbom", str(tmp_path / "a.cdx.json"))
    assert shown.returncode == 0, shown.stderr
    packages = json.loads(shown.stdout)["package_list"]
    assert PACKAGE in [p["name"].lower() for p in packages]
    sbom_text = (tmp_path / "a.cdx.json").read_text()
    assert JsonStrictValidator(SchemaVersion.V1_5).validate_str(sbom_text) is None
    sbom = json.loads(sbom_text)
    assert sbom["bomFormat"] == "CycloneDX" and sbom["metadata"]["component"]["name"] == "tiny"
    purls = {c["purl"] for c in sbom["components"]}
    assert purls == {f"pkg:pypi/{p['name'].lower().replace('_', '-')}@{p['version']}" for p in packages}
    [image_ref] = [d for d in sbom["dependencies"] if d["ref"] == "image:tiny"]
    assert len(image_ref["dependsOn"]) == len(packages)  # the image is made of its packages: a complete graph
    alone = inspect("--sbom", str(tmp_path / "b.cdx.json"))
    assert alone.returncode == 0 and (tmp_path / "b.cdx.json").read_text() == sbom_text  # the same every time
    # Only the file was asked for: one line says where it went; no table, no library warning.
    assert alone.stdout == "" and alone.stderr == (f"wrote the CycloneDX SBOM of image tiny ({len(packages)} "
                                                   f"packages) to {tmp_path / 'b.cdx.json'}\n"), alone
    table = inspect().stdout.splitlines()
    assert table[1].split() == ["NAME", "VERSION", "LAYER", "SOURCE"]
    missing = subprocess.run([sys.executable, "-m", "sandbox", "image", "inspect", "nope", "--state-dir",
                              str(sandbox_server.state_dir)], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no image named 'nope'" in missing.stderr


def test_an_invalid_sbom_is_caught():
    """The validation above can fail: a component without its required name is refused."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    bad = {"bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1, "components": [{"type": "library"}]}
    assert JsonStrictValidator(SchemaVersion.V1_5).validate_str(json.dumps(bad)) is not None


@pytest.mark.slow
def test_the_same_recipe_built_twice_lists_the_same_versions(api, tiny_image):
    progress, done = build(api, name="tiny-again", pip=[PACKAGE], preload=["six"])
    assert done["status"] == "ok", done
    try:
        again = api.get("/v1/images/tiny-again").json()["package_list"]
        first = api.get("/v1/images/tiny").json()["package_list"]
        strip = lambda ps: [(p["name"], p["version"], p["source"]) for p in ps]  # noqa: E731
        assert strip(again) == strip(first)
    finally:
        api.delete("/v1/images/tiny-again")
