"""The sandbox's memory limit reaches the JVM and Node.js (sandbox/isolation/runtime_limits.py):
every tier's environment carries it, so that a JVM's heap is a quarter of the sandbox's limit
and V8's old generation half of it, rather than sized from the host's memory
(tests/images/test_java_image.py and test_own_root.py run them)."""

from __future__ import annotations

from sandbox.isolation.bwrap import sandbox_environment
from sandbox.isolation.runtime_limits import runtime_environment


def test_the_jvm_is_told_the_sandbox_memory_limit() -> None:
    assert runtime_environment({"memory_mb": 1024})["JAVA_TOOL_OPTIONS"] == "-XX:MaxRAM=1024m"


def test_node_is_told_half_the_sandbox_memory_limit() -> None:
    assert runtime_environment({"memory_mb": 1024})["NODE_OPTIONS"] == "--max-old-space-size=512"
    assert runtime_environment({"memory_mb": 8})["NODE_OPTIONS"] == "--max-old-space-size=16"


def test_without_a_memory_limit_nothing_is_set() -> None:
    assert runtime_environment({}) == {} and runtime_environment({"memory_mb": None}) == {}


def test_the_sandbox_environment_carries_it() -> None:
    spec = {"image_info": {"venv": "/opt/sandbox-images/x", "root": "debian"},
            "limits": {"memory_mb": 512, "output_bytes": 1000}}
    assert sandbox_environment(spec)["JAVA_TOOL_OPTIONS"] == "-XX:MaxRAM=512m"
    assert sandbox_environment(spec)["NODE_OPTIONS"] == "--max-old-space-size=256"
