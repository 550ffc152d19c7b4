"""Setting isolation layers aside, for tests only: the one way to do it, and its guards.

Each protection must be shown to hold on its own, yet layers hide each other: with seccomp
refusing every network socket, a sandbox that lost its network namespace still cannot
connect, so no service test notices the namespace is gone. The layer tests
(tests/service/test_svc_layers.py) therefore run servers with one layer set aside and
prove the other alone.

Nothing here may ever be switched on by accident in production, so it takes two things
that say the same:

- the traitlet ``ServiceConfig.unsafe_test_only_layers_off`` (hidden ``serve`` flag
  ``--unsafe-test-only-layers-off LAYER,...``), and
- the environment variable ``SANDBOX_KERNEL_UNSAFE_TEST_ONLY_LAYERS_OFF`` naming the
  same layers.

Without the variable ``serve`` refuses to start (``--allow-missing-protections`` does
not help). With it, ``doctor``, ``/v1/info`` and ``serve``'s start-up report each layer
as *missing*, so ``serve`` also needs ``--allow-missing-protections``, and every
sandbox's ``isolation`` says what it lacks. Seccomp has its own (older) switch,
``--no-seccomp``, reported the same way.
"""

from __future__ import annotations

import os

ENV = "SANDBOX_KERNEL_UNSAFE_TEST_ONLY_LAYERS_OFF"

# layer -> what a sandbox lacks when it is set aside
LAYERS = {
    "network": "the sandboxes share the host's network namespace",
    "pid": "the sandboxes share the host's pid namespace and see the host's /proc",
    "sandboxes_dir": f"the host's sandboxes directory (every sandbox's workspace) is mounted read-only at {{mount}}",
}
SANDBOXES_MOUNT = "/tmp/host-sandboxes"  # in the sandbox's own /tmp: a read-only root needs no point for it


def parse(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """Layer names from a comma-separated string or a list; unknown names are an error."""
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = sorted({item.strip() for item in items if item.strip()})
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        raise ValueError(f"unknown isolation layer(s) {', '.join(unknown)}; known: {', '.join(LAYERS)}")
    return names


def requested(config) -> list[str]:
    return parse(getattr(config, "unsafe_test_only_layers_off", None))


def confirmed(layers: list[str]) -> bool:
    """The environment names exactly the same layers."""
    try:
        return bool(layers) and parse(os.environ.get(ENV)) == layers
    except ValueError:
        return False


def honoured(config) -> list[str]:
    """The layers a server sets aside: those requested and confirmed, else none."""
    layers = requested(config)
    return layers if confirmed(layers) else []


def refusal(config) -> str | None:
    """Why ``serve`` must not start (layers requested without the confirming variable)."""
    layers = requested(config)
    if layers and not confirmed(layers):
        return (f"refusing to start: --unsafe-test-only-layers-off {','.join(layers)} sets isolation layers "
                f"aside and is for tests only; it is honoured only with {ENV}={','.join(layers)} "
                "in the environment")
    return None


def doctor_items(config) -> list[tuple[str, str, bool]]:
    """(name, detail, missing) for doctor: each layer set aside (missing), a request that
    serve will refuse, or the confirming variable lying around in an environment."""
    layers = requested(config)
    if not layers:
        if os.environ.get(ENV):
            return [("test-only variable", f"{ENV} is set in this environment: a server started here with "
                     "--unsafe-test-only-layers-off would set isolation layers aside; unset it outside tests", False)]
        return []
    if not confirmed(layers):
        return [("test-only layers off", f"requested ({','.join(layers)}) without {ENV}: serve refuses to start", True)]
    return [(f"{layer} (SET ASIDE FOR TESTS)", LAYERS[layer].format(mount=SANDBOXES_MOUNT) +
             f" ({ENV}; never in production)", True) for layer in layers]


def set_aside(argv: list[str], spec: dict) -> list[str]:
    """bwrap's options with the spec's test-only layers removed (none in production)."""
    layers = set(spec.get("unsafe_test_only_layers_off") or ())
    if not layers:
        return argv
    out = list(argv)
    if "network" in layers:
        out.remove("--unshare-net")
    if "pid" in layers:
        out.remove("--unshare-pid")
        # A new procfs needs a pid namespace of the sandbox's own: show the host's instead.
        i = out.index("--proc")
        out[i:i + 2] = ["--ro-bind", "/proc", "/proc"]
    if "sandboxes_dir" in layers:
        i = next(i for i in range(len(out) - 2) if out[i] == "--bind" and out[i + 2] == "/workspace")  # after /tmp
        sandboxes = os.path.dirname(os.path.dirname(os.path.normpath(spec["workspace"])))
        out[i:i] = ["--ro-bind", sandboxes, SANDBOXES_MOUNT]
    return out


def isolation_notes(spec: dict) -> dict:
    """What a sandbox's ``isolation`` says of the layers it lacks."""
    layers = list(spec.get("unsafe_test_only_layers_off") or ())
    if not layers:
        return {}
    notes: dict = {"unsafe_test_only_layers_off": layers}
    if "network" in layers:
        notes["network"] = "SHARED WITH THE HOST (test-only setting)"
    return notes
