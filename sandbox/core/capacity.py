"""What one sandbox may ask for, and what is left on this server: the checks behind create.

A limit is a promise the host must be able to keep: a sandbox granted more memory than the
host has, or a workspace larger than the free disk, has limits that limit nothing. So each
limit a create asks for is checked against three things, and refused with a 4xx body that
says what is allowed:

- **per sandbox** (422 ``limit_exceeded``): the operator's maximum (``max_*`` settings)
  and the host: no more memory than the host (or the server's own memory cgroup) has, no
  more CPUs than it may run on, no larger workspace than the free disk left once every
  live workspace has grown to its own cap (workspaces are sparse files that grow as they
  are written);
- **in total** (409 ``capacity_exceeded``): the sum over the live, claimed sandboxes stays
  within the operator's totals (``total_*``, ``max_sandboxes``; memory defaults to the
  host's). Memory counts as Kubernetes counts it: each sandbox reserves its *request*
  (``memory_request_mb``, or its limit if that is smaller), not its limit, because an idle
  sandbox uses a fraction of its limit and reserving limits refused the 24th 1 GB sandbox
  on a 24 GB host with 2 GB in use. Real memory is watched instead (``memory_pressure.py``);
- **per user** on a ``--multi-user`` server (409 ``capacity_exceeded``, naming the user and
  what is free of their share): one user's sandboxes hold at most ``user_share`` of each
  total, so that one user cannot take all and leave the others ``0 free``.

A paused sandbox holds its disk and its checkpoint (runsc's image of its memory, often
hundreds of MB), which counts against ``disk_mb`` like a workspace. Its restore is checked
like a create, for what it gave back while paused (memory, CPUs, processes): if others took
that meanwhile, the restore is refused with the same 409 and the sandbox stays paused.

Warm-pool sandboxes are idle stand-ins made with the default limits: they count once
claimed. `/v1/info` reports the same numbers, for a placement layer that picks the server
with room.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from ..common.errors import ApiError
from ..isolation import cgroups

MiB = 1024 * 1024
RESOURCES = ("memory_mb", "cpus", "pids", "disk_mb")


@dataclass(frozen=True)
class Host:
    memory_mb: int  # MemTotal, or the server's own memory cgroup limit when smaller
    cpus: int  # CPUs this server may run on
    disk_free_mb: int  # free space where workspaces live, before the live ones grow to their caps


def host_facts(workspace_root: str, committed_mb: int = 0) -> Host:
    """The host as it is now; ``committed_mb`` is what live workspaces may still grow by."""
    try:
        st = os.statvfs(workspace_root)
        free = st.f_bavail * st.f_frsize // MiB
    except OSError:
        free = 0
    return Host(memory_mb=_memory_mb(), cpus=len(os.sched_getaffinity(0)), disk_free_mb=max(0, free - committed_mb))


@functools.lru_cache(maxsize=1)
def _memory_mb() -> int:
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) // 1024
                    break
    except OSError:
        pass
    parent = cgroups.detect().parents.get("memory")
    for name in ("memory.limit_in_bytes", "memory.max"):  # v1, v2
        try:
            with open(os.path.join(parent, name)) as f:
                value = f.read().strip()
        except (OSError, TypeError):
            continue
        if value.isdigit() and 0 < int(value) // MiB < total:
            total = int(value) // MiB
    return total


def reserved(config, limits: dict) -> dict:
    """What a sandbox with these limits holds against the totals: its limits, its memory
    limit replaced by the memory request (``memory_request_mb``; 0: the whole limit)."""
    request = int(getattr(config, "memory_request_mb", 0) or 0)
    memory = int(limits.get("memory_mb") or 0)
    return {**limits, "memory_mb": min(memory, request) if request else memory}


def unwritten_mb(workspace_image: str, disk_mb: int) -> int:
    """How much more of the host's disk a live sparse workspace image may still take."""
    try:
        allocated = os.stat(workspace_image).st_blocks * 512
    except OSError:
        return 0  # no image: a plain directory, not capped, not promised
    return max(0, int(disk_mb) - allocated // MiB)


def _cap(configured: float, host: float) -> float:
    return min(configured, host) if configured else host


def per_sandbox(config, host: Host) -> dict:
    """The most one sandbox may ask for here (the operator's maxima within the host's size)."""
    return {
        "memory_mb": int(_cap(config.max_memory_mb, host.memory_mb)),
        "cpus": float(_cap(config.max_cpus, host.cpus)),
        "pids": int(config.max_pids),
        "disk_mb": int(_cap(config.max_disk_mb, host.disk_free_mb)),
        "ttl_seconds": int(config.max_ttl_seconds),
        "max_lifetime_seconds": int(config.max_lifetime_cap_seconds),
    }


def totals(config, host: Host) -> dict:
    """Caps on the sum over live claimed sandboxes (None: not capped)."""
    return {
        "memory_mb": int(config.total_memory_mb or host.memory_mb),
        "cpus": float(config.total_cpus) or None,
        "pids": int(config.total_pids) or None,
        "disk_mb": int(config.total_disk_mb) or None,
        "sandboxes": int(config.max_sandboxes) or None,
    }


def usage(limits_of_claimed: list[dict]) -> dict:
    used = {key: sum(float(lim.get(key) or 0) for lim in limits_of_claimed) for key in RESOURCES}
    used = {key: (round(v, 3) if key == "cpus" else int(v)) for key, v in used.items()}
    used["sandboxes"] = len(limits_of_claimed)
    return used


def report(config, host: Host, used: dict) -> dict:
    """`/v1/info`'s ``capacity``: per resource, the total (a cap, or the host's size where
    there is no cap: then ``enforced`` is false), what live sandboxes hold, what is free."""
    caps = totals(config, host)
    natural = {"memory_mb": host.memory_mb, "cpus": host.cpus, "pids": None, "disk_mb": None, "sandboxes": None}
    out = {}
    for key in (*RESOURCES, "sandboxes"):
        total = caps[key] if caps[key] is not None else natural[key]
        free = None if total is None else max(0, total - used[key])
        out[key] = {"total": total, "used": used[key], "free": round(free, 3) if isinstance(free, float) else free,
                    "enforced": caps[key] is not None}
    out["disk_mb"]["host_free"] = host.disk_free_mb
    return out


def check(config, host: Host, limits: dict, ttl: int, max_life: int, used: dict,
          user: int | None = None, user_used: dict | None = None) -> None:
    """Refuse a create whose limits this server cannot promise; see the module docstring.
    ``user``/``user_used``: the tenant asking and what its sandboxes hold (a shared server)."""
    maxima = per_sandbox(config, host)
    asked = {**{key: limits[key] for key in RESOURCES}, "ttl_seconds": ttl, "max_lifetime_seconds": max_life}
    why = {"memory_mb": "the host's memory" if maxima["memory_mb"] == host.memory_mb else "max_memory_mb",
           "cpus": "the host's CPU count" if maxima["cpus"] == host.cpus else "max_cpus",
           "pids": "max_pids", "ttl_seconds": "max_ttl_seconds",
           "disk_mb": "the free disk, after every live workspace reaches its cap"
           if maxima["disk_mb"] == host.disk_free_mb else "max_disk_mb",
           "max_lifetime_seconds": "max_lifetime_cap_seconds"}
    over = {key: {"requested": asked[key], "allowed": maxima[key], "set_by": why[key]}
            for key in asked if maxima[key] is not None and asked[key] > maxima[key]}
    if over:
        text = "; ".join(f"{k} {v['requested']} is more than one sandbox may have here (at most {v['allowed']}, "
                         f"{v['set_by']})" for k, v in over.items())
        raise ApiError(422, "limit_exceeded", text, extra={"exceeded": over, "allowed": maxima})

    want = {**{key: float(limits[key]) for key in RESOURCES}, "sandboxes": 1}
    want["memory_mb"] = float(reserved(config, limits)["memory_mb"])
    check_room(config, host, limits, want, used, user, user_used)


def check_room(config, host: Host, limits: dict, want: dict, used: dict, user: int | None = None,
               user_used: dict | None = None, what: str = "the sandbox") -> None:
    """Refuse (409) when ``want`` more does not fit in the totals, or in ``user``'s share of
    them on a shared server. A create wants all its limits and one place among the sandboxes;
    a paused sandbox's restore wants only what it gave back while paused (see ``held``)."""
    caps = totals(config, host)
    if user is not None and user_used is not None and getattr(config, "multi_user", False) and config.user_share < 1:
        check_share(config, caps, want, limits, user, user_used, used)
    short = {}
    for key, cap in caps.items():
        if cap is not None and used[key] + want[key] > cap + 1e-9:
            short[key] = {"requested": limits.get(key, 1), "free": _free(cap, used[key]), "total": cap}
            if key == "memory_mb":
                short[key]["reserved"] = _free(want[key], 0)
    if short:
        text = "; ".join(f"{k} {v['requested']}" + (f" (reserving its request of {v['reserved']})"
                                                     if v.get("reserved", v["requested"]) != v["requested"] else "") +
                         f" does not fit: {v['free']} free" +
                         (f" of {v['total']}" if v["total"] is not None else "") for k, v in short.items())
        free = report(config, host, used)
        raise ApiError(409, "capacity_exceeded", f"this server has no room for {what}: {text}",
                       extra={"exceeded": short, "free": {k: v["free"] for k, v in free.items()}})


def share_caps(config, caps: dict) -> dict:
    """One user's share of each total (None where the total is not capped)."""
    return {key: None if cap is None else (round(cap * config.user_share, 3) if key == "cpus"
                                           else int(cap * config.user_share))
            for key, cap in caps.items()}


def check_share(config, caps: dict, want: dict, limits: dict, user: int, user_used: dict, used: dict) -> None:
    """Refuse a tenant's create past its share, saying whose share it is and what is free of it."""
    shares = share_caps(config, caps)
    short = {key: {"requested": limits.get(key, 1), "free": _free(cap, user_used[key]), "share": cap,
                   "server_free": None if caps[key] is None else _free(caps[key], used[key])}
             for key, cap in shares.items() if cap is not None and user_used[key] + want[key] > cap + 1e-9}
    if not short:
        return
    text = "; ".join(f"{k} {v['requested']} does not fit: {v['free']} free of its {v['share']}" for k, v in short.items())
    raise ApiError(409, "capacity_exceeded", f"uid {user}'s share of this server is used (user_share "
                   f"{config.user_share:g} of each total): {text}; delete one of uid {user}'s sandboxes to make room",
                   extra={"exceeded": short, "user": user, "user_share": config.user_share,
                          "free": {k: None if cap is None else _free(cap, user_used[k]) for k, cap in shares.items()}})


def _free(cap: float, used: float) -> float:
    value = max(0.0, cap - used)
    return int(value) if float(value).is_integer() else round(value, 3)

