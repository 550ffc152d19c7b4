"""The sandbox's memory limit reaches the JVM (sandbox/isolation/runtime_limits.py): every
tier's environment carries it, so that a JVM's heap is a quarter of the sandbox's limit
rather than of the host's memory (tests/images/test_java_image.py runs one)."""

from __future__ import annotations

from sandbox.isolation.bwrap import sandbox_environment
from sandbox.isolation.runtime_limits import runtime_environment


def test_the_jvm_is_told_the_sandbox_memory_limit() -> None:
    assert runtime_environment({"memory_mb": 1024}) == {"JAVA_TOOL_OPTIONS": "-XX:MaxRAM=1024m"}


def test_without_a_memory_limit_nothing_is_set() -> None:
    assert runtime_environment({}) == {} and runtime_environment({"memory_mb": None}) == {}


def test_the_sandbox_environment_carries_it() -> None:
    spec = {"image_info": {"venv": "/opt/sandbox-images/x", "root": "debian"},
            "limits": {"memory_mb": 512, "output_bytes": 1000}}
    assert sandbox_environment(spec)["JAVA_TOOL_OPTIONS"] == "-XX:MaxRAM=512m"
