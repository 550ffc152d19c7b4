"""No import circle in sandbox/ and kernel/: each module can be read, tested and replaced
with only what it imports, and the call graph points one way (the supervisor's sessions
depend on its core, the gateway's relay on its exchange on its pool, never back)."""

from __future__ import annotations

from architecture import circles, import_graph, layer_breaches

HOST = ("sandbox.common", "sandbox.core", "sandbox.service", "sandbox.images", "sandbox.isolation",
        "sandbox.supervisor", "sandbox.usage", "sandbox.egress", "sandbox.gateway", "sandbox.client",
        "sandbox.cli", "sandbox.agents", "kernel")
ABOVE_THE_CORE = ("sandbox.service", "sandbox.gateway", "sandbox.cli", "sandbox.agents", "sandbox.client", "kernel")
# What each layer may not import (docs/architecture.md; each package's docstring says the same).
FORBIDDEN = {
    # copied into every sandbox and run there: nothing of the host side
    "sandbox.runtime": HOST,
    # shared by every layer, so it leans on none
    "sandbox.common": tuple(p for p in HOST if p != "sandbox.common") + ("sandbox.runtime",),
    # the HTTP edge calls down into the core; nothing below it calls up
    "sandbox.core": ABOVE_THE_CORE,
    "sandbox.supervisor": ABOVE_THE_CORE,
    "sandbox.usage": ABOVE_THE_CORE,
    "sandbox.egress": ABOVE_THE_CORE,
    # how a sandbox is walled in and what it mounts know nothing of sandboxes' lifecycle
    "sandbox.isolation": ABOVE_THE_CORE + ("sandbox.core", "sandbox.supervisor", "sandbox.usage", "sandbox.egress"),
    "sandbox.images": ABOVE_THE_CORE + ("sandbox.core", "sandbox.supervisor", "sandbox.usage", "sandbox.egress"),
}


def test_no_import_circle_in_sandbox_and_kernel():
    found = circles(import_graph())
    assert not found, "import circles (break each with a small Protocol or by passing what is needed):\n" + \
        "\n".join(" -> ".join(circle) for circle in found)


def test_each_layer_imports_only_the_layers_below_it():
    breaches = layer_breaches(import_graph(), FORBIDDEN)
    assert not breaches, "imports against the layering (move the code, or pass what is needed down):\n" + \
        "\n".join(breaches)


def test_a_layer_breach_is_named():
    """The check itself: an upward import is named, a downward one and a look-alike name are not."""
    graph = {"pkg.core.a": {"pkg.service.api", "pkg.common.x"}, "pkg.core_extra": {"pkg.service"},
             "pkg.service.api": {"pkg.core.a"}}
    assert layer_breaches(graph, {"pkg.core": ("pkg.service",)}) == ["pkg.core.a -> pkg.service.api"]


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
