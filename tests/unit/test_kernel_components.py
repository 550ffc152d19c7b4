"""The kernel's lifecycle components stand alone (kernel/lifecycle.py composes them): each
is made from what it needs, and the control thread's interrupt and shutdown with no cell
and no sandbox do nothing and raise nothing."""

from __future__ import annotations

import asyncio
import logging

from collection import lives_through_a_collection, waiting_handler
from kernel.cells import CellRunner
from kernel.claim import SandboxClaim
from kernel.config import SandboxSettings
from kernel.control import ControlThread
from kernel.lifecycle import SandboxLifecycle
from kernel.queue import ExecutionCounts

LOG = logging.getLogger("test")


def test_components_stand_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    settings = SandboxSettings()
    claim = SandboxClaim(settings, LOG)
    cells = CellRunner(claim, ExecutionCounts(), settings, LOG, tmp_path, tmp_path)
    control = ControlThread(claim, cells, LOG)
    asyncio.run(control.interrupt())  # no running cell, no comm message: nothing to interrupt
    asyncio.run(control.shutdown())  # no sandbox: nothing to delete
    assert claim.shutting_down and claim.sandbox_id is None and cells.cell is None


def test_the_facade_shares_the_kernels_counts(tmp_path):
    counts = ExecutionCounts()
    life = SandboxLifecycle(SandboxSettings(), LOG, cwd=tmp_path, counts=counts)
    assert life.cells.counts is counts
    assert life.claim.on_adopt == life.cells.adopted  # a new sandbox resets what the cells knew


def test_a_control_message_waiting_on_the_server_is_not_collected():
    """An interrupt waits for the sandbox server on the control thread's loop; pyzmq keeps
    no reference to the task of its handler (the shell queue's case, tests/unit/
    test_shell_queue.py), so the kernel holds it until it is answered."""
    from kernel.kernel import SandboxKernel

    answered: list[bool] = []
    kernel = SandboxKernel.__new__(SandboxKernel)  # the method alone: no sockets, no sandbox
    kernel.process_control = waiting_handler(answered)  # the handler, waiting on the server
    kernel._control_lock = asyncio.Lock()
    assert lives_through_a_collection(lambda: kernel.dispatch_control([b"interrupt_request"])), \
        "the waiting control message's task was collected"
    assert answered == [True]
