"""``ls``, ``rm``, ``exec``, ``logs``, ``drain``: the sandboxes of a server."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone

from ..common import statefile
from ..usage.meter import NOT_MEASURED, PROCESS_FIGURES
from . import human, reach
from .common import add_state_dir, add_where, command, error, server, state_of_server, transport


# The usage figures `ls` shows when the server reports them (GET /v1/sandboxes' "usage");
# the rest (integrals, counts, egress) is in `ls --json`.
USAGE_COLUMNS = (("cpu_seconds", "CPU", lambda v: f"{v:.1f} s"), ("memory_bytes", "MEM USED", human.size),
                 ("disk_bytes", "DISK USED", human.size))


def cmd_ls(args) -> int:
    from ..client import SandboxError, list_sandboxes

    config = server(args)
    if config is None:
        return 1
    with reach.server_for_call(args, config) as answers:
        if not answers:
            return _nothing_runs(config, "[]" if args.json else None, what="no sandboxes")
        try:
            sandboxes = list_sandboxes(config=config)
        except SandboxError as exc:
            error(str(exc))
            return 1
    if args.json:
        print(json.dumps([s.raw for s in sandboxes], indent=1))
        return 0
    if not sandboxes:
        print(f"no sandboxes on {config.where} (a notebook on \"Python (sandbox)\" or Sandbox.create() makes one)",
              file=sys.stderr)
        return 0
    shown = [c for c in USAGE_COLUMNS if any(c[0] in (s.raw.get("usage") or {}) for s in sandboxes)]
    # A shared server names each sandbox's owner (root lists everyone's there).
    owners = any("owner" in s.raw for s in sandboxes)
    header = ["ID", *(["OWNER"] if owners else []), "STATE", "IMAGE", "ISOLATION", "CREATED", "EXPIRES", "CELLS",
              "MEMORY"] + [c[1] for c in shown]
    rows = []
    for s in sandboxes:
        memory = human.size(s.limits.memory_mb * (1 << 20)) if s.limits.memory_mb else "-"
        usage = s.raw.get("usage") or {}
        owner = [(s.raw.get("owner") or {}).get("name") or "-"] if owners else []
        rows.append([s.id, *owner, s.state, s.image or "-", s.isolation.get("backend") or "-",
                     human.relative(s.created_at), human.relative(s.expires_at), s.execution_count, memory]
                    + [_usage_figure(usage, key, fmt) for key, _, fmt in shown])
    first_number = 7 if owners else 6
    print(human.table(header, rows, right=set(range(first_number, first_number + 2 + len(shown)))))
    return 0


def _usage_figure(usage: dict, key: str, fmt) -> str:
    """A usage cell of `ls`: the figure, "not measured" where nothing could read it (an
    ordinary user's server without a readable process tree), "-" where the server has none."""
    if usage.get(key) is not None:
        return fmt(usage[key])
    return NOT_MEASURED if key in PROCESS_FIGURES and key in usage else "-"


def cmd_rm(args) -> int:
    """Each id on its own: an unknown one is one line (and exit status 1), one that had
    already ended says how, and the others still go."""
    if bool(args.ids) == bool(args.all):
        error("name the sandboxes to delete (sandbox-kernel rm ID...) or give --all, not both")
        return 2
    config = server(args)
    if config is None:
        return 1
    with reach.server_for_call(args, config) as answers:
        if not answers:
            return _nothing_runs(config, None, args.ids, what="nothing to delete")
        return _delete(args, config)


def _nothing_runs(config, say: str | None, ids=(), what: str = "") -> int:
    """No server on the caller's own state directory, and no sandbox running there: what
    `ls` and `rm` answer (``say`` on stdout for a script: `ls --json`'s empty list)."""
    if say is not None:
        print(say)
    where = os.path.dirname(config.socket)
    for sandbox_id in ids:
        error(f"no sandbox {sandbox_id} runs in {where}, nor a sandbox server (sandbox-kernel ls --url URL, or "
              "--state-dir DIR, looks elsewhere)")
    if not ids:
        print(f"{what}: no sandbox server runs on {where}, nor any sandbox there", file=sys.stderr)
    return 1 if ids else 0


def _delete(args, config) -> int:
    from ..client import SandboxError, SandboxGone, SandboxNotFound, ServerUnavailable, list_sandboxes

    failed = 0
    with transport(config) as tr:
        try:
            ids = args.ids or [s.id for s in list_sandboxes(config=config)]
        except SandboxError as exc:
            error(str(exc))
            return 1
        if not ids:
            print(f"no sandboxes on {config.where}: nothing to delete")
        for sandbox_id in ids:
            try:
                tr.request("DELETE", f"/v1/sandboxes/{sandbox_id}")
                print(f"deleted {sandbox_id}")
            except SandboxNotFound:
                error(f"no sandbox {sandbox_id} on the sandbox server at {config.where} (sandbox-kernel ls lists them)")
                failed += 1
            except SandboxGone as exc:
                print(f"{exc} (nothing to delete)")
            except ServerUnavailable as exc:
                error(str(exc))
                return 1
            except SandboxError as exc:
                error(str(exc))
                failed += 1
    return 1 if failed else 0


def cmd_exec(args) -> int:
    """A command in a sandbox, its output streamed as written; our exit status is its own
    (128 + the signal when one ended it, 1 when the sandbox ended under it)."""
    from ..client import Sandbox, SandboxError, SandboxNotFound

    config = server(args)
    if config is None:
        return 1
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        error("no command: sandbox-kernel exec ID -- CMD [ARG...]")
        return 2
    sbx = Sandbox(args.id, config=config)
    try:
        result = sbx.commands.run(argv if len(argv) > 1 or args.argv else argv[0], cwd=args.cwd,
                                  timeout=args.timeout, stdin=None if sys.stdin.isatty() else sys.stdin.buffer.read(),
                                  on_stdout=lambda text: (sys.stdout.write(text), sys.stdout.flush()),
                                  on_stderr=lambda text: (sys.stderr.write(text), sys.stderr.flush()))
    except SandboxNotFound:
        error(f"no sandbox {args.id} on the sandbox server at {config.where} (sandbox-kernel ls lists them)")
        return 1
    except SandboxError as exc:
        error(str(exc))
        return 1
    finally:
        sbx.close()
    if result.exit_code is not None:
        return result.exit_code
    error(result.message or f"the command did not exit by itself ({result.reason})")
    return 128 + result.signal if result.signal else 1


def _when(value) -> str:
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, timezone.utc)
    return f"{value} ({human.relative(value)})"


