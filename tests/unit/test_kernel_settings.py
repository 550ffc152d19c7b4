"""The table of the kernel's settings (docs/kernel.md) is the one scripts/kernel_settings_table.py makes
from kernel/config.py, and every environment variable it lists really sets its trait."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

from kernel.config import SandboxSettings

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAITS = SandboxSettings.class_traits(config=True)

# A value each kind of trait accepts from its variable, and what the trait then holds.
SAMPLES = {
    "Unicode": ("some-value", "some-value"),
    "Int": ("12345", 12345),
    "Float": ("2.5", 2.5),
    "Bool": ("1", True),
    "Dict": ('{"allow": ["example.org"]}', {"allow": ["example.org"]}),
}


def _script():
    spec = importlib.util.spec_from_file_location("kernel_settings_table", ROOT / "scripts" / "kernel_settings_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pages_table_is_made_from_the_traits(capsys):
    assert _script().main(["--check"]) == 0, capsys.readouterr().err


def test_every_setting_names_its_environment_variable():
    untagged = sorted(name for name, trait in TRAITS.items() if not trait.metadata.get("env"))
    assert not untagged, f"traits without an env tag (the table would say '-'): {untagged}"


@pytest.mark.parametrize("name", sorted(TRAITS))
def test_the_listed_variable_sets_the_trait(name, monkeypatch):
    trait = TRAITS[name]
    raw, expected = SAMPLES[type(trait).__name__]
    if name == "keep_notebook_sandbox":  # default True: the variable must be able to turn it off
        raw, expected = "0", False
    monkeypatch.setenv(trait.metadata["env"], raw)
    assert getattr(SandboxSettings(), name) == expected


def test_a_table_out_of_date_is_caught(tmp_path, monkeypatch):
    """The control: a page whose table lost a row fails the check."""
    script = _script()
    page = tmp_path / "kernel.md"
    page.write_text(script.block().replace("| `stream_limit` |", "| `stream_limits` |"))
    monkeypatch.setattr(script, "PAGE", page)
    assert script.main(["--check"]) == 1
    assert script.main(["--write"]) == 0 and script.main(["--check"]) == 0
