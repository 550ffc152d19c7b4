"""The reliability tests' servers of their own (to kill) come from `spawn_server`
(tests/conftest.py), per isolation tier (tests/tiers.py); their cells and streams from
reliability_support.py, here. A test that does not apply to gVisor is marked
``bwrap_only(reason=...)``."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from tiers import new_sandbox, spawn_server  # noqa: E402, F401 (fixtures, per tier)
