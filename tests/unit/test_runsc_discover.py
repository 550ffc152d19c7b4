"""runsc's version is asked once per binary file (sandbox/isolation/gvisor.py, ``discover``):
``runsc --version`` starts the Go binary on every spawn and restore otherwise. A runsc put
in its place (an upgrade) is asked again. The runsc here is a script on a PATH of the
test's own that counts its calls."""

from __future__ import annotations

import os
import pathlib

import pytest

from sandbox.isolation import gvisor

SCRIPT = """#!/bin/sh
echo called >> "{calls}"
echo "runsc version {version}"
echo "spec: 1.0.2"
"""


@pytest.fixture
def fake_runsc(tmp_path: pathlib.Path, monkeypatch):
    calls = tmp_path / "calls"
    binary = tmp_path / "bin" / "runsc"
    binary.parent.mkdir()

    def install(version: str) -> None:
        fresh = binary.with_name("runsc.new")
        fresh.write_text(SCRIPT.format(calls=calls, version=version))
        fresh.chmod(0o755)
        os.replace(fresh, binary)  # another inode, as a package upgrade makes

    monkeypatch.setenv("PATH", f"{binary.parent}:{os.environ.get('PATH', '')}")
    monkeypatch.setattr(gvisor, "_versions", {})
    install("release-1")
    return install, lambda: len(calls.read_text().splitlines()) if calls.exists() else 0


def test_the_version_is_asked_once_per_binary(fake_runsc) -> None:
    install, calls = fake_runsc
    first = gvisor.discover()
    assert first is not None and first.version == "release-1"
    assert gvisor.discover() == first and gvisor.discover() == first
    assert calls() == 1


def test_an_upgraded_runsc_is_asked_again(fake_runsc) -> None:
    install, calls = fake_runsc
    assert gvisor.discover().version == "release-1"
    install("release-2")
    assert gvisor.discover().version == "release-2"
    assert calls() == 2
