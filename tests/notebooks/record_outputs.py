"""Execute the example notebooks through the sandbox kernel and save them with their outputs.

nbval compares a fresh run against the outputs stored in the notebook, so after editing a
notebook its outputs must be recorded again, the same way the validation runs it: through
the `sandbox` kernel, with the notebook's directory as the working directory.

    .venv/bin/python tests/notebooks/record_outputs.py [NOTEBOOK ...]

The server is the test suite's (see tests/support.py): the one at
SANDBOX_KERNEL_TEST_URL / SANDBOX_KERNEL_TEST_TOKEN if set, else one started for the run.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time
import typing as t

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
NOTEBOOKS = REPO / "notebooks"
sys.path.insert(0, str(REPO / "tests"))

import support  # noqa: E402


def coalesce_streams(nb: t.Any) -> None:
    """Merge consecutive stream outputs of the same name, as JupyterLab shows them (and as
    nbval compares them): a print() in a %%host cell arrives as one message per write."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        merged: list[t.Any] = []
        for out in cell.outputs:
            last = merged[-1] if merged else None
            if out.output_type == "stream" and last is not None and last.output_type == "stream" and last.name == out.name:
                last.text += out.text
            else:
                merged.append(out)
        cell.outputs = merged


def record(path: pathlib.Path) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    began = time.monotonic()
    client = NotebookClient(
        nb,
        kernel_name="sandbox",
        timeout=600,
        startup_timeout=120,
        record_timing=False,  # timestamps in cell metadata would churn every diff
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    coalesce_streams(nb)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return time.monotonic() - began


def main(argv: list[str]) -> int:
    paths = [pathlib.Path(p).resolve() for p in argv] or sorted(NOTEBOOKS.glob("*.ipynb"))
    server = support.start_session_server()
    try:
        os.environ.update(support.kernel_environ(server, support.install_kernelspec()))
        for path in paths:
            seconds = record(path)
            print(f"{path}: recorded in {seconds:.1f} s", flush=True)
    finally:
        support.remove_kernelspec()
        if not server.external:
            server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
