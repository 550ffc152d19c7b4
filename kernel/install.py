"""Installing the kernelspecs, so that Jupyter lists "Python (sandbox)" and "Python (sandbox, gVisor)".

    python -m kernel.install [--user | --sys-prefix | --prefix DIR] [--image NAME]

One kernelspec per image and isolation tier, so that choosing either is choosing a kernel
in the notebook's menu. `sandbox` runs the default image on the server's default
isolation; `sandbox-NAME`, "Python (sandbox: NAME)", runs image NAME (the spec sets
SANDBOX_KERNEL_IMAGE); `sandbox-gvisor`, "Python (sandbox, gVisor)", creates its sandbox
with isolation gvisor (the spec's argv sets `--SandboxKernel.isolation=gvisor`: the same
kernel, configured). `TIERS` is the one list of tiers: the install commands install one
kernelspec per entry, and the copies pip ships (kernelspec/, kernelspec/gvisor/) are
checked against it by a unit test.

The spec's argv starts with the absolute path of the Python doing the install: Jupyter
may run in another environment, whose `python` does not have this package. Then `-P`: the
kernel runs in the notebook's folder, where `%pull` writes files a sandbox chose, and that
folder must never be on its `sys.path` (kernel/safe_path.py).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil
import sys
import tempfile
import typing as t

RESOURCES = pathlib.Path(__file__).parent / "resources"
KERNEL_NAME = "sandbox"
DISPLAY_NAME = "Python (sandbox)"
_IMAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: The isolation tiers with a kernelspec of their own: the kernel's `isolation` setting
#: (None: the server's default) -> what the display name adds.
TIERS: dict[str | None, str] = {None: "", "gvisor": "gVisor"}


def kernel_spec(image: str | None = None, python: str | None = None,
                isolation: str | None = None, url: str | None = None,
                host_cells: bool = True) -> tuple[str, dict[str, t.Any]]:
    """The kernelspec name and kernel.json content for `image` (None: the default) on the
    isolation tier `isolation` (a key of TIERS).

    `url` pins the kernel to one server (a shared host's system server: the spec, not each
    user's environment, says where sandboxes live); `host_cells=False` turns `%%host` off in
    the spec, the default a shared host wants (a host cell runs as the user, beside others)."""
    if isolation not in TIERS:
        raise ValueError(f"no kernelspec tier {isolation!r} (known: {', '.join(k for k in TIERS if k)})")
    spec = json.loads((RESOURCES / "kernel.json").read_text())
    spec["argv"][0] = python or sys.executable
    name, label = KERNEL_NAME, ""
    if image and image != "default":
        if not _IMAGE_NAME.match(image):
            raise ValueError(f"invalid image name {image!r}: use letters, digits, '.', '_' and '-'")
        name = f"{KERNEL_NAME}-{image.lower()}"
        label = f": {image}"
        spec.setdefault("env", {})["SANDBOX_KERNEL_IMAGE"] = image
    if isolation:
        name = f"{name}-{isolation}"
        label += f", {TIERS[isolation]}"
        spec["argv"].append(f"--SandboxKernel.isolation={isolation}")
    if url:
        spec.setdefault("env", {})["SANDBOX_KERNEL_URL"] = url
    if not host_cells:
        spec.setdefault("env", {})["SANDBOX_KERNEL_HOST_CELLS"] = "0"
    spec["display_name"] = f"{DISPLAY_NAME[:-1]}{label})"
    return name, spec


def is_current(kernel_json: str, spec: dict[str, t.Any]) -> bool:
    """Whether the kernel.json at ``kernel_json`` is ``spec`` but for the interpreter that
    runs it (pip ships ``python``, an install writes its absolute path): an older
    version's copy (say, one without today's metadata) is not, nor a missing file."""
    try:
        with open(kernel_json) as f:
            installed = json.load(f)
    except (OSError, ValueError):
        return False
    strip = lambda s: {**s, "argv": s.get("argv", [])[1:]}  # noqa: E731
    return strip(installed) == strip(spec)


def install_kernelspec(
    user: bool = True,
    sys_prefix: bool = False,
    prefix: str | None = None,
    image: str | None = None,
    isolation: str | None = None,
    url: str | None = None,
    host_cells: bool = True,
) -> str:
    """Install the kernelspec of `image` on tier `isolation` and return the directory it went to.

    `sys_prefix` installs into this environment (`sys.prefix`), `prefix` into another
    prefix; either one overrides `user`.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    name, spec = kernel_spec(image, isolation=isolation, url=url, host_cells=host_cells)
    if sys_prefix:
        prefix = sys.prefix
    if prefix is not None:
        user = False
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / name
        source.mkdir()
        for logo in RESOURCES.glob("logo-*.png"):
            shutil.copy(logo, source / logo.name)
        (source / "kernel.json").write_text(json.dumps(spec, indent=2) + "\n")
        return KernelSpecManager().install_kernel_spec(str(source), name, user=user, prefix=prefix)


