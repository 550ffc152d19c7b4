"""``image build | ls | inspect | rm``: the images of a state directory."""

from __future__ import annotations

import json
import sys

from . import human
from .common import add_state_dir, command, error, server, state_of, transport


def _store(args):
    from ..images.images import ImageStore

    state = state_of(args)
    state.ensure()
    return ImageStore(state)


def cmd_image_build(args) -> int:
    from ..images.images import DEFAULT_IMAGE, ImageError
    from ..images.progress import BuildProgress

    requirements = None
    if args.requirements:
        try:
            with open(args.requirements) as f:
                requirements = f.read()
        except OSError as exc:
            error(f"cannot read --requirements {args.requirements}: {exc.strerror} (give a pip requirements file)")
            return 2
    preload = args.preload.split(",") if args.preload is not None else None
    try:
        with BuildProgress(sys.stderr) as progress:
            info = _store(args).build(args.name or DEFAULT_IMAGE, pip=args.pip or [], requirements=requirements,
                                      preload=preload, apt=args.apt or [], npm=args.npm or [],
                                      root=args.root, base=args.base, progress=progress)
    except ImageError as exc:
        error(str(exc))
        return 1
    print(f"image {info['name']}: {len(info['packages'])} packages, {human.size(info['size_bytes'])}")
    return 0


def cmd_image_ls(args) -> int:
    images = _store(args).list()
    if not images:
        print("no images yet: sandbox-kernel image build", file=sys.stderr)
        return 0
    rows = [[i["name"], human.size(i["size_bytes"]), human.relative(i["built_at"]),
             ", ".join((i.get("apt") or []) + (i.get("npm") or []) + i["pip"]) + (f" on {i['base']}" if i.get("root") else "")
             if i.get("base") else
             f"{len(i.get('package_list') or i['packages'])} packages" + (", own Debian root" if i.get("root") else "")]
            for i in images]
    print(human.table(["NAME", "SIZE", "BUILT", "PACKAGES"], rows, right={1}))
    return 0


def cmd_image_inspect(args) -> int:
    """One image's recipe and package list (name, version, layer, source), as a table or
    JSON; --sbom FILE writes its CycloneDX SBOM."""
    from ..images import image_packages

    info = _store(args).get(args.name)
    if info is None:
        error(f"no image named {args.name!r} (sandbox-kernel image ls lists them)")
        return 1
    packages = image_packages.package_list(info)
    if args.sbom:  # the file is what was asked for: one line says where it went, no table unless --format
        try:
            with open(args.sbom, "w") as f:
                f.write(image_packages.sbom(info))
        except OSError as exc:
            error(f"cannot write the SBOM to {args.sbom}: {exc.strerror} (choose another path)")
            return 1
        print(f"wrote the CycloneDX SBOM of image {args.name} ({len(packages)} packages) to {args.sbom}",
              file=sys.stderr)
        if args.format is None:
            return 0
    if args.format == "json":
        fields = ("name", "base", "root", "apt", "npm", "pip", "preload", "built_at", "size_bytes", "python_version",
                  "hash")
        print(json.dumps({k: info.get(k) for k in fields} | {"package_list": packages}, indent=1))
        return 0
    print(f"image {info['name']}: built {info['built_at']}, {len(packages)} packages"
          + (f", on {info['base']}" if info.get("base") else "") + f", Python {info.get('python_version')}")
    print(human.table(["NAME", "VERSION", "LAYER", "SOURCE"],
                      [[p["name"], p["version"], p.get("layer") or "-", p.get("source") or "-"] for p in packages]))
    return 0


def cmd_image_rm(args) -> int:
    """Removed by the state directory's server, which knows which images its sandboxes use
    (and ends the warm pool's sandboxes of that image). Sandboxes outlive their server, so
    when it cannot be asked the removal is refused; --force removes the files regardless."""
    from ..client import ServerUnavailable
    from ..images.images import ImageError

    config = server(args)
    if config is None:
        return 1
    with transport(config) as tr:
        try:
            tr.request("DELETE", f"/v1/images/{args.name}")
        except ServerUnavailable as exc:
            if not args.force:
                error(f"not removing image {args.name!r}: no server answers at {config.where} to say whether a "
                      "sandbox uses it (sandboxes outlive their server); start it (sandbox-kernel serve), or pass "
                      "--force to remove it anyway")
                return 1
            try:
                _store(args).remove(args.name, lambda name: 0)
            except ImageError as err:
                error(f"{err} (sandbox-kernel image ls lists them)")
                return 1
            print(f"removed image {args.name} (--force: no server was asked whether a sandbox uses it)")
            return 0
        except Exception as exc:  # SandboxError: 404, 409, 401, ...
            error(str(exc))
            return 1
    print(f"removed image {args.name}")
    return 0


