"""The host-side processes that every kernel and every sandbox add (the kernel process, the
supervisor) do not load what they never use: each such module is private memory in every
one of them, for as long as it lives. Checked where it lands: in a fresh interpreter
started the way Jupyter and the server start them, the modules are not in `sys.modules`;
the controls import the same code without the entry point and find them there."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from bench.harness import with_repo_on_path

LOADED = "import sys, json; print(json.dumps({{m: m in sys.modules and sys.modules[m] is not None for m in {names!r}}}))"


def loaded_after(setup: str, names: list[str], tmp_path) -> dict[str, bool]:
    """Which of `names` a fresh `python -P` holds after running `setup` (outside the
    checkout, as a kernel starts in a notebook's folder)."""
    code = f"{setup}\n{LOADED.format(names=names)}"
    out = subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, env=with_repo_on_path(dict(os.environ)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(importlib.util.find_spec("click") is None, reason="click is not installed here: httpx would not "
                    "import its command line anyway, so there is nothing to leave out")
def test_the_kernel_process_loads_no_http_command_line_and_no_sanitizer(tmp_path):
    names = ["click", "rich", "nh3"]
    assert loaded_after("import kernel.__main__", names, tmp_path) == dict.fromkeys(names, False)
    # control: the same kernel code imported without its entry point loads httpx's CLI
    assert loaded_after("import kernel.app", ["click", "rich"], tmp_path) == {"click": True, "rich": True}


def test_html_is_still_sanitized_once_the_sanitizer_is_loaded_lazily(tmp_path):
    """Leaving nh3 out at start-up changes nothing a notebook sees: the static copy keeps
    text and tables and drops scripts, handlers and links."""
    from kernel import frames

    cleaned = frames.sanitized_html('<table><tr><td onclick="x()">a</td></tr></table><script>1</script><a href="/x">b</a>')
    assert cleaned == "<table><tbody><tr><td>a</td></tr></tbody></table>b"
    assert "table" in frames.STATIC_TAGS and "a" not in frames.STATIC_TAGS


def test_the_supervisor_loads_no_tls(tmp_path):
    assert loaded_after("import sandbox.supervisor.__main__", ["ssl"], tmp_path) == {"ssl": False}
    # control: the supervisor's code without its entry point imports ssl (through asyncio)
    assert loaded_after("import sandbox.supervisor.lifecycle", ["ssl"], tmp_path) == {"ssl": True}


def test_the_sandbox_runtime_loads_no_asyncio_nor_tls(tmp_path):
    """The runtime in every sandbox (warm ones too) speaks over a blocking channel: asyncio
    and the ssl it imports (about 2 MiB of each sandbox) come only with a cell that uses
    them. Checked on the copy a sandbox runs (launcher.install_runtime), with its shell."""
    from sandbox.core.launcher import install_runtime

    copy = install_runtime(str(tmp_path / "runtimes"))
    code = (f"import sys; sys.path.insert(0, {copy!r})\n"
            "import sandbox_runtime.runtime, sandbox_runtime.shell")
    names = ["asyncio", "ssl"]
    assert loaded_after(code, names, tmp_path) == dict.fromkeys(names, False)
    # control: the host's side still reads frames (asyncio imported where it first does),
    # and a channel that closes mid-frame is still an EOFError, not a NameError
    import asyncio

    from sandbox.runtime import protocol

    async def read(data: bytes) -> dict:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await protocol.read_frame(reader)

    assert asyncio.run(read(protocol.encode({"x": 1}))) == {"x": 1}
    with pytest.raises(EOFError):
        asyncio.run(read(protocol.encode({"x": 1})[:6]))


@pytest.mark.skipif(importlib.util.find_spec("click") is None, reason="click is not installed here: httpx would not "
                    "import its command line anyway, so there is nothing to leave out")
def test_the_cli_and_so_the_server_loads_no_http_command_line(tmp_path):
    """`python -m sandbox` and the `sandbox-kernel` script (both `sandbox.__main__:main`),
    whose `serve` is the server for as long as it runs."""
    names = ["rich", "pygments"]
    cli = ("import sys\nfrom sandbox.__main__ import main\nsys.argv = ['sandbox-kernel', '--help']\n"
           "try:\n    main()\nexcept SystemExit:\n    pass\nimport sandbox.service.server")
    assert loaded_after(cli, names, tmp_path) == dict.fromkeys(names, False)
    # control: the server's code imported without the entry point loads httpx's CLI
    assert loaded_after("import sandbox.service.server", names, tmp_path) == dict.fromkeys(names, True)


def test_the_server_loads_cryptography_and_tqdm_only_when_it_uses_them(tmp_path):
    """cryptography makes the egress CA (a server whose sandboxes never ask for egress makes
    none), tqdm draws an image build's bar on a terminal (the server never draws one): about
    4 and 2 MiB of the server otherwise. Controls: a bar drawn, a CA module imported."""
    names = ["cryptography", "tqdm"]
    assert loaded_after("import sandbox.service.server", names, tmp_path) == dict.fromkeys(names, False)
    used = ("import io, sandbox.service.server\nfrom sandbox.images.progress import BuildProgress\n"
            "with BuildProgress(io.StringIO(), bar=True) as p:\n    p('step 1/2: one')\n"
            "import sandbox.egress.ca")
    assert loaded_after(used, names, tmp_path) == dict.fromkeys(names, True)
