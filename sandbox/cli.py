"""``sandbox-kernel``: serve | gateway | doctor | image build/ls/rm | install | ls | rm | drain | mcp | lab.

Every command that talks to a server finds it as the kernel does (sandbox/endpoint.py):
``--url``, else ``--state-dir``'s socket, else SANDBOX_KERNEL_URL, else the state
directory's socket from SANDBOX_KERNEL_STATE_DIR or the default. None falls back to another
server; every connection error names the URL or socket it tried.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _config_from(args):
    from .config import ServiceConfig

    kwargs = {}
    for name in ("host", "port", "state_dir", "token", "pool_size", "ttl_seconds", "memory_mb", "pids", "cpus",
                 "node_id"):
        value = getattr(args, name, None)
        if value is not None:
            kwargs[name] = value
    for flag in ("allow_missing_protections", "delete_on_shutdown", "draining", "multi_user"):
        if getattr(args, flag, False):
            kwargs[flag] = True
    if getattr(args, "no_seccomp", False):
        kwargs["seccomp"] = False
    if getattr(args, "unsafe_test_only_layers_off", None):
        from .testonly import parse

        try:
            kwargs["unsafe_test_only_layers_off"] = parse(args.unsafe_test_only_layers_off)
        except ValueError as exc:
            raise SystemExit(f"--unsafe-test-only-layers-off: {exc}") from None
    pools = {}
    for item in getattr(args, "pool_image", None) or []:
        name, _, count = item.partition("=")
        if not count.isdigit():
            raise SystemExit(f"--pool-image wants NAME=COUNT, got {item!r}")
        pools[name] = int(count)
    if pools:
        kwargs["pool_sizes"] = pools
    traits = ServiceConfig.class_traits(config=True)
    for item in getattr(args, "set", None) or []:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in traits:
            raise SystemExit(f"--set wants NAME=VALUE with NAME one of the server's settings "
                             f"({', '.join(sorted(traits))}), got {item!r}")
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
    from .server import serve

    return serve(_config_from(args), log_level=args.log_level)


def cmd_gateway(args) -> int:
    from .gateway.config import GatewayConfig
    from .gateway.server import serve_gateway

    kwargs = {k: v for k, v in vars(args).items()
              if v is not None and k in ("host", "port", "token", "node_token", "dns_name", "dns_port", "dns_server",
                                         "refresh_seconds", "node_timeout_seconds", "node_gone_seconds")}
    if args.node:
        kwargs["nodes"] = args.node
    return serve_gateway(GatewayConfig(**kwargs), log_level=args.log_level)


def cmd_doctor(args) -> int:
    from . import doctor
    from .paths import StateDir

    items = doctor.report(_config_from(args))
    if args.json:
        print(json.dumps(items, indent=1))
    else:
        print(doctor.format_report(items))
        state = StateDir(args.state_dir) if args.state_dir else StateDir.default()
        print(f"state directory: {state.root}")
    return 1 if doctor.missing(items) else 0


def _store(args):
    from .images import ImageStore
    from .paths import StateDir

    state = StateDir(args.state_dir) if args.state_dir else StateDir.default()
    state.ensure()
    return ImageStore(state)


def cmd_image_build(args) -> int:
    from .images import DEFAULT_IMAGE, ImageError

    requirements = None
    if args.requirements:
        with open(args.requirements) as f:
            requirements = f.read()
    preload = args.preload.split(",") if args.preload is not None else None
    progress = lambda line: None if "WARNING: Location" in line else print(line, flush=True)  # noqa: E731
    try:
        info = _store(args).build(args.name or DEFAULT_IMAGE, pip=args.pip or [], requirements=requirements,
                                  preload=preload, progress=progress)
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"image {info['name']}: {len(info['packages'])} packages, {info['size_bytes'] // (1 << 20)} MiB")
    return 0


def cmd_image_ls(args) -> int:
    images = _store(args).list()
    if not images:
        print("no images yet: sandbox-kernel image build")
        return 0
    print(f"{'NAME':<20} {'SIZE':>8}  {'BUILT':<20}  PACKAGES")
    for i in images:
        extra = ", ".join(i["pip"]) if i.get("base") else f"{len(i['packages'])} packages"
        print(f"{i['name']:<20} {i['size_bytes'] // (1 << 20):>6}Mi  {i['built_at']:<20}  {extra}")
    return 0


def cmd_image_rm(args) -> int:
    """Removed by the state directory's server, which knows which images its sandboxes use
    (and ends the warm pool's sandboxes of that image). Sandboxes outlive their server, so
    when it cannot be asked the removal is refused; --force removes the files regardless."""
    from .client import DEFAULT_TIMEOUT, ServerUnavailable
    from .client.sync_client import _SyncTransport
    from .images import ImageError

    config = _server(args)
    if config is None:
        return 1
    tr = _SyncTransport(config, DEFAULT_TIMEOUT)
    try:
        tr.request("DELETE", f"/v1/images/{args.name}")
    except ServerUnavailable as exc:
        if not args.force:
            _error(f"{exc}\nnot removing image {args.name!r}: only the server knows whether a sandbox uses it "
                   "(sandboxes outlive their server); start it, or pass --force to remove it anyway")
            return 1
        try:
            _store(args).remove(args.name, lambda name: 0)
        except ImageError as err:
            _error(str(err))
            return 1
        print(f"removed image {args.name} (--force: no server was asked whether a sandbox uses it)")
        return 0
    except Exception as exc:  # SandboxError: 404, 409, 401, ...
        _error(str(exc))
        return 1
    finally:
        tr.close()
    print(f"removed image {args.name}")
    return 0


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def _server(args):
    """The ServerConfig of the server this command talks to (see the module docstring);
    None after printing why there is none."""
    from .client import SandboxError, resolve

    try:
        return resolve(getattr(args, "url", None), None, getattr(args, "state_dir", None))
    except SandboxError as exc:
        _error(str(exc))
        return None


def cmd_drain(args) -> int:
    """Drain a node server (no new sandboxes, its own run out), or undo it: on the server
    this command reaches, or, through a gateway, on its node ``--node``."""
    from .client import DEFAULT_TIMEOUT, SandboxError
    from .client.sync_client import _SyncTransport

    config = _server(args)
    if config is None:
        return 1
    path = f"/v1/nodes/{args.node}/drain" if args.node else "/v1/node/drain"
    tr = _SyncTransport(config, DEFAULT_TIMEOUT)
    try:
        answer = tr.request("POST", path, json={"draining": not args.undo})
    except SandboxError as exc:
        _error(str(exc))
        return 1
    finally:
        tr.close()
    node = answer.get("node_id") or args.node or config.where
    if answer.get("draining"):
        print(f"node {node} is draining: no new sandboxes; its {answer.get('sandboxes', '?')} sandbox(es) run on "
              "until they end (undo: sandbox-kernel drain --undo)")
    else:
        print(f"node {node} takes new sandboxes again")
    return 0


def cmd_install(args) -> int:
    from kernel.install import install_kernelspecs

    install_kernelspecs(user=args.user, sys_prefix=args.sys_prefix, prefix=args.prefix, image=args.image)
    return 0


def cmd_ls(args) -> int:
    from .client import SandboxError, list_sandboxes

    config = _server(args)
    if config is None:
        return 1
    try:
        sandboxes = list_sandboxes(config=config)
    except SandboxError as exc:
        _error(str(exc))
        return 1
    for sbx in sandboxes:
        print(f"{sbx.id}  {sbx.state:<8} {sbx.image:<12} expires {sbx.expires_at}  cells {sbx.execution_count}")
    if not sandboxes and sys.stdout.isatty():
        print(f"no sandboxes on {config.where}", file=sys.stderr)
    return 0


def cmd_usage(args) -> int:
    """The usage report: the server's (or, through a gateway, every node's) usage records
    summed per user, image and day (sandbox/usage/report.py)."""
    from .client import DEFAULT_TIMEOUT, SandboxError
    from .client.sync_client import _SyncTransport
    from .usage import report

    try:
        since = report.parse_since(args.since)
    except ValueError as exc:
        _error(str(exc))
        return 2
    config = _server(args)
    if config is None:
        return 1
    tr = _SyncTransport(config, DEFAULT_TIMEOUT)
    try:
        answer = tr.request("GET", "/v1/usage", params={"since": since} if since else None)
    except SandboxError as exc:
        _error(str(exc))
        return 1
    finally:
        tr.close()
    for node in answer.get("nodes_unavailable") or []:
        _error(f"node {node.get('node_id') or node.get('address')} did not answer: {node.get('message')} "
               "(its records are not in this report)")
    records = answer["records"]
    if args.records:
        print(report.render(records, args.format, report.RECORD_COLUMNS))
    else:
        print(report.render(report.summarise(records), args.format))
    return 0


def cmd_rm(args) -> int:
    """Each id on its own: an unknown one is one line (and exit status 1), one that had
    already ended says how, and the others still go."""
    from .client import DEFAULT_TIMEOUT, SandboxError, SandboxGone, SandboxNotFound, ServerUnavailable
    from .client.sync_client import _SyncTransport

    config = _server(args)
    if config is None:
        return 1
    failed = 0
    tr = _SyncTransport(config, DEFAULT_TIMEOUT)
    try:
        for sandbox_id in args.ids:
            try:
                tr.request("DELETE", f"/v1/sandboxes/{sandbox_id}")
                print(f"deleted {sandbox_id}")
            except SandboxNotFound:
                _error(f"no sandbox {sandbox_id} on the sandbox server at {config.where}")
                failed += 1
            except SandboxGone as exc:
                print(f"{exc} (nothing to delete)")
            except ServerUnavailable as exc:
                _error(str(exc))
                return 1
            except SandboxError as exc:
                _error(str(exc))
                failed += 1
    finally:
        tr.close()
    return 1 if failed else 0


def cmd_mcp(args) -> int:
    try:
        from .agents import mcp_server
    except ImportError as exc:
        print(f"error: the MCP server needs the mcp extra: pip install 'sandbox-kernel[mcp]' ({exc})", file=sys.stderr)
        return 1
    return mcp_server.main(args.transport, args.host, args.port, args.url, args.token, args.image, args.ttl_seconds,
                           scope=args.scope, reach=args.reach)


def cmd_lab(args) -> int:
    """Install the kernelspecs into this environment and start JupyterLab with them."""
    from kernel.install import TIERS, install_kernelspec, kernel_spec

    for isolation in TIERS:  # pip normally ships them already
        name, _ = kernel_spec(isolation=isolation)
        if not os.path.exists(os.path.join(sys.prefix, "share", "jupyter", "kernels", name, "kernel.json")):
            install_kernelspec(user=False, sys_prefix=True, isolation=isolation)
    argv = [sys.executable, "-m", "jupyter", "lab", "--ip=127.0.0.1", f"--port={args.port}", "--no-browser"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    extra = args.lab_args[1:] if args.lab_args[:1] == ["--"] else args.lab_args
    argv += extra
    os.execv(sys.executable, argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox-kernel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the sandbox server (on STATE/server.sock; TCP only with --port/--host)")
    serve.add_argument("--host", help="also listen on TCP at this address (port 8765 unless --port)")
    serve.add_argument("--port", type=int, help="also listen on TCP at this port (127.0.0.1 unless --host)")
    serve.add_argument("--state-dir")
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
                       help="any server setting, e.g. --set max_memory_mb=4096 (see README, Limits)")
    serve.add_argument("--log-level", default="info")
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

    gw = sub.add_parser("gateway", help="serve the /v1 API over many node servers")
    gw.add_argument("--host")
    gw.add_argument("--port", type=int, help="default 8780")
    gw.add_argument("--token", help="the token clients send (default: SANDBOX_KERNEL_TOKEN)")
    gw.add_argument("--node-token", help="the token sent to nodes (default: SANDBOX_KERNEL_NODE_TOKEN, else --token)")
    gw.add_argument("--node", action="append", metavar="URL", help="a node server's URL (repeatable)")
    gw.add_argument("--dns-name", help="find nodes as the A/AAAA records of this name (a headless Service)")
    gw.add_argument("--dns-port", type=int, help="the nodes' port for --dns-name (default 8765)")
    gw.add_argument("--dns-server", metavar="IP[:PORT]", help="resolver for --dns-name (default: the system's)")
    gw.add_argument("--refresh-seconds", type=float, help="discovery and node info refresh (default 2)")
    gw.add_argument("--node-timeout-seconds", type=float, help="connect and /v1/info timeout per node (default 3)")
    gw.add_argument("--node-gone-seconds", type=float,
                    help="a node silent this long is gone: its sandboxes answer 410 (default 30; 503 before)")
    gw.add_argument("--log-level", default="info")
    gw.set_defaults(func=cmd_gateway)

    doc = sub.add_parser("doctor", help="report each protection as in force, weaker or missing")
    doc.add_argument("--json", action="store_true")
    doc.add_argument("--state-dir")
    doc.set_defaults(func=cmd_doctor)

    image = sub.add_parser("image", help="build, list and remove images")
    isub = image.add_subparsers(dest="image_command", required=True)
    build = isub.add_parser("build", help="build the default image, a shipped recipe (datascience), "
                                                    "or a named one with extra packages")
    build.add_argument("name", nargs="?")
    build.add_argument("--pip", nargs="+", metavar="PKG")
    build.add_argument("--requirements", metavar="FILE")
    build.add_argument("--preload", help="comma-separated modules imported ahead in warm sandboxes")
    build.add_argument("--state-dir")
    build.set_defaults(func=cmd_image_build)
    ls = isub.add_parser("ls", help="list images")
    ls.add_argument("--state-dir")
    ls.set_defaults(func=cmd_image_ls)
    rm = isub.add_parser("rm", help="remove an image no sandbox uses (asks the state directory's server)")
    rm.add_argument("name")
    rm.add_argument("--state-dir")
    rm.add_argument("--url", help="the server to ask (default: the state directory's socket)")
    rm.add_argument("--force", action="store_true",
                    help="remove the files even when no server can say whether a sandbox uses the image")
    rm.set_defaults(func=cmd_image_rm)

    inst = sub.add_parser("install", help="install the Jupyter kernelspecs (one per isolation tier)")
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true")
    where.add_argument("--sys-prefix", action="store_true")
    where.add_argument("--prefix")
    inst.add_argument("--image", help="install 'Python (sandbox: IMAGE)' for a custom image")
    inst.set_defaults(func=cmd_install)

    lss = sub.add_parser("ls", help="list live sandboxes")
    rms = sub.add_parser("rm", help="delete sandboxes")
    rms.add_argument("ids", nargs="+")
    for p in (lss, rms):
        p.add_argument("--state-dir", help="whose server: this state directory's socket")
        p.add_argument("--url", help="a server URL: http://HOST:PORT (token from SANDBOX_KERNEL_TOKEN or the "
                                     "state directory) or unix:/path/server.sock")
    lss.set_defaults(func=cmd_ls)
    rms.set_defaults(func=cmd_rm)

    usage = sub.add_parser("usage", help="usage per user, image and day (CPU-s, memory and disk GiB-hours, egress, cells)")
    usage.add_argument("--since", help="only sandboxes alive at or after this date (2026-12-01) or time, UTC")
    usage.add_argument("--format", choices=["table", "csv", "json"], default="table")
    usage.add_argument("--records", action="store_true", help="one line per sandbox instead of the sums")
    usage.add_argument("--state-dir", help="whose server: this state directory's socket")
    usage.add_argument("--url", help="a server or gateway URL: http://HOST:PORT (token from SANDBOX_KERNEL_TOKEN) "
                                     "or unix:/path/server.sock")
    usage.set_defaults(func=cmd_usage)

    drain = sub.add_parser("drain", help="drain a node: it takes no new sandboxes, its own run until they end")
    drain.add_argument("--undo", action="store_true", help="take new sandboxes again")
    drain.add_argument("--node", help="through a gateway: the node id to drain (see GET /v1/nodes)")
    drain.add_argument("--state-dir", help="whose server: this state directory's socket")
    drain.add_argument("--url", help="a node server or gateway URL: http://HOST:PORT (token from SANDBOX_KERNEL_TOKEN) "
                                     "or unix:/path/server.sock")
    drain.set_defaults(func=cmd_drain)

    mcp = sub.add_parser("mcp", help="serve the sandboxes over the Model Context Protocol (stdio or HTTP)")
    mcp.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP: address to listen on")
    mcp.add_argument("--port", type=int, default=8766, help="HTTP: port (the endpoint is /mcp)")
    mcp.add_argument("--url", help="the sandbox server (default: SANDBOX_KERNEL_URL or the local one)")
    mcp.add_argument("--token", help="its token, also required of HTTP clients (default: SANDBOX_KERNEL_TOKEN or STATE/token)")
    mcp.add_argument("--image", help="image of the sandboxes it creates")
    mcp.add_argument("--ttl-seconds", type=int, help="idle TTL of the sandboxes it creates (default 1800)")
    mcp.add_argument("--scope", help="the label of the sandboxes it creates, and the only ones it may reach "
                                     "(default: a new one per start, mcp-XXXXXXXX)")
    mcp.add_argument("--reach", action="append", default=[], metavar="SCOPE",
                     help="also reach the sandboxes of this scope ('*': every sandbox the token reaches, the "
                          "user's notebooks too); repeatable")
    mcp.set_defaults(func=cmd_mcp)

    lab = sub.add_parser("lab", help="install the kernelspecs and start JupyterLab")
    lab.add_argument("--port", type=int, default=8888)
    lab.add_argument("lab_args", nargs=argparse.REMAINDER)
    lab.set_defaults(func=cmd_lab)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        sys.exit(args.func(args) or 0)
    except KeyboardInterrupt:
        sys.exit(130)
