"""A simulated reboot on the bwrap tier: the server killed (-9), every process of every
sandbox killed, and what a reboot clears (the workspaces' mounts, the cgroups) removed; the
server then starts again on the same state directory, and the notebook's next kernel (a real
kernel, as Jupyter Server starts it) gets back, by value, what its last save held.

Two ways a notebook's variables reach the disk before the crash: `%sandbox save` on demand
while the sandbox runs (the sandbox is then lost, and the next kernel creates one from the
save), and sleep by value (the sandbox is asleep, and the next kernel wakes it under its id).
"""

from __future__ import annotations

import os
import pathlib
import re
import typing as t

import pytest
from support import run_cell

import support
from saved_namespace import BACK, CHECK, NOTEBOOK
from test_kernel import sandbox_id

pytestmark = [pytest.mark.slow,
              pytest.mark.bwrap_only("state by value is the default tier's way to outlive a sandbox")]



def reboot(server: support.Server) -> None:
    """What a host reboot leaves of a state directory: its files. The server and every
    sandbox process killed (the supervisors too), no mount, no cgroup."""
    ids = support.sandbox_ids(server.state_dir)
    server.kill9()
    support.signal_all(support.processes_of(server.state_dir, ids), 9)
    assert support.wait_for(lambda: not support.processes_of(server.state_dir, ids), 30), \
        support.processes_of(server.state_dir, ids)
    support.unmount_under(server.state_dir)
    for group in support.cgroup_dirs(*ids):
        # busy until the killed tasks are reaped (they were the dead supervisor's children)
        assert support.wait_for(lambda: removed(group), 30), f"{group} still busy"
    assert not support.cgroup_dirs(*ids)
    assert not [p for p in (server.state_dir / "sandboxes").glob("*/workspace") if os.path.ismount(p)]


def removed(group: pathlib.Path) -> bool:
    """Remove a cgroup directory tree, deepest first (a cgroup's files go with it)."""
    try:
        for child in sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            os.rmdir(child)
        os.rmdir(group)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def notebook_kernel(start_kernel: t.Callable[..., t.Any], server: support.Server, folder: pathlib.Path):
    return start_kernel(cwd=folder, JPY_SESSION_NAME=str(folder / "analysis.ipynb"), **server.env)


def test_after_a_reboot_the_next_kernel_has_the_last_save_back(start_kernel, spawn_server, tmp_path):
    server = spawn_server("--set", "bwrap_sleep_after_seconds=0")
    km, kc = notebook_kernel(start_kernel, server, tmp_path)
    assert run_cell(kc, NOTEBOOK, timeout=300).status == "ok"
    saved = run_cell(kc, "%sandbox save", timeout=300)
    assert saved.status == "ok" and "not saved: log (_io.TextIOWrapper" in saved.stdout, (saved.errors, saved.stdout)
    sid = sandbox_id(kc)
    kc.stop_channels()
    reboot(server)
    km.shutdown_kernel(now=True)  # the kernel died with the host
    server.start()

    km, kc = notebook_kernel(start_kernel, server, tmp_path)
    run = run_cell(kc, CHECK, timeout=300)
    assert run.status == "ok", run.errors
    assert run.result_text() == BACK
    note = run.notes
    assert f"the sandbox of this notebook ({sid}) ended" in note, note
    assert re.search(r"restored this notebook's variables saved \d+s ago \(sv-[0-9a-f]{16}\): .*df \(pandas\.", note), note
    assert "not restored: log (_io.TextIOWrapper: an open file" in note, note
    assert sandbox_id(kc) != sid


def test_a_sandbox_asleep_by_value_at_the_reboot_wakes_under_its_id(start_kernel, spawn_server, tmp_path):
    server = spawn_server("--set", "bwrap_sleep_after_seconds=3")
    km, kc = notebook_kernel(start_kernel, server, tmp_path)
    assert run_cell(kc, NOTEBOOK, timeout=300).status == "ok"
    sid = sandbox_id(kc)
    with server.client(timeout=60) as api:
        assert support.wait_for(lambda: api.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused", 120)
    kc.stop_channels()
    reboot(server)
    km.shutdown_kernel(now=True)
    server.start()
    with server.client(timeout=60) as api:
        assert api.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"

    km, kc = notebook_kernel(start_kernel, server, tmp_path)
    run = run_cell(kc, CHECK, timeout=300)
    assert run.status == "ok", run.errors
    assert run.result_text() == BACK
    note = run.notes
    print(note, flush=True)  # the wake's time, for the record (-s)
    assert f"this notebook's sandbox {sid} was asleep since" in note and "restored by value" in note, note
    assert "not restored: log (_io.TextIOWrapper" in note, note
    assert sandbox_id(kc) == sid
