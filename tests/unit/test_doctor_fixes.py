"""`doctor` says, for each protection that is weaker or missing here, the step that fixes it
or that none is available and what the risk is (sandbox/isolation/doctor.py FIXES)."""

from __future__ import annotations

from sandbox.isolation import doctor


def test_every_weaker_or_missing_item_says_what_to_do():
    items = doctor.report()
    for item in items:
        if item["status"] != doctor.IN_FORCE:
            assert item.get("fix"), item
    text = doctor.format_report(items)
    assert text.count("what to do:") == sum(1 for i in items if i["status"] != doctor.IN_FORCE)


def test_each_item_that_can_weaken_has_a_fix():
    # The items report() names that may be weaker or missing (the test-only ones say it themselves).
    may_weaken = {"bubblewrap", "namespaces", "network", "seccomp", "memory limit", "pids limit", "cpu limit",
                  "cgroup version", "host uid", "gvisor tier (runsc)", "workspace size"}
    assert may_weaken <= set(doctor.FIXES)
    assert all("none" in fix or any(w in fix for w in ("install", "run the server", "allow")) for fix in doctor.FIXES.values())
