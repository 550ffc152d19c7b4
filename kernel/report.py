"""`%sandbox` and `%ttl`: what the user cannot see from inside the sandbox, said for
people: where their code runs, under which limits, and for how long."""

from __future__ import annotations

import typing as t

from sandbox.runtime import vocabulary as V

from . import saved_state, usage_note
from .failure import CellFailure
from .magic_host import HELP, MagicHost
from .outputs import format_bytes, format_duration

def _when(value: t.Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "?"


def state_line(info: t.Any) -> str:
    """The sandbox's state, and on the gVisor tier whether it sleeps: a sandbox put to sleep by
    idleness (paused_by "idle") is asleep and wakes on the next cell; a running one says when
    it will sleep if no cell comes (the server's gvisor_sleep_after_seconds)."""
    if info.state == V.PAUSED and info.paused_by == V.PAUSED_BY_IDLE:
        return f"asleep since {_when(info.paused_at)} (no cell for a while): on disk, wakes on the next cell"
    state = info.state + (f" ({info.dead_reason})" if info.dead_reason else "")
    if info.executing:
        return state + ", running a cell"
    if info.sleeps_at is not None:
        return state + f", sleeps at {_when(info.sleeps_at)} if no cell comes (its memory to disk)"
    return state


def ttl_line(info: t.Any) -> str:
    left = info.ttl_left()
    parts = [f"{format_duration(left)} left" if left is not None else "unknown"]
    if info.ttl_seconds:
        parts.append(f"renewed to {format_duration(info.ttl_seconds)} by each cell")
    parts.append(f"expires {_when(info.expires_at)}")
    if info.max_expires_at is not None:
        parts.append(f"hard cap {_when(info.max_expires_at)}")
    return ", ".join(parts)


def describe_isolation(iso: dict[str, t.Any]) -> list[str]:
    """The isolation the server reports, a few facts a line: what confines the code,
    what enforces each limit, what the code can reach."""
    lines = []
    backend = iso.get("backend")
    first = []
    if backend:
        version = iso.get(f"{backend}_version")
        first.append(f"{backend} {version}" if version else str(backend))
    if "seccomp" in iso:
        first.append("seccomp on" if iso["seccomp"] else "seccomp OFF")
    if iso.get("user_namespace"):
        first.append("own user namespace")
    if iso.get("host_uid") is not None:
        first.append(f"host uid {iso['host_uid']}")
    elif "host_uid" in iso:  # a server not run as root: weaker, and said so
        first.append("runs as your own uid (no uid of its own: the server is not root)")
    if first:
        lines.append(", ".join(first))
    enforced = [f"{k} by {iso[k]}" for k in ("memory", "pids", "cpu") if iso.get(k)]
    if enforced:
        lines.append("limits enforced: " + ", ".join(enforced))
    reach = [f"{k}: {iso[k]}" for k in ("network", "disk") if iso.get(k)]
    if reach:
        lines.append("; ".join(reach))
    shown = {"backend", f"{backend}_version", "seccomp", "user_namespace", "host_uid", "memory", "pids", "cpu"}
    shown |= {"network", "disk", "cgroup", "cgroup_detail", "pids_host_ceiling"}  # (in the pids line)
    lines.extend(f"{k}: {v}" for k, v in iso.items() if k not in shown)
    return lines


def describe_egress(egress: dict[str, t.Any] | None) -> list[str]:
    """The egress policy in force, as the server reports it: what the sandbox may reach,
    which secrets it holds as placeholders, and what it has used of its budgets."""
    if not egress:
        return ["none: no network at all"]
    policy, usage = egress.get("policy") or {}, egress.get("usage") or {}
    reach = list(policy.get("allow") or [])
    if policy.get("pip"):
        reach.append("the package index (" + ", ".join(policy.get("pip_hosts") or []) + ")")
    lines = [f"only {', '.join(reach) or 'nothing'}, through {egress.get('proxy', 'the proxy')} (HTTP(S)_PROXY)"]
    if egress.get("secrets"):
        names = ", ".join(f"${name}" for name in egress["secrets"])
        lines.append(f"secrets as placeholders: {names} (the value only reaches their bound hosts)")
    lines.append(f"used {usage.get('requests', 0)} of {policy.get('max_requests', '?')} requests, "
                 f"{format_bytes(int(usage.get('bytes', 0)))} of {format_bytes(int(policy.get('max_bytes', 0)))}; "
                 f"{usage.get('refused', 0)} refused")
    return lines


def describe(
    info: t.Any, server_url: str, pushed: t.Sequence[str], outputs: str = "", airlock: str = ""
) -> str:
    """The `%sandbox` report: one fact a line, for people."""
    lim = info.limits
    limits = []
    if lim.memory_mb is not None:
        limits.append(f"memory {lim.memory_mb} MB")
    if lim.cpus is not None:
        limits.append(f"{lim.cpus:g} CPU")
    if lim.pids is not None:
        limits.append(f"{lim.pids} processes")
    if lim.disk_mb is not None:
        limits.append(f"disk {lim.disk_mb} MB")
    if lim.output_bytes is not None:
        limits.append(f"output {format_bytes(lim.output_bytes)} per cell")
    if lim.file_bytes is not None:
        limits.append(f"files up to {format_bytes(lim.file_bytes)}")
    iso_lines = describe_isolation(info.isolation or {})
    rows = [
        ("sandbox", f"{info.id}"),
        ("state", state_line(info)),
        ("image", f"{info.image or '?'}" + (" (from the warm pool)" if info.from_pool else "")),
        ("created", _when(info.created_at)),
        ("TTL", ttl_line(info)),
        ("limits", ", ".join(limits) or "server defaults"),
        ("isolation", iso_lines[0] if iso_lines else "not reported"),
        *[("", line) for line in iso_lines[1:]],
        *[("egress" if i == 0 else "", line) for i, line in enumerate(describe_egress((info.raw or {}).get("egress")))],
        ("cells run", str(info.execution_count)),
        *usage_note.usage_rows(info.usage, lim.memory_mb, lim.disk_mb),
        ("pushed", ", ".join(pushed) if pushed else "nothing yet"),
        *([("airlock", airlock)] if airlock else []),
        *([("outputs", outputs)] if outputs else []),
        ("server", server_url),
    ]
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k:<{width}}  {v}\n" for k, v in rows)


