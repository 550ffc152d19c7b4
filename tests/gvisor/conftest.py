"""The gvisor tier's tests run only where runsc can: skipped, with the reason printed, elsewhere."""

from __future__ import annotations

import pytest

from sandbox.isolation import gvisor


def pytest_collection_modifyitems(config, items):
    ok, why = gvisor.available()
    if ok:
        return
    marker = pytest.mark.skip(reason=f"gvisor backend unavailable here: {why}")
    for item in items:
        if "tests/gvisor/" in str(item.fspath):
            item.add_marker(marker)
    print(f"\ngvisor tests skipped: {why}")
