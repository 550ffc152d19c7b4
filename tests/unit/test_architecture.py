"""No import circle in sandbox/ and kernel/: each module can be read, tested and replaced
with only what it imports, and the call graph points one way (the supervisor's sessions
depend on its core, the gateway's relay on its exchange on its pool, never back)."""

from __future__ import annotations

from architecture import circles, import_graph


def test_no_import_circle_in_sandbox_and_kernel():
    found = circles(import_graph())
    assert not found, "import circles (break each with a small Protocol or by passing what is needed):\n" + \
        "\n".join(" -> ".join(circle) for circle in found)


def test_the_graph_sees_relative_lazy_and_type_only_imports(tmp_path):
    """The check itself: a circle closed by a function-level relative import, and another
    closed under TYPE_CHECKING, are both found and named; a one-way chain is not."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .b import B\n")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def later():\n    from .. import a\n")
    (package / "c.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from pkg.d import D\n")
    (package / "d.py").write_text("from . import c\n")
    (package / "e.py").write_text("from .a import x\n")  # into the circle, not part of it
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.sub"] == {"pkg.sub.b"} and graph["pkg.e"] == {"pkg.a"}
    assert sorted(circles(graph)) == [["pkg.a", "pkg.sub.b", "pkg.a"], ["pkg.c", "pkg.d", "pkg.c"]]
