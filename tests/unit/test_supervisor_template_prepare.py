"""What the supervisor template does once, before it forks, so that no forked supervisor
does it itself (sandbox/supervisor/template.py, `prepare_children`): each thing a child
builds or imports after the fork is private memory of that supervisor for its whole life.
Checked in a fresh interpreter that prepares as the template does; the control is one that
does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.harness import with_repo_on_path

STATE = """
import json, sys
from sandbox.isolation import seccomp
from sandbox.supervisor import __main__ as entry
print(json.dumps({"parser": entry.command_line.cache_info().currsize,
                  "filters": seccomp.build_filter.cache_info().currsize,
                  "pool": "concurrent.futures.thread" in sys.modules}))
"""


def state_after(setup: str, tmp_path) -> dict:
    out = subprocess.run([sys.executable, "-P", "-c", setup + STATE], cwd=tmp_path,
                         env=with_repo_on_path(dict(os.environ)), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_template_makes_the_parser_the_filters_and_the_pool_before_it_forks(tmp_path):
    from sandbox.isolation import seccomp

    filters = 2 if seccomp.available()[0] else 0  # where libseccomp is missing, each supervisor says so
    prepared = state_after("from sandbox.supervisor import template\ntemplate.prepare_children()\n", tmp_path)
    assert prepared == {"parser": 1, "filters": filters, "pool": True}
    # control: the supervisor's code imported as the template does, without preparing
    assert state_after("from sandbox.supervisor import __main__\n", tmp_path) == {"parser": 0, "filters": 0,
                                                                                 "pool": False}


def test_a_supervisor_reads_its_directory_from_the_environment_when_it_parses():
    """The parser is made in the template, before any sandbox's directory is in the
    environment: the default is read when a supervisor parses its own arguments."""
    from sandbox.supervisor import __main__ as entry

    parsed = entry.command_line().parse_args(["--ready-fd", "3", "--restore"])
    assert parsed.sandbox_dir is None and parsed.ready_fd == 3 and parsed.restore is True
