"""The public kernel conformance suite (jupyter_kernel_test) against the real kernel and
a real sandbox server."""

from __future__ import annotations

import os
import shutil
import tempfile

import jupyter_kernel_test as jkt
import pytest

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg=="


@pytest.mark.usefixtures("kernel_env")
class TestSandboxKernel(jkt.KernelTests):
    kernel_name = "sandbox"
    language_name = "python"
    file_extension = ".py"

    @classmethod
    def setUpClass(cls) -> None:
        """The suite starts its kernel in this process's working directory, the checkout,
        which the tests put on PYTHONPATH: a kernel refuses a folder on its sys.path
        (kernel/safe_path.py), so it starts in an empty folder of its own."""
        here = os.getcwd()
        cls.folder = tempfile.mkdtemp(prefix="sbk-conformance-")
        os.chdir(cls.folder)
        try:
            super().setUpClass()
        finally:
            os.chdir(here)

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        shutil.rmtree(cls.folder, ignore_errors=True)

    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"

    # Completion runs in the sandbox's IPython.
    completion_samples = [
        {"text": "zi", "matches": {"zip"}},
        {"text": "import os\nos.pa"},
    ]

    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]

    code_generate_error = "raise Exception('test')"

    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
        # HTML from the sandbox reaches the page only in an isolated frame (kernel/output_policy.py,
        # tests/kernel/test_output_policy.py); its text/plain companion is IPython's, unchanged.
        {
            "code": "from IPython.display import HTML; HTML('<b>x</b>')",
            "mime": "text/plain",
            "result": "<IPython.core.display.HTML object>",
        },
    ]

    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {
            "code": f"import base64\nfrom IPython.display import Image, display\ndisplay(Image(data=base64.b64decode('{PNG}')))",
            "mime": "image/png",
        },
        # The page shows the formula as MathML in a frame; the LaTeX source stays in the
        # bundle for exports (nbconvert --to latex), as ipykernel sends it.
        {"code": "from IPython.display import Math, display; display(Math(r'\\frac{1}{2}'))", "mime": "text/latex"},
    ]

    code_clear_output = "from IPython.display import clear_output; clear_output()"

    code_inspect_sample = "print"

    # Help from `?` is a `page` payload of the execute reply, as in ipykernel.
    code_page_something = "len?"

    # History is the kernel's own record of its cells.
    supported_history_operations = ("tail", "range", "search")
    code_history_pattern = "1?2*"