def _log_sections(state, sandbox_id: str) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """What this machine knows of a sandbox, oldest layer first: the server log's lines
    naming it, its supervisor's log, its runtime's log, and its recorded state; and the
    files among them that exist but could not be read (a root server's, read by a user)."""
    d = state.sandbox(sandbox_id)
    sections, unreadable = [], []

    def lines_of(path: str, keep=lambda line: True) -> list[str] | None:
        try:
            with open(path, "rb") as f:
                return [human.terminal_text(line.rstrip(b"\n")) for line in f if keep(line)]
        except FileNotFoundError:
            return None
        except OSError as exc:
            unreadable.append(f"{path} ({exc.strerror})")
            return None

    found = lines_of(os.path.join(state.root, "server.log"), lambda line: sandbox_id.encode() in line)
    if found is not None:
        sections.append(("server.log", found))
    for name in ("supervisor.log", "runtime.log"):
        found = lines_of(os.path.join(d, name))
        if found is not None:
            sections.append((name, found))
    state_file = os.path.join(d, "state.json")
    if os.path.exists(state_file) and not os.access(state_file, os.R_OK):
        unreadable.append(f"{state_file} (Permission denied)")
    record = statefile.read_json(state_file)
    if record:
        keys = ("state", "dead_reason", "created_at", "expires_at", "execution_count")
        sections.append(("state.json", [f"{k}: {_when(record[k]) if k.endswith('_at') else record[k]}"
                                        for k in keys if record.get(k) is not None]))
    return sections, unreadable


