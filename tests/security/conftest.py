"""The security suites run once per isolation tier (the `isolation` fixture of
tests/conftest.py): their own servers default to the tier, and `new_sandbox` creates in it.
A probe that does not apply to gVisor is marked ``bwrap_only(reason=...)``."""

from __future__ import annotations

from tiers import new_sandbox, spawn_server  # noqa: F401 (fixtures, per tier)
