"""`text/latex` outputs (IPython's `Math`/`Latex`, sympy's pretty printing) as MathML.

JupyterLab would typeset LaTeX with MathJax in the page itself, and MathJax's `\\href`,
`\\style`, `\\class` and friends make links and styles there: sandbox LaTeX must not get the
page. So the kernel converts it to MathML (latex2mathml, pure Python) and the result is
shown like HTML, in an isolated frame (`frames`), which Chromium, Firefox and Safari draw
natively. Text around `$…$`, `$$…$$`, `\\(…\\)` and `\\[…\\]` stays text; LaTeX the converter
cannot read is shown as its source, in a `<code>`.
"""

from __future__ import annotations

import html
import re

# Past this size a formula is shown as its source (the converter is not made for books).
MAX_LATEX = 64 * 1024

_DELIMITED = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\$(.+?)\$|\\\((.+?)\\\)", re.DOTALL)


def formula(tex: str, display: bool) -> str:
    """One formula as MathML, or its source in `<code>` if it cannot be converted."""
    from latex2mathml.converter import convert

    if len(tex) <= MAX_LATEX:
        try:
            return convert(tex.strip(), display="block" if display else "inline")
        except Exception:  # the converter's errors are many and undocumented: the source is shown
            pass
    return f"<code>{html.escape(tex)}</code>"


def latex_to_html(source: str) -> str:
    """HTML for a `text/latex` value: its formulas as MathML, the rest as text."""
    parts: list[str] = []
    last = 0
    for match in _DELIMITED.finditer(source):
        parts.append(html.escape(source[last:match.start()]))
        tex = next(group for group in match.groups() if group is not None)
        parts.append(formula(tex, display=match.group(3) is None and match.group(4) is None))
        last = match.end()
    if not parts:  # no delimiters: the whole value is one formula (IPython's Latex("\\begin{…}"))
        return formula(source, display=True)
    parts.append(html.escape(source[last:]))
    return "".join(parts)
