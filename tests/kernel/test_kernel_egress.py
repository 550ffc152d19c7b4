"""The kernel asks for an egress policy (SANDBOX_KERNEL_EGRESS) and %sandbox shows it in force."""

from __future__ import annotations

import json
import re

import pytest
from support import run_cell

pytestmark = pytest.mark.slow


def test_sandbox_magic_shows_the_egress_policy(start_kernel):
    _, kc = start_kernel(SANDBOX_KERNEL_EGRESS=json.dumps({"allow": ["api.example.org", "*.example.net:8443"],
                                                           "max_requests": 50}))
    shown = run_cell(kc, "%sandbox")
    assert shown.status == "ok", shown.errors
    assert re.search(r"^egress +only api\.example\.org, \*\.example\.net:8443, through http://127\.0\.0\.1:3128",
                     shown.stdout, re.M), shown.stdout
    assert "used 0 of 50 requests" in shown.stdout
    proxy = run_cell(kc, "import os; print(os.environ.get('HTTPS_PROXY'))")
    assert proxy.stdout.strip() == "http://127.0.0.1:3128"


def test_without_a_policy_sandbox_magic_says_no_network(start_kernel):
    _, kc = start_kernel()
    shown = run_cell(kc, "%sandbox")
    assert re.search(r"^egress +none: no network at all$", shown.stdout, re.M), shown.stdout
