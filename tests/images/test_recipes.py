"""The image recipes shipped with the project (sandbox/images/images.py RECIPES).

CI does not build the data-science image: it takes minutes and ~850 MiB (docs/getting-started.md gives the
figures of a build by hand). These tests check what CI can check cheaply: that the recipe
has the packages agents expect, that `image build datascience` with no packages builds from
the recipe (up to pip itself, which is stubbed out at the store's `_build` boundary), that
explicit packages still win, and that a build's recipe hash covers the recipe.
"""

from __future__ import annotations

import pytest

from sandbox.images import images
from sandbox.images.images import RECIPES, ImageStore
from sandbox.common.paths import StateDir

# What managed agent sandboxes commonly preinstall for data work, beyond the default image.
EXPECTED = {"scipy", "scikit-learn", "seaborn", "statsmodels", "pyarrow", "openpyxl", "polars", "duckdb"}


def test_datascience_recipe_has_the_expected_packages() -> None:
    recipe = RECIPES["datascience"]
    assert EXPECTED <= set(recipe["pip"]), EXPECTED - set(recipe["pip"])
    assert not set(recipe["pip"]) & set(images.DEFAULT_PACKAGES)  # layered: no second numpy/pandas
    assert all(spec and not spec.startswith("-") for spec in recipe["pip"])


@pytest.fixture
def recorded_builds(tmp_path, monkeypatch) -> tuple[ImageStore, list[dict]]:
    """A store whose builds record their recipe instead of running pip; the default image
    counts as built."""
    store = ImageStore(StateDir(str(tmp_path)))
    builds: list[dict] = []

    def fake_build(self, target, recipe, base, progress):
        builds.append(recipe)
        return {"name": recipe["name"], "hash": recipe["hash"]}

    monkeypatch.setattr(ImageStore, "_build", fake_build)
    monkeypatch.setattr(ImageStore, "get", lambda self, name: {"name": name, "venv": "/x", "layers": []}
                        if name == images.DEFAULT_IMAGE else None)
    return store, builds


def test_build_by_name_uses_the_recipe(recorded_builds) -> None:
    store, builds = recorded_builds
    store.build("datascience", progress=lambda line: None)
    (recipe,) = builds
    assert recipe["pip"] == sorted(RECIPES["datascience"]["pip"])
    assert recipe["base"] == images.DEFAULT_IMAGE
    assert recipe["preload"] == list(RECIPES["datascience"]["preload"])


def test_explicit_packages_win_over_the_recipe(recorded_builds) -> None:
    store, builds = recorded_builds
    store.build("datascience", pip=["six"], progress=lambda line: None)
    assert builds[-1]["pip"] == ["six"]


def test_an_unknown_name_without_packages_is_refused_and_names_the_recipes(recorded_builds) -> None:
    store, builds = recorded_builds
    with pytest.raises(images.ImageError, match="datascience"):
        store.build("analytics", progress=lambda line: None)
    assert builds == []


def test_the_shipped_own_root_recipes_have_a_debian_root_and_the_runtime_packages() -> None:
    """gemini-analysis and nodejs are built on a root of their own (no base image: the
    runtime's packages are in their own venv)."""
    gemini = images.make_recipe("gemini-analysis", [], None, None)
    assert gemini["root"] == "debian" and gemini["base"] is None
    assert {"polars", "duckdb", "scipy"} <= set(gemini["pip"]) and set(images.DEFAULT_PACKAGES) <= set(gemini["pip"])
    node = images.make_recipe("nodejs", [], None, None)
    assert node["root"] == "debian" and {"nodejs", "npm"} <= set(node["apt"]) and node["npm"] == ["bun", "typescript"]


@pytest.mark.parametrize("field, value, message", [
    ("apt", "gcc; rm -rf /", "not a Debian package name"),
    ("apt", "--allow-unauthenticated", "not a Debian package name"),
    ("npm", "typescript && curl x", "not an npm package"),
    ("npm", "-g", "not an npm package"),
])
def test_a_bad_apt_or_npm_name_is_refused_with_a_message(field, value, message) -> None:
    with pytest.raises(images.ImageError, match=message):
        images.make_recipe("poly", [], None, None, **{field: [value]})


def test_an_own_root_recipe_hash_differs_and_a_venv_recipe_hash_is_unchanged() -> None:
    """Images built before own roots keep their hashes (else a rebuild would be refused as
    another recipe under the same name)."""
    venv = images.make_recipe("tiny", ["six"], None, ["numpy"])
    assert images.recipe_hash(venv) == "8feeff441577f24f"  # what the version before own roots computed
    own = images.make_recipe("tiny", ["six"], None, None, apt=["gcc"])
    assert images.recipe_hash(own) != images.recipe_hash(images.make_recipe("tiny", ["six"], None, None, apt=["g++"]))


@pytest.mark.parametrize("name, apt", [("r", ["r-base-core"]), ("java", ["default-jdk-headless"]),
                                       ("go", ["golang-go"])])
def test_a_shipped_language_recipe_is_debian_packages_on_a_root_of_its_own(name, apt) -> None:
    recipe = images.make_recipe(name, [], None, None)
    assert recipe["root"] == "debian" and recipe["base"] is None and recipe["apt"] == apt
    assert set(images.DEFAULT_PACKAGES) <= set(recipe["pip"])


def test_a_layered_recipe_names_its_base_and_its_base_build_in_its_hash() -> None:
    """Content-addressed on the base's build too: the same packages on another build of the
    base (its hash) are another image."""
    layer = images.make_recipe("node-jq", [], None, None, apt=["jq"], base="nodejs")
    assert layer["base"] == "nodejs" and layer["root"] == "debian" and layer["pip"] == []  # the base has the runtime's
    one, other = dict(layer, base_hash="a" * 16), dict(layer, base_hash="b" * 16)
    assert images.recipe_hash(one) != images.recipe_hash(other)


@pytest.mark.parametrize("kwargs, message", [
    ({"base": "nodejs"}, "needs packages"),
    ({"base": "node-jq", "apt": ["jq"]}, "not valid"),
    ({"base": "Bad/Name", "apt": ["jq"]}, "not valid"),
    ({"base": images.DEFAULT_IMAGE, "apt": ["jq"]}, "root of its own"),
])
def test_a_bad_base_is_refused_with_a_message(kwargs, message) -> None:
    with pytest.raises(images.ImageError, match=message):
        images.make_recipe("node-jq", [], None, None, **kwargs)


def test_a_layer_on_an_image_without_a_root_of_its_own_is_refused(recorded_builds, monkeypatch) -> None:
    """A venv image's packages live over the host's /usr: there is no root to add to."""
    store, builds = recorded_builds
    monkeypatch.setattr(ImageStore, "get", lambda self, name: {"name": name, "venv": "/x", "layers": [], "hash": "h"}
                        if name == "stats" else None)
    with pytest.raises(images.ImageError, match="no root of its own"):
        store.build("layer", apt=["jq"], base="stats", progress=lambda line: None)
    with pytest.raises(images.ImageError, match="no image named 'missing'"):
        store.build("layer", apt=["jq"], base="missing", progress=lambda line: None)
    assert builds == []