def cmd_image_push(args) -> int:
    """Push an image of the state directory to a registry; print the digest to pull it by."""
    from ..images import registry
    from ..images.oci import OciError

    try:
        digest = registry.push(_store(args), args.name, args.registry)
    except OciError as exc:
        error(str(exc))
        return 1
    print(f"pushed image {args.name} to {registry.reference(args.registry, args.name)} as {digest}")
    print(digest)
    return 0


def cmd_image_pull(args) -> int:
    """Pull an image into the state directory, every blob verified (by --digest: exactly that one)."""
    from ..images import registry
    from ..images.oci import OciError

    try:
        info, digest = registry.pull(_store(args), args.name, args.registry, args.digest)
    except OciError as exc:
        error(str(exc))
        return 1
    print(f"pulled image {info['name']} ({digest}) from {registry.reference(args.registry, args.name, digest)}")
    return 0


def register(sub) -> None:
    image = command(sub, "image", "build, list, inspect and remove images", """
        sandbox-kernel image build                      # the default image
        sandbox-kernel image build datascience          # a shipped recipe
        sandbox-kernel image build stats --pip scipy statsmodels
        sandbox-kernel image ls
        sandbox-kernel image push stats --registry registry.example:5000""")
    isub = image.add_subparsers(dest="image_command", required=True, metavar="{build,ls,inspect,rm,push,pull}")
    p = command(isub, "build", "build the default image, a shipped recipe (datascience), or a named one with "
                               "extra packages", """
        sandbox-kernel image build
        sandbox-kernel image build stats --pip scipy statsmodels --preload scipy
        sandbox-kernel image build ml --requirements requirements.txt
        sandbox-kernel image build poly --apt nodejs npm gcc libc6-dev --npm typescript --pip polars
        sandbox-kernel image build node-jq --base nodejs --apt jq""")
    p.add_argument("name", nargs="?")
    p.add_argument("--pip", nargs="+", metavar="PKG")
    p.add_argument("--requirements", metavar="FILE")
    p.add_argument("--preload", help="comma-separated modules imported ahead in warm sandboxes")
    p.add_argument("--apt", nargs="+", metavar="PKG", help="Debian packages: the image gets a Debian root of its own")
    p.add_argument("--npm", nargs="+", metavar="PKG", help="npm packages, installed by the image's own npm")
    p.add_argument("--root", choices=["debian"], help="a Debian root of its own even without --apt/--npm")
    p.add_argument("--base", metavar="IMAGE", help="add the packages to IMAGE, an image on a root of its own, "
                   "without rebuilding it (its root is shared)")
    add_state_dir(p)
    p.set_defaults(func=cmd_image_build)
    p = command(isub, "ls", "list images", "sandbox-kernel image ls")
    add_state_dir(p)
    p.set_defaults(func=cmd_image_ls)
    p = command(isub, "inspect", "an image's packages: name, version, layer, where each came from", """
        sandbox-kernel image inspect default
        sandbox-kernel image inspect default --format json
        sandbox-kernel image inspect default --sbom default.cdx.json""")
    p.add_argument("name")
    p.add_argument("--format", choices=["table", "json"], help="table (the default) or json; with --sbom, "
                   "also print the list in this format")
    p.add_argument("--sbom", metavar="FILE", help="write the image's CycloneDX SBOM (JSON) to FILE, saying where")
    add_state_dir(p)
    p.set_defaults(func=cmd_image_inspect)
    p = command(isub, "rm", "remove an image no sandbox uses (asks the state directory's server)",
                "sandbox-kernel image rm stats")
    p.add_argument("name")
    add_state_dir(p)
    p.add_argument("--url", help="the server to ask (default: the state directory's socket)")
    p.add_argument("--force", action="store_true",
                   help="remove the files even when no server can say whether a sandbox uses the image")
    p.set_defaults(func=cmd_image_rm)
    for verb, what, example in (
            ("push", "push an image to an OCI registry (skopeo); prints its digest",
             "sandbox-kernel image push stats --registry registry.example:5000"),
            ("pull", "pull an image from an OCI registry, every blob verified by digest",
             "sandbox-kernel image pull stats --registry registry.example:5000 --digest sha256:...")):
        p = command(isub, verb, what, example)
        p.add_argument("name")
        p.add_argument("--registry", required=True, metavar="HOST[:PORT]",
                       help="the registry: host[:port] over HTTPS, or http://host[:port] for plain HTTP")
        if verb == "pull":
            p.add_argument("--digest", metavar="sha256:HEX", help="pull exactly this manifest (as push printed it)")
        add_state_dir(p)
        p.set_defaults(func=cmd_image_push if verb == "push" else cmd_image_pull)
