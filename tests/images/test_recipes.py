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
