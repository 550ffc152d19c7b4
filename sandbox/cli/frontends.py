"""``lab``, ``install``, ``mcp``: what people and agents use the sandboxes from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from .common import add_state_dir, command, error, state_of


def cmd_install(args) -> int:
    from kernel.install import install_kernelspecs

    try:
        install_kernelspecs(user=args.user, sys_prefix=args.sys_prefix, prefix=args.prefix, image=args.image,
                            url=args.url, host_cells=not args.no_host_cells)
    except ValueError as exc:  # an image name no kernelspec can carry
        error(str(exc))
        return 2
    return 0


def cmd_mcp(args) -> int:
    try:
        from ..agents import mcp_server
    except ImportError as exc:
        error(f"the MCP server needs the mcp extra: pip install 'sandbox-kernel[mcp]' ({exc})")
        return 1
    return mcp_server.main(args.transport, args.host, args.port, args.url, args.token, args.image, args.ttl_seconds,
                           scope=args.scope, reach=args.reach)


def unrunnable_kernelspecs() -> dict[str, str]:
    """The sandbox kernelspecs whose tier cannot run for this user's own server, with why
    (pip ships the gVisor one into every environment; an ordinary user's server has no
    gVisor)."""
    from kernel.install import TIERS, kernel_spec, tier_unavailable

    unrunnable = {}
    for isolation in TIERS:
        why = tier_unavailable(isolation, None)
        if why:
            name, spec = kernel_spec(isolation=isolation)
            unrunnable[name] = f"{spec['display_name']}: {why}"
    return unrunnable


def _offered_kernelspecs(hidden: dict[str, str]) -> list[str]:
    """JupyterLab's allow-list: every kernelspec it would find but the `hidden` ones (its
    allowed_kernelspecs is a list of names to keep; none given keeps all)."""
    if not hidden:
        return []
    from jupyter_client.kernelspec import KernelSpecManager

    offered = sorted(set(KernelSpecManager().find_kernel_specs()) - set(hidden))
    return [f"--KernelSpecManager.allowed_kernelspecs={name}" for name in offered]


def _lab_argv(args, hidden: dict[str, str]) -> list[str]:
    """JupyterLab's command line. Its kernels get CurveZMQ keys where pyzmq has them (the
    kernelspecs declare supported_encryption): their messages are encrypted on loopback
    TCP, and ipykernel's "Kernel is running over TCP without encryption" is not printed
    once per kernel. Kernelspecs that cannot run here (`hidden`) are not offered.
    Arguments after ``--`` come last, so they override these."""
    import zmq

    argv = [sys.executable, "-m", "jupyter", "lab", "--ip=127.0.0.1", f"--port={args.port}", "--no-browser"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    if zmq.has("curve"):
        argv.append("--MappingKernelManager.transport_encryption=auto")
    argv += _offered_kernelspecs(hidden)
    return argv + (args.lab_args[1:] if args.lab_args[:1] == ["--"] else args.lab_args)


def cmd_lab(args) -> int:
    """Install the kernelspecs into this environment, run JupyterLab, and when it exits stop
    the sandbox server its kernels started (not one that was already running)."""
    from kernel.install import TIERS, install_kernelspec, is_current, kernel_spec

    from ..service import housekeeping

    hidden = unrunnable_kernelspecs()
    for isolation in TIERS:  # pip normally ships them already; an older version's are replaced
        name, spec = kernel_spec(isolation=isolation)
        if name not in hidden and not is_current(
                os.path.join(sys.prefix, "share", "jupyter", "kernels", name, "kernel.json"), spec):
            install_kernelspec(user=False, sys_prefix=True, isolation=isolation)
    for why in hidden.values():
        print(f"not offered in JupyterLab: {why}", file=sys.stderr)
    state = state_of(args)
    env = dict(os.environ, SANDBOX_KERNEL_STATE_DIR=state.root)
    before = (housekeeping.running_server(state) or {}).get("pid")
    lab = subprocess.Popen(_lab_argv(args, hidden), env=env)
    # Ctrl-C reaches JupyterLab too (one process group), which asks or shuts down; we wait
    # for it. A SIGTERM sent to us alone is passed on.
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: lab.terminate())
    try:
        status = lab.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    server = housekeeping.running_server(state)
    if server is not None and server["pid"] != before and server.get("idle_stop_seconds"):
        print(f"stopping the sandbox server JupyterLab's kernels started (pid {server['pid']})", file=sys.stderr)
        try:
            housekeeping.stop_server(state)
        except (TimeoutError, housekeeping.AdminRefused) as exc:
            error(str(exc))
        live = housekeeping.live_sandboxes(state)
        if live:
            print(f"{len(live)} kept sandbox(es) run on until their TTL: {', '.join(sorted(live))} "
                  "(sandbox-kernel ls / rm --all)", file=sys.stderr)
    return status if status >= 0 else 128 - status


def register(sub) -> None:
    p = command(sub, "lab", "start JupyterLab with the sandbox kernels; stops the sandbox server it started on exit",
                """
        sandbox-kernel lab
        sandbox-kernel lab --port 9999 -- --ServerApp.token=secret""")
    p.add_argument("--port", type=int, default=8888)
    add_state_dir(p)
    p.add_argument("lab_args", nargs="...", help="after --: arguments for jupyter lab")
    p.set_defaults(func=cmd_lab)

    p = command(sub, "install", "install the Jupyter kernelspecs (one per isolation tier)", """
        sandbox-kernel install --user
        sandbox-kernel install --sys-prefix --image stats     # "Python (sandbox: stats)"
        sandbox-kernel install --prefix /opt/sandbox-kernel/hub --url unix:/var/lib/sandbox-kernel/server.sock \\
            --no-host-cells                                  # a shared host's (deploy/jupyterhub)""")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true")
    where.add_argument("--sys-prefix", action="store_true")
    where.add_argument("--prefix")
    p.add_argument("--image", help="install 'Python (sandbox: IMAGE)' for a custom image")
    from kernel.install import add_server_options

    add_server_options(p)
    p.set_defaults(func=cmd_install)

    p = command(sub, "mcp", "serve the sandboxes over the Model Context Protocol (stdio or HTTP)", """
        sandbox-kernel mcp
        SANDBOX_KERNEL_TOKEN=... sandbox-kernel mcp --transport http --port 8766""")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP: address to listen on")
    p.add_argument("--port", type=int, default=8766, help="HTTP: port (the endpoint is /mcp)")
    p.add_argument("--url", help="the sandbox server (default: SANDBOX_KERNEL_URL or the local one)")
    p.add_argument("--token", help="its token, also required of HTTP clients (default: SANDBOX_KERNEL_TOKEN or "
                                   "STATE/token)")
    p.add_argument("--image", help="image of the sandboxes it creates")
    p.add_argument("--ttl-seconds", type=int, help="idle TTL of the sandboxes it creates (default 1800)")
    p.add_argument("--scope", help="the label of the sandboxes it creates, and the only ones it may reach "
                                   "(default: a new one per start, mcp-XXXXXXXX)")
    p.add_argument("--reach", action="append", default=[], metavar="SCOPE",
                   help="also reach the sandboxes of this scope ('*': every sandbox the token reaches, the "
                        "user's notebooks too); repeatable")
    p.set_defaults(func=cmd_mcp)
