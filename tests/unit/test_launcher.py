"""The launcher's pieces that need no supervisor: the runtime copy keyed by its content, the
isolation a create may ask for, and a host uid of each sandbox's own."""

from __future__ import annotations

import os
import stat

import pytest

from sandbox.common.errors import ApiError
from sandbox.core.launcher import choose_backend, install_runtime
from sandbox.runtime import vocabulary as V

from sandbox_dirs import handle_of, new_manager, sleeper


def test_the_runtime_is_copied_once_readable_by_sandbox_uids(tmp_path):
    first = install_runtime(str(tmp_path))
    assert install_runtime(str(tmp_path)) == first
    copied = os.path.join(first, "sandbox_runtime", "vocabulary.py")
    assert stat.S_IMODE(os.stat(copied).st_mode) == 0o644
    assert os.listdir(tmp_path) == [os.path.basename(first)], "a second install left a copy"


def test_a_create_asking_what_bwrap_cannot_do_is_refused(tmp_path):
    config = new_manager(tmp_path).config
    assert choose_backend(config, {}) == config.default_isolation
    with pytest.raises(ApiError) as refused:
        choose_backend(config, {"isolation": V.BWRAP, "on_idle": V.ON_IDLE_PAUSE})
    assert refused.value.status == 422 and "needs isolation 'gvisor'" in refused.value.message


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox gets a host uid of its own only on a root server")
def test_a_new_sandbox_never_gets_a_live_ones_uid(tmp_path):
    manager = new_manager(tmp_path, uid_base=200000, uid_count=2)
    process = sleeper()
    try:
        handle_of(manager, "sbx-a", V.RUNNING, process=process).uid = 200000
        assert {manager.launcher.allocate_uid() for _ in range(50)} == {200001}
        handle_of(manager, "sbx-b", V.RUNNING, process=process).uid = 200001
        with pytest.raises(ApiError, match="no free sandbox uid"):
            manager.launcher.allocate_uid()
    finally:
        process.kill()
        process.wait()
