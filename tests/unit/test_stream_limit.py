"""The caller's stream limit in the runtime's output budget: text past it is cut at a
character boundary and counted, never sent; the note says how much and how to keep it."""

from __future__ import annotations

from sandbox.runtime import vocabulary as V
from sandbox.runtime.capture import OutputBudget
from sandbox.runtime.framecheck import check
from sandbox.runtime.runtime import truncation_note


def test_no_limit_passes_everything():
    budget = OutputBudget(1 << 20)
    assert budget.take_stream("x" * 5000) == "x" * 5000 and not budget.truncated


def test_text_past_the_limit_is_cut_and_counted():
    budget = OutputBudget(1 << 20)
    budget.reset(stream_limit=10)
    assert budget.take_stream("abcdef") == "abcdef"
    assert budget.take_stream("ghijklmnop") == "ghij"
    assert budget.take_stream("more") is None
    assert budget.stream_dropped == 6 + 4 and budget.truncated


def test_a_cut_never_splits_a_character():
    budget = OutputBudget(1 << 20)
    budget.reset(stream_limit=5)
    kept = budget.take_stream("ab€€")  # 2 + 3 + 3 bytes: the second € does not fit
    assert kept == "ab€" and budget.stream_dropped == 3


def test_reset_forgets_the_previous_cells_limit():
    budget = OutputBudget(1 << 20)
    budget.reset(stream_limit=1)
    budget.take_stream("abc")
    budget.reset()
    assert budget.take_stream("abc") == "abc" and not budget.truncated


def test_the_note_says_how_much_and_how_to_keep_it():
    budget = OutputBudget(10 * 1024 * 1024)
    budget.reset(stream_limit=1024 * 1024)
    budget.take_stream("x" * (3 * 1024 * 1024))
    note = truncation_note(budget)
    assert "2.0 MiB of text past the first 1.0 MiB were dropped" in note
    assert "/workspace" in note and "%pull out.txt" in note


def test_the_output_caps_note_keeps_its_byte_figures():
    budget = OutputBudget(1000)
    budget.dropped = 5000
    assert "5000 bytes over the 1000 byte limit per execution were dropped" in truncation_note(budget)


def test_a_note_event_is_valid_protocol():
    event = V.stream_event(V.STDERR, "[sandbox: output truncated]\n", "e1", note=True)
    assert event["note"] is True
    check(event)  # raises on a field the protocol does not know
    assert "note" not in V.stream_event(V.STDOUT, "x")
