"""``serve``, ``gateway``, ``user-token``, ``doctor``, ``stop``, ``purge``: a server and its state directory."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys

from .common import add_state_dir, command, error, state_of


def _config_from(args):
    from ..core.config import ServiceConfig

    kwargs = {}
    for name in ("host", "port", "state_dir", "token", "pool_size", "ttl_seconds", "memory_mb", "pids", "cpus",
                 "node_id", "pid_file"):
        value = getattr(args, name, None)
        if value is not None:
            kwargs[name] = value
    for flag in ("allow_missing_protections", "delete_on_shutdown", "draining", "multi_user"):
        if getattr(args, flag, False):
            kwargs[flag] = True
    if getattr(args, "no_seccomp", False):
        kwargs["seccomp"] = False
    if getattr(args, "unsafe_test_only_layers_off", None):
        from ..isolation.testonly import parse

        try:
            kwargs["unsafe_test_only_layers_off"] = parse(args.unsafe_test_only_layers_off)
        except ValueError as exc:
            raise SystemExit(f"error: --unsafe-test-only-layers-off: {exc}") from None
    pools = {}
    for item in getattr(args, "pool_image", None) or []:
        name, _, count = item.partition("=")
        if not count.isdigit():
            raise SystemExit(f"error: --pool-image wants NAME=COUNT (e.g. stats=2), got {item!r}")
        pools[name] = int(count)
    if pools:
        kwargs["pool_sizes"] = pools
    traits = ServiceConfig.class_traits(config=True)
    for item in getattr(args, "set", None) or []:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in traits:
            close = difflib.get_close_matches(name, traits, n=3)
            raise SystemExit(f"error: --set wants NAME=VALUE with NAME one of the server's settings, got {item!r} ("
                             + (f"did you mean {' or '.join(close)}? " if close else "")
                             + f"the settings: {', '.join(sorted(traits))})")
        try:
            kwargs[name] = traits[name].from_string(value)
        except Exception as exc:
            raise SystemExit(f"--set {item!r}: {exc}") from None
    from traitlets import TraitError

    try:
        return ServiceConfig(**kwargs)
    except TraitError as exc:
        raise SystemExit(f"error: {exc}") from None


def cmd_serve(args) -> int:
    config = _config_from(args)
    from ..service.refusal import config_refusal

    refusal = config_refusal(config)  # before the plan: a server that refuses builds nothing
    if refusal:
        print(refusal, file=sys.stderr, flush=True)
        return 2
    if args.daemon:
        from . import daemon

        return daemon.start(args.raw_argv, config.state_dir, args.pid_file)
    _say_build_plan(config)
    from ..service.server import serve  # seconds of imports on a busy host: after the plan

    return serve(config, log_level=args.log_level)


def _say_build_plan(config) -> None:
    """Before a first build, its plan (steps, time, disk) as the log's first line: a kernel
    that starts this server shows the log's last line as its status from the first second."""
    from ..common.paths import StateDir
    from ..images.images import DEFAULT_IMAGE, ImageStore, first_build_plan

    if config.default_image == DEFAULT_IMAGE:
        plan = first_build_plan(ImageStore(StateDir(config.state_dir)))
        if plan:
            print(plan, file=sys.stderr, flush=True)


def cmd_gateway(args) -> int:
    from ..gateway.config import GatewayConfig
    from ..gateway.server import serve_gateway

    kwargs = {k: v for k, v in vars(args).items()
              if v is not None and k in ("host", "port", "token", "node_token", "dns_name", "dns_port", "dns_server",
                                         "refresh_seconds", "node_timeout_seconds", "node_gone_seconds")}
    if args.node:
        kwargs["nodes"] = args.node
    return serve_gateway(GatewayConfig(**kwargs), log_level=args.log_level)


def cmd_user_token(args) -> int:
    from ..gateway import users

    secret = os.environ.get("SANDBOX_KERNEL_USER_SECRET", "")
    try:
        print(users.mint(secret, args.name))
    except users.UserTokenError as exc:
        error(str(exc))
        return 2
    return 0


