"""Images to and from an OCI registry, with skopeo: the layout ``oci.py`` writes, copied as it is.

The registry setting (``image_registry``) is ``host[:port]`` for a registry over HTTPS,
its certificate verified, or ``http://host[:port]`` for one over plain HTTP (a registry on a
closed network, or a test's on loopback). Plain HTTP gives up only confidentiality: a pull
names the manifest by its digest, skopeo checks every blob against it, and ``oci.py`` checks
them again before anything is imported, so a registry or a path that alters an image gets
a refusal, not an image. Copies keep digests (``--preserve-digests``): the digest a push
reports is the one a pull by digest asks for.

An image ``NAME`` is the repository ``sandbox-kernel/NAME`` with the tag ``latest``, and a
node records the digest of each image it pushed or pulled (``images/.digests.json``), which
its ``/v1/info`` lists, so that a gateway can have another node pull exactly that image.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from contextlib import contextmanager

from ..common import statefile
from . import oci
from .images import ImageStore

SKOPEO = "skopeo"
REPOSITORY = "sandbox-kernel"
TAG = "latest"
REGISTRY_RE = re.compile(r"^(http://)?([A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(:\d{1,5})?$")
TIMEOUT = 1800


class RegistryError(oci.OciError):
    """A push or pull that failed, with skopeo's own words."""


def parse(registry: str) -> tuple[str, bool]:
    """(host[:port], whether TLS is verified) of a registry setting; RegistryError if malformed."""
    match = REGISTRY_RE.match((registry or "").strip())
    if not match:
        raise RegistryError(f"the image registry {registry!r} is not host[:port] (HTTPS) or http://host[:port]"
                            " (plain HTTP)")
    return match.group(2) + (match.group(3) or ""), match.group(1) is None


def reference(registry: str, name: str, digest: str | None = None) -> str:
    host, _ = parse(registry)
    return f"docker://{host}/{REPOSITORY}/{name}" + (f"@{digest}" if digest else f":{TAG}")


def _skopeo(args: list[str]) -> None:
    if shutil.which(SKOPEO) is None:
        raise RegistryError("skopeo is not installed (Debian: apt-get install skopeo); it moves images to and from "
                            "registries", code="unavailable")
    try:
        proc = subprocess.run([SKOPEO, "--insecure-policy", *args], capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RegistryError(f"skopeo did not finish in {TIMEOUT} s", code="unavailable") from None
    if proc.returncode != 0:
        said = " | ".join(line.strip() for line in proc.stderr.strip().splitlines()[-3:]) or f"exit {proc.returncode}"
        raise RegistryError(f"skopeo {args[0]} failed: {said}", code="registry_failed")


def push(store: ImageStore, name: str, registry: str) -> str:
    """Push image ``name`` to the registry; the manifest's digest (recorded)."""
    _, verify = parse(registry)
    with tempfile.TemporaryDirectory(prefix=".push-", dir=store.state.images) as layout:
        digest = oci.export_layout(store, name, layout, TAG)
        digest_file = os.path.join(layout, "pushed.digest")
        _skopeo(["copy", "--preserve-digests", f"--dest-tls-verify={str(verify).lower()}", "--digestfile", digest_file,
                 f"oci:{layout}:{TAG}", reference(registry, name)])
        with open(digest_file) as f:
            pushed = f.read().strip()
    if pushed != digest:
        raise RegistryError(f"the registry stored image {name!r} as {pushed}, not as written ({digest})")
    record(store, name, digest)
    return digest


def pull(store: ImageStore, name: str, registry: str, digest: str | None = None) -> tuple[dict, str]:
    """Pull image ``name`` (exactly ``digest`` when given, else its latest) and import it,
    every blob verified; (its image.json, the manifest's digest). Nothing is imported when
    a blob does not match."""
    _, verify = parse(registry)
    if digest and not oci.DIGEST_RE.match(digest):
        raise RegistryError(f"{digest!r} is not a sha256 digest (sha256: and 64 hex digits)")
    os.makedirs(store.state.images, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=store.state.images) as layout:
        _skopeo(["copy", "--preserve-digests", f"--src-tls-verify={str(verify).lower()}",
                 reference(registry, name, digest), f"oci:{layout}:{TAG}"])
        info, got = oci.import_layout(store, layout, tag=TAG, digest=digest, name=name)
    record(store, name, got)
    return info, got


# ------------------------------------------------------------------ digests
def _digests_path(store: ImageStore) -> str:
    return os.path.join(store.state.images, ".digests.json")


@contextmanager
def _digests_lock(store: ImageStore):
    with open(os.path.join(store.state.images, ".digests.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def record(store: ImageStore, name: str, digest: str) -> None:
    with _digests_lock(store):
        digests = statefile.read_json(_digests_path(store)) or {}
        digests[name] = {"digest": digest, "hash": (store.get(name) or {}).get("hash")}
        statefile.write_json(_digests_path(store), digests, mode=0o644)


def digests(store: ImageStore) -> dict[str, str]:
    """{image name: the digest it was pushed or pulled as}, for the images still here as
    they were then (one removed and built again from another recipe is not that digest)."""
    recorded = statefile.read_json(_digests_path(store)) or {}
    return {name: entry["digest"] for name, entry in recorded.items()
            if isinstance(entry, dict) and entry.get("hash") == (store.get(name) or {}).get("hash", object())}
