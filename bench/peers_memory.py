"""What one idle kernel costs in memory, as PSS, for any of the peers benchmark's arms.

PSS (`/proc/PID/smaps_rollup`) splits a page shared by N processes into N parts, so the
figures of many kernels add up to what they take together, and a kernel that maps the
same files as its neighbours is not charged for them in full. Our kernel is several
processes; each is named, so that the table says where the MiB are:

- the kernel process on the host (what Jupyter starts: the kernel protocol);
- the sandbox: its supervisor on the host and every process under it or of the sandbox's
  host uid (bwrap and the runtime; runsc's Sentry and gofer on the gVisor tier);
- its share of the server, of the supervisor template the server forks supervisors from
  (its pages are the supervisors' shared ones: counted once, here) and of the warm pool
  (their PSS divided by the kernels alive);
- its share of the fork server its kernel process was forked from (kernel/forkserver.py:
  the pages the kernel processes share with it are split between them by PSS already, and
  what the fork server itself is charged for is shared out over the kernels the same way).

A peer (plain ipykernel, the jail, the container) is the process Jupyter started and all
its descendants.
"""

from __future__ import annotations

import json
import os
import pathlib
import typing as t

from sandbox.common.paths import SUPERVISOR_TEMPLATE_MODULE, is_supervisor_of

from .harness import MiB, pids_of_uid, smaps_rollup


def children(pid: int) -> list[int]:
    """The direct children of `pid` (every thread's list, as /proc keeps them per task)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(p) for p in f.read().split())
    except OSError:
        pass
    return found


def tree(pid: int | None) -> list[int]:
    """`pid` and all its descendants."""
    if not pid:
        return []
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo.extend(children(p))
    return out


def supervisor_template(server_pid: int) -> list[int]:
    """The server's supervisor template, if it runs (a child of the server)."""
    found = []
    for pid in children(server_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if SUPERVISOR_TEMPLATE_MODULE.encode() in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def pss_mib(pids: t.Iterable[int]) -> float:
    return sum(smaps_rollup(p).get("pss", 0) for p in set(pids)) / MiB


def sandbox_pids(state_dir: pathlib.Path, sandbox_dir: pathlib.Path) -> tuple[int | None, list[int]]:
    """A sandbox's supervisor, and the processes under it or of its host uid."""
    try:
        state = json.loads((sandbox_dir / "state.json").read_text())
    except (OSError, ValueError):
        return None, []
    supervisor = state.get("supervisor_pid")
    if not is_supervisor_of(supervisor, str(sandbox_dir)):  # ended (its pid may be another's now)
        return None, []
    uid = (state.get("isolation") or {}).get("host_uid")
    inside = [p for p in tree(supervisor) if p != supervisor]
    if uid is not None:
        inside += pids_of_uid(int(uid))
    return supervisor, sorted(set(inside) - {supervisor})


def ours(state_dir: pathlib.Path, server_pid: int, kernels: dict[int, str],
         fork_servers: t.Iterable[int] = ()) -> dict[str, t.Any]:
    """Per-kernel PSS of our kernels: `kernels` maps each kernel process to its sandbox id.

    The sandboxes of this state dir that no kernel holds are the warm pool; the server, the
    pool and the fork servers the kernel processes came from are shared out over the kernels."""
    per: dict[str, list[float]] = {"kernel process": [], "supervisor": [], "sandbox processes": []}
    claimed = set(kernels.values())
    for kernel_pid, sandbox_id in kernels.items():
        supervisor, inside = sandbox_pids(state_dir, state_dir / "sandboxes" / sandbox_id)
        per["kernel process"].append(pss_mib([kernel_pid]))
        per["supervisor"].append(pss_mib([supervisor] if supervisor else []))
        per["sandbox processes"].append(pss_mib(inside))
    pool = 0.0
    for d in sorted((state_dir / "sandboxes").glob("sbx-*")):
        if d.name not in claimed:
            supervisor, inside = sandbox_pids(state_dir, d)
            pool += pss_mib(([supervisor] if supervisor else []) + inside)
    n = max(1, len(kernels))
    mean = {k: sum(v) / len(v) if v else 0.0 for k, v in per.items()}
    mean["server share"] = pss_mib([server_pid]) / n
    mean["supervisor template share"] = pss_mib(supervisor_template(server_pid)) / n
    mean["warm pool share"] = pool / n
    fork_servers = sorted(set(fork_servers))
    if fork_servers:
        mean["fork server share"] = pss_mib(fork_servers) / n
    return {"kernels": len(kernels), "per_kernel_mib": mean, "total_mib": sum(mean.values())}


def peer(kernel_pids: list[int]) -> dict[str, t.Any]:
    """Per-kernel PSS of a peer: each kernel's process tree."""
    each = [pss_mib(tree(p)) for p in kernel_pids]
    mean = sum(each) / len(each) if each else 0.0
    return {"kernels": len(each), "per_kernel_mib": {"kernel (process tree)": mean}, "total_mib": mean}
