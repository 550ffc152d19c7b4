"""Why a sandbox's process ended, in words its user can act on."""

from __future__ import annotations

import signal

from ..runtime import vocabulary as V
from ..isolation.host import HostResources


def describe_mb(mb) -> str:
    return f"{int(mb)} MiB" if mb else "none"


def death_cause(code: int | None, host: HostResources, limits: dict, isolation: dict) -> tuple[str, str]:
    """(reason, message) for a runtime that exited with ``code`` on its own: the cgroup's
    counters tell an out-of-memory kill or a process limit from a crash."""
    cgroup = host.cgroup
    if cgroup is not None and cgroup.oom_kills() > host.oom_baseline:
        return V.OOM, (f"the sandbox ran out of memory and was killed by the out-of-memory killer "
                       f"(memory limit {describe_mb(limits.get('memory_mb'))})")
    signum = None
    if code is not None and code < 0:
        signum = -code
    elif code is not None and code > 128:
        signum = code - 128
    if cgroup is not None and cgroup.pids_limit_hits() > host.pids_baseline:
        if isolation.get("pids_host_ceiling"):
            return V.PIDS, (f"gVisor's own host tasks (its Sentry's threads, the gofer, a ptrace stub per address "
                            f"space and thread) reached the sandbox's host ceiling of {isolation['pids_host_ceiling']} "
                            f"and its runtime died (exit code {code}); the code's own process limit is "
                            f"{limits.get('pids')} processes")
        return V.PIDS, (f"the sandbox hit its process limit ({limits.get('pids')} processes) and its "
                        f"runtime died (exit code {code})")
    if signum == signal.SIGKILL and isolation.get("memory") == "rlimit":
        return V.OOM, f"the sandbox was killed, probably out of memory (limit {describe_mb(limits.get('memory_mb'))})"
    if signum is not None:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        what = {"SIGSEGV": "a segmentation fault", "SIGBUS": "a bus error", "SIGABRT": "an abort",
                "SIGILL": "an illegal instruction", "SIGSYS": "a forbidden system call (seccomp)",
                "SIGFPE": "a floating point exception"}.get(name, name)
        return V.CRASHED, f"the sandbox's Python process crashed with {what} ({name}), for example in a C extension"
    return V.CRASHED, f"the sandbox's Python process exited unexpectedly (exit code {code})"