def tier_unavailable(isolation: str | None, url: str | None) -> str | None:
    """Why the kernels of tier `isolation` cannot run on the server they would use, or None.
    Only this user's own server is judged (no `url`: the one the kernel starts, as this
    user): a kernelspec pinned to another server is that server's to refuse, with a first
    cell that names the kernel to use instead."""
    if isolation != "gvisor" or url:
        return None
    from sandbox.isolation import gvisor

    ok, why = gvisor.available()
    return None if ok else why


def install_kernelspecs(user: bool = True, sys_prefix: bool = False, prefix: str | None = None,
                        image: str | None = None, progress: t.Callable[[str], None] = print,
                        url: str | None = None, host_cells: bool = True) -> list[str]:
    """Install the kernelspec of `image` for every tier that can run here (a tier that
    cannot is said, and left out: its first cell would only fail); the directories they
    went to."""
    paths = []
    for isolation in TIERS:
        why = tier_unavailable(isolation, url)
        if why:
            name, spec = kernel_spec(image, isolation=isolation)
            progress(f"not installed: kernelspec {name!r} ({spec['display_name']}): {why}; "
                     f"use {kernel_spec(image)[1]['display_name']!r}")
            continue
        path = install_kernelspec(user=user, sys_prefix=sys_prefix, prefix=prefix, image=image, isolation=isolation,
                                  url=url, host_cells=host_cells)
        name, spec = kernel_spec(image, isolation=isolation, url=url, host_cells=host_cells)
        progress(f"installed kernelspec {name!r} ({spec['display_name']}) in {path}")
        paths.append(path)
    return paths


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """`--url` and `--no-host-cells`: what a shared host's kernelspecs pin (one definition,
    for `python -m kernel.install` and `sandbox-kernel install`)."""
    parser.add_argument("--url", help="the kernels' server, e.g. unix:/var/lib/sandbox-kernel/server.sock (a shared "
                                      "host's system server); default: each user's own")
    parser.add_argument("--no-host-cells", action="store_true",
                        help="turn %%%%host cells off in the kernelspecs (SANDBOX_KERNEL_HOST_CELLS=0), as a shared "
                             "host should")


def main(argv: t.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sandbox-kernel install", description="Install the Python (sandbox) kernelspecs, one per isolation tier."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user (the default)")
    where.add_argument("--sys-prefix", action="store_true", help="install into this Python environment")
    where.add_argument("--prefix", help="install into the given prefix (e.g. another environment)")
    parser.add_argument("--image", help="make a kernel for this sandbox image: sandbox-NAME")
    add_server_options(parser)
    args = parser.parse_args(argv)
    try:
        install_kernelspecs(
            user=not (args.sys_prefix or args.prefix), sys_prefix=args.sys_prefix, prefix=args.prefix, image=args.image,
            url=args.url, host_cells=not args.no_host_cells,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
