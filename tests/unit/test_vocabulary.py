"""The protocol vocabulary: one definition of states, moves, reasons and events, and no second list.

Pure checks of sandbox/runtime/vocabulary.py, plus a scan of the project's own sources for
the hand-spelled lists it replaced (a second list drifts: it had, without `lost` and
without `protocol`).
"""

from __future__ import annotations

import pathlib
import re

import pytest

from sandbox.runtime import vocabulary as V

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ended_states_are_final_and_live_ones_can_end_every_way():
    for ended in V.ENDED_STATES:
        for target in V.STATES:
            assert not V.can_move(ended, target), (ended, target)
            with pytest.raises(V.IllegalTransition):
                V.advance({"state": ended}, target)
    for live in V.LIVE_STATES:
        assert V.ENDED_STATES <= V.TRANSITIONS[live], live


def test_illegal_moves_raise_and_leave_the_record_alone():
    record = {"state": V.RUNNING}
    with pytest.raises(V.IllegalTransition, match="'running' -> 'pooled'"):
        V.advance(record, V.POOLED)
    with pytest.raises(V.IllegalTransition):
        V.advance(record, "sleeping")  # not a state at all
    assert record == {"state": V.RUNNING}
    V.advance(record, V.DEAD, dead_reason=V.PROTOCOL)
    assert record == {"state": V.DEAD, "dead_reason": V.PROTOCOL}


def test_every_table_key_is_a_state_and_every_move_targets_one():
    assert set(V.TRANSITIONS) == V.STATES
    for targets in V.TRANSITIONS.values():
        assert targets <= V.STATES


def test_reasons_cover_every_way_a_sandbox_ends():
    for name in (V.PROTOCOL, V.LOST, V.EXPIRED, V.DELETED, V.OOM, V.PIDS, V.CRASHED, V.TIMEOUT_KILLED):
        assert V.REASONS[name].fatal, name
    for name in (V.INTERRUPTED, V.TIMEOUT_INTERRUPTED, V.SERVER_SHUTDOWN):
        assert not V.REASONS[name].fatal, name


def test_done_constructor_refuses_words_outside_the_vocabulary():
    done = V.done_event(V.ERROR, execution_count=3, reason=V.PROTOCOL, sandbox_state=V.DEAD)
    assert done == {"type": "done", "status": "error", "execution_count": 3, "duration": 0.0,
                    "truncated": False, "reason": "protocol", "sandbox_state": "dead"}
    with pytest.raises(ValueError):
        V.done_event("fine")
    with pytest.raises(ValueError):
        V.done_event(V.OK, reason="bored")


def test_no_second_list_of_states_reasons_or_event_types():
    """Sets or tuples of state names, and reason tables, spelled by hand outside the vocabulary."""
    states = "dead|expired|deleted|lost|running|pooled|booting"
    events = "stream|display_data|update_display_data|execute_result|clear_output|error|done"
    state_list = re.compile(rf"""[{{(\[]\s*["']({states})["']\s*,\s*["']({states})["']""")
    event_list = re.compile(rf"""[{{(\[]\s*["']({events})["']\s*,\s*["']({events})["']""")
    offenders = []
    for folder in ("sandbox", "kernel"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "vocabulary.py":
                continue
            text = path.read_text()
            for pattern in (state_list, event_list):
                offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)]
            if re.search(r"^\s*(REASONS|ENDED_STATES|GONE_STATES|EXEC_EVENT_TYPES)\s*[:=]", text, re.M):
                offenders.append(f"{path.relative_to(ROOT)}: defines its own table")
    assert not offenders, offenders
