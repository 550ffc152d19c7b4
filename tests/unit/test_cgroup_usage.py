"""The cgroup counters behind a sandbox's usage: v1 for real on a host that has it, v2's
files parsed as the kernel writes them (cgroup-v2.rst; samples from a 6.x kernel)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from sandbox.isolation import cgroups

V2_FILES = {
    "cpu.stat": "usage_usec 2503412\nuser_usec 2101000\nsystem_usec 402412\nnr_periods 0\nnr_throttled 0\n"
                "throttled_usec 0\nnr_bursts 0\nburst_usec 0\n",
    "memory.current": "314572800\n",
    "memory.peak": "419430400\n",
    "memory.stat": "anon 262144000\nfile 52428800\nkernel 1048576\nactive_anon 262144000\ninactive_anon 0\n"
                   "active_file 10485760\ninactive_file 41943040\nunevictable 0\n",
    "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
    "pids.current": "7\n",
    "pids.events": "max 2\n",
    "pids.max": "max\n",
}


def test_v2_counters_from_the_kernels_file_formats(tmp_path):
    support = cgroups.CgroupSupport("v2", {c: str(tmp_path) for c in ("memory", "pids", "cpu")}, "test")
    group = cgroups.SandboxCgroup(support, "sbx")
    leaf = tmp_path / cgroups.GROUP_PREFIX / "sbx"
    leaf.mkdir(parents=True)
    for name, text in V2_FILES.items():
        (leaf / name).write_text(text)
    assert group.cpu_seconds() == pytest.approx(2.503412)
    assert group.memory_usage() == 314572800
    assert group.memory_working_set() == 314572800 - 41943040
    assert group.memory_peak() == 419430400
    assert group.processes() == 7
    assert group.oom_kills() == 1 and group.pids_limit_hits() == 2
    assert cgroups.parse_number(V2_FILES["pids.max"]) == 0  # "max" is no count


def test_v2_without_the_cpu_controller_still_counts_cpu(tmp_path):
    """cpu.stat's usage_usec is in every v2 group, delegated cpu controller or not."""
    support = cgroups.CgroupSupport("v2", {"memory": str(tmp_path)}, "test")
    group = cgroups.SandboxCgroup(support, "sbx")
    leaf = tmp_path / cgroups.GROUP_PREFIX / "sbx"
    leaf.mkdir(parents=True)
    (leaf / "cpu.stat").write_text(V2_FILES["cpu.stat"])
    assert group.cpu_seconds() == pytest.approx(2.503412)


def test_a_removed_group_reads_as_zero(tmp_path):
    support = cgroups.CgroupSupport("v2", {"memory": str(tmp_path)}, "test")
    group = cgroups.SandboxCgroup(support, "gone")
    assert (group.cpu_seconds(), group.memory_working_set(), group.memory_peak(), group.processes()) == (0, 0, 0, 0)


BURN = "import time\ns = time.process_time()\nwhile time.process_time() - s < 0.5: pass\nx = bytearray(64 << 20)\n" \
       "for i in range(0, len(x), 4096): x[i] = 1\nprint(time.process_time())\n"


def test_v1_counters_for_real():
    support = cgroups.detect()
    if support.version != "v1" or "cpuacct" not in support.parents:
        pytest.skip(f"needs a writable cgroup v1 hierarchy with cpuacct here ({support.reason})")
    group = cgroups.SandboxCgroup(support, f"test-{uuid.uuid4().hex[:8]}")
    group.create(512, 64, None)
    try:
        proc = subprocess.run([sys.executable, "-c", BURN], preexec_fn=group.join, capture_output=True, text=True,
                              check=True)
        child_cpu = float(proc.stdout)
        assert child_cpu * 0.9 <= group.cpu_seconds() <= child_cpu * 1.1 + 0.05, (child_cpu, group.cpu_seconds())
        assert group.memory_peak() >= 64 << 20
        assert group.processes() == 0  # it exited
    finally:
        group.kill_all()
        group.remove()
    assert not any(os.path.exists(d) for d in group.dirs.values())
