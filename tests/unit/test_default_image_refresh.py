"""A default image built by an older version of the project, before a package joined the
default recipe (ipywidgets, tqdm and cloudpickle did), is built again at start-up when nothing runs on it,
and reported with what to do when something does.

The store is real (a temporary state directory holding the old image's image.json); only its
`build` is replaced by a recorder, since a real build of the default image takes minutes and
is exercised by every suite that starts a server.
"""

from __future__ import annotations

import json
import os

import pytest

from sandbox.images import images
from sandbox.common.paths import StateDir

OLD_RECIPE = ["ipython", "matplotlib", "matplotlib-inline", "numpy", "pandas", "polars==1.0"]


@pytest.fixture
def store(tmp_path):
    store = images.ImageStore(StateDir(str(tmp_path)))
    store.built = []
    store.build = lambda name, **kw: store.built.append((name, kw))  # the recorder
    return store


def put_image(store: images.ImageStore, name: str, pip: list[str], base: str | None = None) -> None:
    os.makedirs(store.path(name))
    with open(os.path.join(store.path(name), "image.json"), "w") as f:
        json.dump({"name": name, "format": images.IMAGE_FORMAT, "pip": pip, "base": base,
                   "preload": images.DEFAULT_PRELOAD, "requirements": None}, f)


def test_package_names_are_read_from_requirements():
    assert [images.package_name(p) for p in ["ipywidgets>=8.1,<9", "Typing_Extensions", "tqdm", "a[b]==1"]] == \
        ["ipywidgets", "typing-extensions", "tqdm", "a"]


def test_an_old_default_misses_the_new_packages_and_a_current_one_none():
    assert images.missing_defaults({"pip": OLD_RECIPE}) == ["ipywidgets>=8.1,<9", "tqdm", "cloudpickle"]
    assert images.missing_defaults({"pip": images.DEFAULT_PACKAGES}) == []


def test_an_old_default_nobody_uses_is_built_again_with_its_extra_packages(store):
    put_image(store, images.DEFAULT_IMAGE, OLD_RECIPE)
    said = []
    store.refresh_default(0, progress=said.append)
    assert store.built == [(images.DEFAULT_IMAGE, {"pip": ["polars==1.0"], "requirements": None,
                                                   "preload": images.DEFAULT_PRELOAD, "progress": said.append})]
    assert not os.path.exists(store.path(images.DEFAULT_IMAGE)), "the old image was not removed first"
    assert "without ipywidgets>=8.1,<9, tqdm, cloudpickle: building it again" in said[0]


@pytest.mark.parametrize("sandboxes, layered", [(2, False), (0, True)])
def test_an_old_default_in_use_is_kept_and_reported(store, sandboxes, layered):
    put_image(store, images.DEFAULT_IMAGE, OLD_RECIPE)
    if layered:
        put_image(store, "science", ["scipy"], base=images.DEFAULT_IMAGE)
    said = []
    store.refresh_default(sandboxes, progress=said.append)
    assert store.built == [] and store.get(images.DEFAULT_IMAGE) is not None
    assert said and said[0].startswith("warning:") and "sandbox-kernel image rm default" in said[0], said
    assert ("2 sandbox(es)" if sandboxes else "the images science") in said[0]


def test_a_current_default_is_left_alone(store):
    put_image(store, images.DEFAULT_IMAGE, images.DEFAULT_PACKAGES)
    said = []
    store.refresh_default(0, progress=said.append)
    assert store.built == [] and said == [] and store.get(images.DEFAULT_IMAGE) is not None