def cmd_doctor(args) -> int:
    from ..isolation import doctor

    items = doctor.report(_config_from(args))
    if args.json:
        print(json.dumps(items, indent=1))
    else:
        print(doctor.format_report(items))
        print(f"state directory: {state_of(args).root}")
    return 1 if doctor.missing(items) else 0


def cmd_stop(args) -> int:
    """Stop the state directory's server now: its warm pool ends, image mounts are
    detached; kept sandboxes run on (their deadlines end them; the next server re-adopts)."""
    from ..service import housekeeping

    state = state_of(args)
    try:
        record = housekeeping.stop_server(state, timeout=args.timeout)
    except (TimeoutError, housekeeping.AdminRefused) as exc:
        error(str(exc))
        return 1
    if record is None:
        print(f"no sandbox server runs on {state.root}")
    else:
        print(f"stopped the sandbox server (pid {record['pid']}) of {state.root}")
    live = housekeeping.live_sandboxes(state)
    if live:
        print(f"{len(live)} sandbox(es) kept running ({', '.join(sorted(live))}): they end at their TTL, and the "
              "next server re-adopts them; to end them now: sandbox-kernel rm --all, then sandbox-kernel stop")
    return 0


def cmd_purge(args) -> int:
    """Remove a state directory: its images, sandboxes' files, token and logs."""
    from ..service import housekeeping

    state = state_of(args)
    if not os.path.lexists(state.root):
        print(f"nothing to purge: {state.root} does not exist")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            error(f"purge removes {state.root} and everything in it; add --yes to confirm")
            return 2
        if input(f"remove {state.root} and everything in it (images, workspaces, token)? [y/N] ").strip().lower() \
                not in ("y", "yes"):
            print("nothing removed")
            return 1
    try:
        purged = housekeeping.purge(state, force=args.force)
    except housekeeping.PurgeRefused as exc:
        error(str(exc))
        return 1
    detached = f" (after unmounting {len(purged.unmounted)} mount(s))" if purged.unmounted else ""
    if not purged.removed:
        error(f"{state.root} was not removed{detached}: " + ("; ".join(purged.left) or "it is still there"))
        return 1
    print(f"removed {state.root}{detached}")
    return 0