def cmd_logs(args) -> int:
    """A sandbox's logs, read from the state directory (this machine only). A log that is
    there but cannot be read is an error (exit status 1), never a silent gap. The state
    directory is that of the server the other commands reach (a host's system server's
    too, which a user cannot read: said, exit status 1)."""
    state = state_of_server(args)
    if os.path.isdir(state.root) and not os.access(state.root, os.R_OK | os.X_OK):
        error(f"{state.root} is not readable by you (a root server's state directory: run as root)")
        return 1
    if not os.path.isdir(state.sandbox(args.id)):
        error(f"no sandbox {args.id} in {state.root} (`sandbox-kernel ls` lists the live ones; an ended "
              "sandbox's directory goes after a while)")
        return 1
    sections, unreadable = _log_sections(state, args.id)
    for name, lines in sections:
        lines = lines[-args.tail:] if args.tail else lines
        print(f"== {name}" + ("" if lines else " (empty)"))
        if lines:
            print("\n".join(lines))
    if unreadable:
        error(f"cannot read {', '.join(unreadable)}: run as the server's user (root, for a root server)")
        return 1
    if not sections:
        print(f"nothing logged of {args.id} in {state.root} yet")
    return 0


def cmd_usage(args) -> int:
    """The usage report: the server's (or, through a gateway, every node's) usage records
    summed per user, image and day (sandbox/usage/report.py)."""
    from ..client import SandboxError
    from ..usage import report

    try:
        since = report.parse_since(args.since)
    except ValueError as exc:
        error(str(exc))
        return 2
    config = server(args)
    if config is None:
        return 1
    with transport(config) as tr:
        try:
            answer = tr.request("GET", "/v1/usage", params={"since": since} if since else None)
        except SandboxError as exc:
            error(str(exc))
            return 1
    for node in answer.get("nodes_unavailable") or []:
        error(f"node {node.get('node_id') or node.get('address')} did not answer: {node.get('message')} "
              "(its records are not in this report)")
    records = answer["records"]
    rows, columns = (records, report.RECORD_COLUMNS) if args.records else (report.summarise(records), report.COLUMNS)
    rows = [report.tidy(row) for row in rows]
    if rows:
        print(report.staleness(records), file=sys.stderr)
        if report.unmeasured(records):
            print(report.unmeasured(records), file=sys.stderr)
    if args.format != "table":
        print(report.render(rows, args.format, columns), end="" if args.format == "csv" else "\n")
    elif not rows:
        print(f"no usage recorded on {config.where}" + (f" since {since}" if since else "")
              + " (each sandbox records its own as it runs)", file=sys.stderr)
    else:
        shown = report.columns_of(rows, columns)
        print(human.table([c.upper() for c in shown], [[_usage_cell(c, row.get(c)) for c in shown] for row in rows],
                          right={i for i, c in enumerate(shown) if c not in report.RECORD_COLUMNS[:8] + report.GROUP_BY}))
    return 0


def _usage_cell(column: str, value) -> str:
    if value is None:
        return NOT_MEASURED if column in PROCESS_FIGURES else "-"
    if column.endswith("_bytes") or column.startswith("egress_bytes"):
        return human.size(value)
    if column.endswith("_seconds"):
        return human.duration(value)
    if column.endswith("_hours"):
        return f"{value:.4f}"
    if column.endswith("_at"):
        return human.relative(value)
    return str(value)


