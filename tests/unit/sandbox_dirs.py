"""Sandbox directories laid out as a supervisor leaves them (spec.json, state.json), and a
manager over them: the real parts of the manager without any supervisor running.

A supervisor that is "alive" is a real process that sleeps (``sleeper``): the parts judge
liveness by the process, and this one never answers its control socket.
"""

from __future__ import annotations

import os
import subprocess
import sys

from sandbox.common import statefile
from sandbox.core.config import ServiceConfig
from sandbox.core.handles import Handle
from sandbox.core.manager import SandboxManager


def new_manager(tmp_path, **config) -> SandboxManager:
    manager = SandboxManager(ServiceConfig(state_dir=str(tmp_path / "state"), **config))
    manager.state_dir.ensure()
    return manager


def lay_out(manager: SandboxManager, sandbox_id: str, state: str | None, *, spec: bool = True, **record) -> str:
    """A sandbox's directory with its spec and (unless ``state`` is None) its state record."""
    d = manager.state_dir.sandbox(sandbox_id)
    os.makedirs(os.path.join(d, "workspace"), exist_ok=True)
    if spec:
        statefile.write_json(os.path.join(d, "spec.json"), {"id": sandbox_id, "image": "default", "uid": None,
                                                            "limits": {"memory_mb": 256, "disk_mb": 100}})
    if state is not None:
        statefile.write_json(os.path.join(d, "state.json"), {"id": sandbox_id, "state": state, **record},
                             durable=False)
    return d


def handle_of(manager: SandboxManager, sandbox_id: str, state: str, process=None, **record) -> Handle:
    """A registered sandbox whose state record (on disk and as heard) says ``state``."""
    d = lay_out(manager, sandbox_id, state, **record)
    handle = Handle(sandbox_id, d, "default", None, process=process, record={"id": sandbox_id, "state": state, **record})
    manager.registry.live[sandbox_id] = handle
    return handle


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