def _register_serve(sub) -> None:
    serve = command(sub, "serve", "run the sandbox server (on STATE/server.sock; TCP only with --port/--host)", """
        sandbox-kernel serve
        sandbox-kernel serve --port 8765 --set total_memory_mb=16384 --set max_sandboxes=20
        sandbox-kernel serve --state-dir /srv/sandboxes --pool-size 4
        sandbox-kernel serve --multi-user --daemon        # as root, on a host without systemd""")
    serve.add_argument("--host", help="also listen on TCP at this address (port 8765 unless --port)")
    serve.add_argument("--port", type=int, help="also listen on TCP at this port (127.0.0.1 unless --host)")
    add_state_dir(serve)
    serve.add_argument("--multi-user", action="store_true",
                       help="system-wide server (root): socket open to all users, each sees only their own sandboxes")
    serve.add_argument("--token", help="bearer token (default: SANDBOX_KERNEL_TOKEN or STATE/token)")
    serve.add_argument("--pool-size", type=int, help="warm sandboxes kept ready for the default image")
    serve.add_argument("--pool-image", action="append", metavar="NAME=COUNT",
                       help="warm sandboxes for a custom image (repeatable)")
    serve.add_argument("--ttl-seconds", type=int)
    serve.add_argument("--memory-mb", type=int)
    serve.add_argument("--pids", type=int)
    serve.add_argument("--cpus", type=float)
    serve.add_argument("--set", action="append", metavar="NAME=VALUE",
                       help="any server setting, e.g. --set max_memory_mb=4096 (see docs/service.md, Limits)")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--daemon", action="store_true",
                       help="run in the background (a host without systemd): output to STATE/server.log, pid in "
                            "the pid file; returns once the server answers; `sandbox-kernel stop` ends it")
    serve.add_argument("--pid-file", metavar="FILE",
                       help="write the server's pid here while it runs (with --daemon: STATE/server.pid)")
    serve.add_argument("--node-id", help="this node's name in a cluster, put in every sandbox id so that a "
                       "gateway can route to it (e.g. the Kubernetes node name)")
    serve.add_argument("--drain", dest="draining", action="store_true",
                       help="start draining: no new sandboxes (undo with POST /v1/node/drain {\"draining\": false})")
    serve.add_argument("--delete-on-shutdown", action="store_true")
    serve.add_argument("--no-seccomp", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--unsafe-test-only-layers-off", metavar="LAYER,...", help=argparse.SUPPRESS)
    serve.add_argument("--allow-missing-protections", action="store_true",
                       help="start even when `doctor` reports a protection missing (weaker isolation!)")
    serve.set_defaults(func=cmd_serve)


def _register_gateway(sub) -> None:
    gw = command(sub, "gateway", "serve the /v1 API over many node servers", """
        SANDBOX_KERNEL_TOKEN=... sandbox-kernel gateway --node http://10.0.0.5:8765 --node http://10.0.0.6:8765
        sandbox-kernel gateway --dns-name sandbox-nodes.default.svc.cluster.local""")
    gw.add_argument("--host")
    gw.add_argument("--port", type=int, help="default 8780")
    gw.add_argument("--token", help="the token clients send (default: SANDBOX_KERNEL_TOKEN)")
    gw.add_argument("--node-token", help="the token sent to nodes (default: SANDBOX_KERNEL_NODE_TOKEN, else --token)")
    gw.add_argument("--node", action="append", metavar="URL", help="a node server's URL (repeatable)")
    gw.add_argument("--dns-name", help="find nodes as the A/AAAA records of this name (a headless Service)")
    gw.add_argument("--dns-port", type=int, help="the nodes' port for --dns-name (default 8765)")
    gw.add_argument("--dns-server", metavar="IP[:PORT]",
                    help="resolver for --dns-name and for host names in --node URLs (default: the system's)")
    gw.add_argument("--refresh-seconds", type=float, help="discovery and node info refresh (default 2)")
    gw.add_argument("--node-timeout-seconds", type=float, help="connect and /v1/info timeout per node (default 3)")
    gw.add_argument("--node-gone-seconds", type=float,
                    help="a node silent this long is gone: its sandboxes answer 410 (default 30; 503 before)")
    gw.add_argument("--log-level", default="info")
    gw.set_defaults(func=cmd_gateway)
    p = command(sub, "user-token", "print a user's token for a gateway with a user secret: it reaches that user's "
                                   "sandboxes only", """
        SANDBOX_KERNEL_USER_SECRET=... sandbox-kernel user-token alice""")
    p.add_argument("name", help="the user's name (JupyterHub's user name on a hub)")
    p.set_defaults(func=cmd_user_token)


def register(sub) -> None:
    _register_serve(sub)
    _register_gateway(sub)
    p = command(sub, "doctor", "report each protection as in force, weaker or missing, and what to do", """
        sandbox-kernel doctor
        sandbox-kernel doctor --json""")
    p.add_argument("--json", action="store_true")
    add_state_dir(p)
    p.set_defaults(func=cmd_doctor)
    p = command(sub, "stop", "stop the state directory's server now (warm pool ended, images unmounted; "
                             "kept sandboxes run on until their TTL)", """
        sandbox-kernel stop
        sandbox-kernel rm --all && sandbox-kernel stop      # nothing left running""")
    add_state_dir(p)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it to stop (default 60)")
    p.set_defaults(func=cmd_stop)
    p = command(sub, "purge", "remove a state directory and everything in it (refused while its server runs)", """
        sandbox-kernel stop && sandbox-kernel purge --yes
        sandbox-kernel purge --state-dir /tmp/sk-state --yes --force   # also end its sandboxes""")
    add_state_dir(p)
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.add_argument("--force", action="store_true", help="end the sandboxes still running there first")
    p.set_defaults(func=cmd_purge)