def cmd_drain(args) -> int:
    """Drain a node server (no new sandboxes, its own run out), or undo it: on the server
    this command reaches, or, through a gateway, on its node ``--node``."""
    from ..client import SandboxError

    config = server(args)
    if config is None:
        return 1
    path = f"/v1/nodes/{args.node}/drain" if args.node else "/v1/node/drain"
    with transport(config) as tr:
        try:
            answer = tr.request("POST", path, json={"draining": not args.undo})
        except SandboxError as exc:
            error(str(exc))
            return 1
    node = answer.get("node_id") or args.node or config.where
    if answer.get("draining"):
        print(f"node {node} is draining: no new sandboxes; its {answer.get('sandboxes', '?')} sandbox(es) run on "
              "until they end (undo: sandbox-kernel drain --undo)")
    else:
        print(f"node {node} takes new sandboxes again")
    return 0


def register(sub) -> None:
    p = command(sub, "ls", "list live sandboxes", """
        sandbox-kernel ls
        sandbox-kernel ls --json | jq -r '.[].id'
        sandbox-kernel ls --url http://127.0.0.1:8765""")
    p.add_argument("--json", action="store_true", help="the server's sandbox objects, as JSON")
    add_where(p)
    p.set_defaults(func=cmd_ls)

    p = command(sub, "rm", "delete sandboxes (their processes end, their files go)", """
        sandbox-kernel rm sbx-3f2a9c
        sandbox-kernel rm --all""")
    p.add_argument("ids", nargs="*")
    p.add_argument("--all", action="store_true", help="every live sandbox of this server (yours, on a shared one)")
    add_where(p)
    p.set_defaults(func=cmd_rm)

    p = command(sub, "exec", "run a command in a sandbox, streaming its output; exits with its exit code", """
        sandbox-kernel exec sbx-3f2a9c -- ls -la
        sandbox-kernel exec sbx-3f2a9c -- python -c 'import sys; print(sys.version)'
        sandbox-kernel exec sbx-3f2a9c -- 'pip list | grep pandas'    # one word: a shell line""")
    p.add_argument("id")
    p.add_argument("cmd", nargs="...", help="after --: the program and its arguments (one word: run by /bin/sh -c)")
    p.add_argument("--argv", action="store_true", help="run a one-word command as a program, not a shell line")
    p.add_argument("--cwd", help="directory inside /workspace")
    p.add_argument("--timeout", type=float, help="seconds (default: the server's execute timeout)")
    add_where(p)
    p.set_defaults(func=cmd_exec)

    p = command(sub, "logs", "show what this machine logged of a sandbox (server, supervisor, runtime, its state)", """
        sandbox-kernel logs sbx-3f2a9c
        sandbox-kernel logs sbx-3f2a9c --tail 20""")
    p.add_argument("id")
    p.add_argument("--tail", type=int, metavar="N", help="the last N lines only")
    add_state_dir(p)
    p.set_defaults(func=cmd_logs)

    p = command(sub, "usage", "usage per user, image and day (CPU-s, memory and disk GiB-hours, egress, cells)", """
        sandbox-kernel usage
        sandbox-kernel usage --since 2026-12-01 --format csv
        sandbox-kernel usage --records --url http://gateway:8780""")
    p.add_argument("--since", help="only sandboxes alive at or after this date (2026-12-01) or time, UTC")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--records", action="store_true", help="one line per sandbox instead of the sums")
    add_where(p, "a server or gateway URL: http://HOST:PORT (token from SANDBOX_KERNEL_TOKEN) "
                 "or unix:/path/server.sock")
    p.set_defaults(func=cmd_usage)

    p = command(sub, "drain", "drain a node: it takes no new sandboxes, its own run until they end", """
        sandbox-kernel drain --url http://node-a:8765
        sandbox-kernel drain --url http://gateway:8780 --node node-a
        sandbox-kernel drain --undo""")
    p.add_argument("--undo", action="store_true", help="take new sandboxes again")
    p.add_argument("--node", help="through a gateway: the node id to drain (see GET /v1/nodes)")
    add_where(p, "a node server or gateway URL: http://HOST:PORT (token from SANDBOX_KERNEL_TOKEN) "
                 "or unix:/path/server.sock")
    p.set_defaults(func=cmd_drain)
