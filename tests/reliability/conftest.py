"""The reliability tests' servers of their own (to kill) come from `spawn_server`
(tests/conftest.py); their cells and streams from reliability_support.py, here."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