def sandbox_table(infos: t.Sequence[t.Any], bindings: t.Sequence[t.Any], current: str | None,
                  own: t.Any) -> str:
    """`%sandbox list`: the user's sandboxes, a line each, with the notebook each belongs to."""
    owners = {b.sandbox_id: (b.notebook, held, path == own) for b, path, held in bindings}
    if not infos:
        return "no sandboxes on the server\n"
    lines = []
    for info in infos:
        notebook, held, ours = owners.get(info.id, (None, False, False))
        if info.id == current:
            whose = "this kernel's"
        elif notebook:
            whose = f"{notebook}" + (" (its kernel is running)" if held else "")
        else:
            whose = "no notebook's"
        age = format_duration((_now() - info.created_at).total_seconds()) if info.created_at else "?"
        state = "asleep" if info.state == V.PAUSED and info.paused_by == V.PAUSED_BY_IDLE else info.state
        lines.append(f"{info.id}  {state:<8} {age:>8} old  {whose}")
    return "".join(line + "\n" for line in lines) + "%sandbox attach ID takes one; %sandbox new starts fresh\n"


def _now() -> t.Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


async def run_sandbox(args: list[str], host: MagicHost) -> None:
    if args == ["packages"]:
        host.stdout(usage_note.packages_text(await (await host.sandbox()).image()))
        return
    if args == ["new"]:
        host.stdout(await host.new_sandbox())
        return
    if args == ["list"]:
        host.stdout(await host.list_sandboxes())
        return
    if args and args[0] in ("save", "restore", "forget"):
        host.stdout(await saved_state.run_saved_state(args, await host.sandbox(), host.config(), host.save_label()))
        return
    if len(args) == 2 and args[0] == "attach":
        host.stdout(await host.attach_sandbox(args[1]))
        return
    if args and args[0] == "timeout" and len(args) <= 2:
        host.stdout(timeout_text(args[1:], host))
        return
    if args:
        raise CellFailure("UsageError", HELP["sandbox"])
    sbx = await host.sandbox()
    info = await sbx.refresh()
    if host.airlock_root == host.cwd:
        where = "%push/%pull only inside the notebook's folder (the kernel's working directory)"
    else:
        where = f"%push/%pull only inside {host.airlock_root} (airlock_root)"
    host.stdout(describe(info, host.server_url, host.pushed, host.outputs_mode, where))


def timeout_text(args: list[str], host: MagicHost) -> str:
    """`%sandbox timeout [SECONDS]`: the cell time limit, raised or lowered for the cells that follow
    without a new kernel (the variables stay)."""
    seconds: float | None = None
    if args:
        try:
            seconds = float(args[0])
        except ValueError:
            raise CellFailure("UsageError", f"%sandbox timeout: {args[0]!r} is not a number of seconds") from None
        if not 0.1 <= seconds <= 14 * 86400:
            raise CellFailure("UsageError", "%sandbox timeout: between 0.1 s and 14 days")
    value = host.cell_timeout(seconds)
    shown = "the server's default (600 s unless the server is configured otherwise)" if value is None \
        else f"{value:g} s"
    return f"cell timeout: {shown}" + (" from the next cell on\n" if args else "\n")


async def run_ttl(args: list[str], host: MagicHost) -> None:
    sbx = await host.sandbox()
    if not args:
        info = await sbx.refresh()
        host.stdout(f"TTL: {ttl_line(info)}\n")
        return
    verb = args[0]
    if verb not in ("renew", "extend", "set") or len(args) > 2 or (verb != "renew" and len(args) != 2):
        raise CellFailure("UsageError", HELP["ttl"])
    seconds: int | None = None
    if len(args) == 2:
        try:
            seconds = int(args[1])
        except ValueError:
            raise CellFailure("UsageError", f"%ttl {verb}: {args[1]!r} is not a number of seconds") from None
    if verb == "extend":
        info = await sbx.renew(extend_seconds=seconds)
        host.stdout(f"extended once to {format_duration(seconds)} from now (each cell still renews to "
                    f"{format_duration(info.ttl_seconds or 0)}). TTL: {ttl_line(info)}\n")
    elif seconds is not None:  # `set N`, and `renew N` as it always meant
        info = await sbx.renew(seconds)
        host.stdout(f"TTL set to {format_duration(seconds)}: this and every later cell renew expiry to "
                    f"{format_duration(seconds)} ahead (to push expiry back once instead: %ttl extend SECONDS). "
                    f"TTL: {ttl_line(info)}\n")
    else:
        info = await sbx.renew()
        host.stdout(f"renewed. TTL: {ttl_line(info)}\n")
