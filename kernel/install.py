"""Installing the kernelspec, so that Jupyter lists "Python (sandbox)".

    python -m kernel.install [--user | --sys-prefix | --prefix DIR] [--image NAME]

One kernelspec per image: `sandbox` runs the default image; `sandbox-NAME`,
"Python (sandbox: NAME)", runs image NAME (the spec sets SANDBOX_KERNEL_IMAGE), so that
choosing an image is choosing a kernel in the notebook's menu.

The spec's argv starts with the absolute path of the Python doing the install: Jupyter
may run in another environment, whose `python` does not have this package.
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


def kernel_spec(image: str | None = None, python: str | None = None) -> tuple[str, dict[str, t.Any]]:
    """The kernelspec name and kernel.json content for `image` (None: the default)."""
    spec = json.loads((RESOURCES / "kernel.json").read_text())
    spec["argv"][0] = python or sys.executable
    name = KERNEL_NAME
    if image and image != "default":
        if not _IMAGE_NAME.match(image):
            raise ValueError(f"invalid image name {image!r}: use letters, digits, '.', '_' and '-'")
        name = f"{KERNEL_NAME}-{image.lower()}"
        spec["display_name"] = f"{DISPLAY_NAME[:-1]}: {image})"
        spec.setdefault("env", {})["SANDBOX_KERNEL_IMAGE"] = image
    return name, spec


def install_kernelspec(
    user: bool = True,
    sys_prefix: bool = False,
    prefix: str | None = None,
    image: str | None = None,
) -> str:
    """Install the kernelspec and return the directory it went to.

    `sys_prefix` installs into this environment (`sys.prefix`), `prefix` into another
    prefix; either one overrides `user`.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    name, spec = kernel_spec(image)
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


def main(argv: t.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sandbox-kernel install", description="Install the Python (sandbox) kernelspec."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user (the default)")
    where.add_argument("--sys-prefix", action="store_true", help="install into this Python environment")
    where.add_argument("--prefix", help="install into the given prefix (e.g. another environment)")
    parser.add_argument("--image", help="make a kernel for this sandbox image: sandbox-NAME")
    args = parser.parse_args(argv)
    try:
        path = install_kernelspec(
            user=not (args.sys_prefix or args.prefix), sys_prefix=args.sys_prefix, prefix=args.prefix, image=args.image
        )
    except ValueError as exc:
        parser.error(str(exc))
    name, spec = kernel_spec(args.image)
    print(f"installed kernelspec {name!r} ({spec['display_name']}) in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
