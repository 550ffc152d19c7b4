"""No class over 300 lines and no function over 80 in sandbox/ and kernel/: past that, a
reader can no longer hold one in mind, and it has taken on a second job. Split by job
(see manager.py and its parts, or the supervisor's sessions) rather than raise a limit."""

from __future__ import annotations

from architecture import oversized

MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80


def test_no_class_over_300_lines_and_no_function_over_80():
    found = oversized(MAX_CLASS_LINES, MAX_FUNCTION_LINES)
    assert not found, "too long (split by job):\n" + "\n".join(found)


def test_the_count_covers_methods_and_nested_functions(tmp_path):
    """The check itself: a method and a function inside a function are counted too."""
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(5))
    (package / "__init__.py").write_text(
        "class Big:\n    def method(self):\n" + body + "\n"
        "def outer():\n    def inner():\n" + body + "    return inner\n")
    found = oversized(6, 5, tmp_path, ("pkg",))
    assert sorted(line.split(" ", 1)[1] for line in found) == [
        "class Big (7 lines)", "function inner (6 lines)", "function method (6 lines)", "function outer (8 lines)"]
    assert oversized(7, 8, tmp_path, ("pkg",)) == [], "at the limit is not over it"
