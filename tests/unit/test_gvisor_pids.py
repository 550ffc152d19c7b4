"""A gVisor sandbox's pids limit: the code is held to it by the Sentry (RLIMIT_NPROC in the
OCI spec), the host cgroup only to a ceiling above it for gVisor's own tasks, and both are
reported as such. The limit in force is tested for real by
tests/reliability/test_rel_faults.py::test_pids_limit_gives_clean_errors_or_a_pids_death[gvisor]
and tests/security/test_redteam.py::test_p06_fork_bomb_contained[gvisor]."""

from __future__ import annotations

import json

from sandbox.isolation import gvisor
from sandbox.isolation.host import HostResources
from sandbox.runtime import vocabulary as V
from sandbox.supervisor.death import death_cause

LIMITS = {"memory_mb": 256, "pids": 32, "cpus": 1.0, "disk_mb": 100, "open_files": 256, "tmp_mb": 64,
          "shm_mb": 64, "file_mb": 100, "output_bytes": 1 << 20, "timeout_seconds": 0}


def spec(backend: str, tmp_path) -> dict:
    return {"id": "sbx-test", "uid": 2000001, "limits": dict(LIMITS), "isolation_backend": backend,
            "use_cgroups": False, "workspace": str(tmp_path / "workspace"),
            "image_info": {"venv": "/opt/sandbox-images/default", "mounts": []}}


def test_the_bundle_gives_the_sentry_the_pids_limit_as_rlimit_nproc(tmp_path):
    (tmp_path / "workspace").mkdir()
    bundle = gvisor.write_bundle(str(tmp_path), spec(V.GVISOR, tmp_path), {"path": "/nonexistent-root"})
    rlimits = json.loads((tmp_path / "bundle" / "config.json").read_text())["process"]["rlimits"]
    assert {"type": "RLIMIT_NPROC", "hard": 32, "soft": 32} in rlimits, rlimits
    assert bundle == str(tmp_path / "bundle")


def test_the_host_cgroup_gets_a_ceiling_above_the_limit_under_gvisor_only(tmp_path):
    under_gvisor = HostResources(str(tmp_path), spec(V.GVISOR, tmp_path))
    under_bwrap = HostResources(str(tmp_path), spec(V.BWRAP, tmp_path))
    assert under_bwrap.cgroup_pids({"pids": 32}) == 32
    assert under_gvisor.cgroup_pids({"pids": 32}) == gvisor.host_pids_ceiling(32) == 1648
    assert under_gvisor.cgroup_pids({}) is None
    # above the code's limit and gVisor's 55 tasks at rest, growing with it, within the kernel's range
    ceilings = [gvisor.host_pids_ceiling(n) for n in (16, 32, 64, 256, 4096, 1 << 22)]
    assert ceilings[0] > 16 + 55 and ceilings == sorted(ceilings) and ceilings[-1] == gvisor.PIDS_MAX_LIMIT


def test_isolation_says_the_sentry_holds_the_code_and_whether_the_host_has_a_ceiling(tmp_path):
    isolation: dict = {}
    HostResources(str(tmp_path), spec(V.GVISOR, tmp_path)).acquire(isolation)  # no cgroup here
    assert isolation["pids"].startswith("gVisor's Sentry (RLIMIT_NPROC 32"), isolation
    assert "no host ceiling" in isolation["pids"] and isolation["pids_host_ceiling"] is None
    isolation = {}
    HostResources(str(tmp_path), spec(V.BWRAP, tmp_path)).acquire(isolation)
    assert "Sentry" not in isolation["pids"] and "pids_host_ceiling" not in isolation


class HitCeiling:
    """A cgroup whose pids limit refused a fork since launch (pids.events' max went up)."""

    def oom_kills(self) -> int:
        return 0

    def pids_limit_hits(self) -> int:
        return 1


def test_a_gvisor_sandbox_that_reaches_the_host_ceiling_is_told_so(tmp_path):
    host = HostResources(str(tmp_path), spec(V.GVISOR, tmp_path))
    host.cgroup = HitCeiling()
    reason, message = death_cause(-9, host, LIMITS, {"pids": "…", "pids_host_ceiling": 1648})
    assert reason == V.PIDS and "host ceiling of 1648" in message and "32 processes" in message, message
    reason, message = death_cause(-9, host, LIMITS, {"pids": "cgroup v1"})
    assert reason == V.PIDS and message.startswith("the sandbox hit its process limit (32 processes)"), message
