"""The only ways the sandbox kernel may differ from ipykernel where a frontend can tell.

One row per difference: where it shows (a scenario's request), what each kernel does,
why, and `holds`, which says whether a pair of observations shows exactly this
difference. `control` is an environment under which the sandbox kernel does what
ipykernel does for that request, when the difference comes from a switch: the row's test
runs it too, proving the difference is there for the reason given. docs/kernel.md's "Where it
differs from ipykernel" shows this table.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from .frontend import Observed, merge_streams

PASSTHROUGH = {"SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS": "1"}


def _kinds(observed: Observed, kind: str) -> list[tuple[t.Any, ...]]:
    return [shape for shape in observed.iopub if shape[0] == kind]


def _mimes(observed: Observed) -> tuple[str, ...]:
    shapes = _kinds(observed, "display_data")
    return shapes[0][1] if len(shapes) == 1 else ()


def _framed(active: str) -> t.Callable[[Observed, Observed], bool]:
    def holds(ipy: Observed, sbx: Observed) -> bool:
        return active in _mimes(ipy) and active not in _mimes(sbx) and "text/html" in _mimes(sbx)
    return holds


def _framed_beside(source: str) -> t.Callable[[Observed, Observed], bool]:
    """ipykernel's bundle with a framed `text/html` added, `source` kept for exports."""
    def holds(ipy: Observed, sbx: Observed) -> bool:
        return source in _mimes(ipy) and "text/html" not in _mimes(ipy) \
            and _mimes(sbx) == tuple(sorted(_mimes(ipy) + ("text/html",)))
    return holds


def _without_progress(observed: Observed) -> tuple[t.Any, ...]:
    """The shape with the startup progress and the clear_output that ends it taken out."""
    kept, dropping = [], False
    for shape in observed.iopub:
        if shape[1:] == ("startup progress",):
            dropping = True
            continue
        if dropping and shape == ("clear_output", False):
            dropping = False
            continue
        kept.append(shape)
    return (observed.reply, tuple(merge_streams(kept)), tuple(observed.input_prompts))


def _progress_only(ipy: Observed, sbx: Observed) -> bool:
    return any(s[1:] == ("startup progress",) for s in sbx.iopub) and _without_progress(sbx) == ipy.shape()


ANY = "*"  # a row that may show in any scenario's request


@dataclass(frozen=True)
class Difference:
    name: str
    scenario: str
    request: str  # the request's label in the scenario
    ipykernel: str
    sandbox: str
    reason: str
    holds: t.Callable[[Observed, Observed], bool] = field(repr=False)
    control: dict[str, str] | None = None  # the sandbox kernel's env under which it does not hold


DIFFERENCES = (
    Difference(
        "startup progress", ANY, ANY,
        "nothing", "a cell that waits over 3 s for its sandbox shows `creating the sandbox … N s`, "
        "updated, then cleared before its own output",
        "the first start of a server builds the image (minutes); a loaded host claims slowly. The progress "
        "is cleared, so the saved notebook has none (kernel/claim.py)",
        _progress_only),
    Difference(
        "host cells", "magics", "%%host",
        "`UsageError: Cell magic %%host not found`",
        "the cell runs in the kernel's own process, next to the notebook; it takes its count",
        "`%%host` is this kernel's way to reach the notebook's machine (kernel/host.py)",
        lambda ipy, sbx: ipy.reply_content.get("ename") == "UsageError" and sbx.reply_content.get("status") == "ok"
        and ("stream", "stdout", "on the host\n") in sbx.iopub),
    Difference(
        "host cells while the sandbox is claimed", "burst_right_after_start", "%%host",
        "as above", "as above: run at once, before the sandbox is there, with its count",
        "as above",
        lambda ipy, sbx: ipy.reply_content.get("ename") == "UsageError" and sbx.reply_content.get("status") == "ok"
        and ipy.reply_content.get("execution_count") == sbx.reply_content.get("execution_count")),
    Difference(
        "a failing cell always shows an error", "magics", "unknown magic",
        "a UsageError is text on stderr, with no `error` output",
        "one `error` output besides the stderr text",
        "every failing cell ends with exactly one `error` output (jupyter_kernel_test, nbval and papermill "
        "read it); the sandbox's IPython reports a UsageError only as text",
        lambda ipy, sbx: not _kinds(ipy, "error") and len(_kinds(sbx, "error")) == 1),
    Difference(
        "Markdown in a frame", "displays", "display(Markdown('*md*'))",
        "`text/markdown`", "`text/html`: the Markdown rendered in a sandboxed frame",
        "Markdown may carry HTML, which JupyterLab runs with the page's rights (kernel/output_policy.py)",
        _framed("text/markdown"), PASSTHROUGH),
    Difference(
        "LaTeX in a frame", "displays", "display(Math(r'x^2'))",
        "`text/latex`", "`text/html`: MathML in a sandboxed frame, with `text/latex` kept beside it",
        "MathJax in the page acts on what the sandbox wrote (kernel/mathml.py); JupyterLab shows `text/html` "
        "first whenever a bundle has it, so the page never typesets the source, which stays for nbconvert's "
        "LaTeX and PDF exports (kernel/output_policy.py)",
        _framed_beside("text/latex"), PASSTHROUGH),
    Difference(
        "JavaScript in a frame", "displays", "display(Javascript('1'))",
        "`application/javascript`", "`text/html`: the script in a sandboxed frame",
        "the page would run it with the Jupyter server's token",
        _framed("application/javascript"), PASSTHROUGH),
    Difference(
        "JSON not passed", "displays",
        "display({'text/plain': 'p', 'application/json': {'a': 1}}, raw=True, metadata={'application/json': {'expanded': True}})",
        "`application/json` and its metadata", "`text/plain` only",
        "the output table withholds it (kernel/output_policy.py: only passive types and framed active ones reach the page)",
        lambda ipy, sbx: "application/json" in _mimes(ipy) and _mimes(sbx) == ("text/plain",), PASSTHROUGH),
    Difference(
        "silent requests publish nothing", "silent_and_unstored_cells", "silent error",
        "the error of a silent request is published on IOPub", "nothing on IOPub; the reply says the error",
        "the messaging spec: a silent request broadcasts no output (tools send them in the background)",
        lambda ipy, sbx: bool(_kinds(ipy, "error")) and not _kinds(sbx, "error")
        and ipy.reply_content.get("ename") == sbx.reply_content.get("ename")),
    Difference(
        "history starts at the first cell", "history",
        "history {'hist_access_type': 'range', 'session': 0, 'output': False, 'raw': True}",
        "the range starts with an empty line 0", "the range starts at the first cell",
        "IPython's history holds an empty line 0; this kernel keeps its own record of the notebook's cells "
        "(a replaced sandbox's IPython would have none)",
        lambda ipy, sbx: ipy.reply is not None and sbx.reply is not None and ipy.reply[2][0] == ("",)
        and ipy.reply[2][1:] == sbx.reply[2]),
)


def allowed(scenario: str, label: str, ipy: Observed, sbx: Observed) -> Difference | None:
    """The row that allows this request's difference, if any."""
    for row in DIFFERENCES:
        if row.scenario in (scenario, ANY) and row.request in (label, ANY) and row.holds(ipy, sbx):
            return row
    return None
