"""An image as an OCI image layout, and back: the format registries and their tools move.

The layout is written here directly, per the OCI image spec (image-layout, manifest,
config), not with ``umoci``: an image is not a container root filesystem but a directory
of this project's (``images.py``), so there is nothing for umoci to add, and the import
side must check every digest itself anyway, before a byte of the layer reaches the image
store. The tests read what is written here with umoci, as an outside check of the format.

The image directory is treated as an opaque tree: the one layer is that tree (gzip'd tar,
entries sorted, times kept, owners root), the config names the image, its recipe hash and
the images directory it came from.
The only thing an import changes in the tree is the host paths that ``image.json`` names
under the source node's images directory, which become this node's: the trees an image
names elsewhere (its base image's) must exist here already, or the import is refused.

An import verifies each blob's size and sha256 (the manifest's, optionally against the
digest the caller asked for; the config's; the layer's, compressed and uncompressed) and
extracts into a hidden directory that becomes the image only once everything checked, so a
tampered layout leaves nothing behind.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tarfile
import typing as t

from .images import NAME_RE, ImageError, ImageStore

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
LABEL = "io.sandbox-kernel.image"  # the labels' and annotations' prefix: .name, .hash, .images-dir
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
CHUNK = 1 << 20
# gzip's fastest level: the default image is ~800 MiB of tree (its venv and the venv's ext4
# pack) and level 9 took minutes of one core on a loaded host; registries sit on fast
# networks, where a smaller layer would not win that time back.
COMPRESS_LEVEL = 1


class OciError(ImageError):
    """A layout that cannot be written or taken in, with what is wrong with it."""


class _Hashing:
    """A file object that hashes and counts what is written through it."""

    def __init__(self, sink: t.BinaryIO):
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.sink.write(data)

    def flush(self) -> None:
        self.sink.flush()

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


def _blob_path(layout: str, digest: str) -> str:
    if not DIGEST_RE.match(digest or ""):
        raise OciError(f"{digest!r} is not a sha256 digest")
    return os.path.join(layout, "blobs", "sha256", digest.split(":", 1)[1])


def _put_json(layout: str, document: dict) -> dict:
    """Store a JSON blob; its descriptor (size and digest)."""
    data = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(_blob_path(layout, digest), "wb") as f:
        f.write(data)
    return {"digest": digest, "size": len(data)}


def _tar_tree(tree: str, archive: tarfile.TarFile) -> None:
    """The tree, sorted, owned by root; a mount inside it (an image pack's loop mount) is
    not part of it: its mount point goes in empty."""
    for root, dirs, files in os.walk(tree):
        dirs.sort()
        rel_root = os.path.relpath(root, tree)
        for name in dirs + sorted(files):
            path = os.path.join(root, name)
            info = archive.gettarinfo(path, os.path.normpath(os.path.join(rel_root, name)))
            if info is None:  # a socket: nothing an image holds
                continue
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(path, "rb") as f:
                    archive.addfile(info, f)
            else:
                archive.addfile(info)
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(root, d))
                   and not os.path.islink(os.path.join(root, d))]


def export_layout(store: ImageStore, name: str, layout: str, tag: str = "latest") -> str:
    """Write image ``name`` as an OCI image layout at ``layout`` (a new or empty directory),
    its manifest under ``tag``; the manifest's digest."""
    info = store.get(name)
    if info is None:
        raise OciError(f"no image named {name!r}", code="not_found")
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    staging = os.path.join(layout, "blobs", f".layer-{secrets.token_hex(4)}")
    with open(staging, "wb") as raw:
        packed = _Hashing(raw)
        with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0, compresslevel=COMPRESS_LEVEL) as zipped:
            plain = _Hashing(zipped)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as archive:
                _tar_tree(store.path(name), archive)
    layer = {"mediaType": LAYER, "digest": packed.digest, "size": packed.size}
    os.rename(staging, _blob_path(layout, layer["digest"]))
    labels = {f"{LABEL}.name": name, f"{LABEL}.hash": info.get("hash") or "",
              f"{LABEL}.images-dir": store.state.images}
    config = _put_json(layout, {
        "architecture": "amd64", "os": "linux", "created": info.get("built_at"),
        "config": {"Labels": labels}, "rootfs": {"type": "layers", "diff_ids": [plain.digest]},
    }) | {"mediaType": CONFIG}
    annotations = {f"{LABEL}.name": name, f"{LABEL}.hash": info.get("hash") or ""}
    manifest = _put_json(layout, {"schemaVersion": 2, "mediaType": MANIFEST, "config": config, "layers": [layer],
                                  "annotations": annotations}) | {"mediaType": MANIFEST}
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": INDEX,
                   "manifests": [manifest | {"annotations": {REF_NAME: tag, **annotations}}]}, f)
    return manifest["digest"]


# ------------------------------------------------------------------ import
def _verified(layout: str, descriptor: dict, what: str) -> str:
    """The path of a blob whose size and sha256 are the descriptor's; else OciError."""
    digest, size = descriptor.get("digest"), descriptor.get("size")
    path = _blob_path(layout, digest)
    sha, seen = hashlib.sha256(), 0
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                sha.update(chunk)
                seen += len(chunk)
    except FileNotFoundError:
        raise OciError(f"the {what} blob {digest} is missing from the layout") from None
    if "sha256:" + sha.hexdigest() != digest or seen != size:
        raise OciError(f"the {what} blob does not match its digest: {digest} ({size} bytes) was expected, "
                       f"sha256:{sha.hexdigest()} ({seen} bytes) is there; nothing was imported", code="digest_mismatch")
    return path


def _json_blob(layout: str, descriptor: dict, what: str) -> dict:
    with open(_verified(layout, descriptor, what), "rb") as f:
        try:
            document = json.load(f)
        except ValueError as exc:
            raise OciError(f"the {what} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OciError(f"the {what} is not a JSON object")
    return document


def _manifest_descriptor(layout: str, tag: str | None, digest: str | None) -> dict:
    try:
        with open(os.path.join(layout, "index.json")) as f:
            index = json.load(f)
    except (OSError, ValueError) as exc:
        raise OciError(f"{layout} is not an OCI image layout (index.json: {exc})") from None
    manifests = [m for m in index.get("manifests") or [] if isinstance(m, dict) and m.get("mediaType", MANIFEST) == MANIFEST]
    if digest:
        manifests = [m for m in manifests if m.get("digest") == digest]
    elif tag:
        manifests = [m for m in manifests if (m.get("annotations") or {}).get(REF_NAME) == tag]
    if len(manifests) != 1:
        wanted = digest or (f"tag {tag!r}" if tag else "one image")
        raise OciError(f"the layout holds {len(manifests)} manifest(s) for {wanted}", code="not_found")
    return manifests[0]


def _owned_by_root(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """tarfile's "tar" filter (no absolute or escaping names, no setuid bits; links
    checked against the destination) with every owner root, so a layer cannot hand a file
    of the image to a sandbox uid; devices and fifos skipped (`_special`)."""
    if _special(member):
        return None  # skipped
    member = tarfile.tar_filter(member, path)
    return member.replace(uid=0, gid=0, uname="root", gname="root", deep=False)


def _inside(root: str, path: str, what: str) -> None:
    if os.path.commonpath([root, path]) != root:
        raise tarfile.TarError(f"{what} would be outside the image")


def _special(member: tarfile.TarInfo) -> bool:
    """A device or a fifo: never unpacked (the "tar" filter would let them through; a
    Debian root holds /dev/null and the like). A sandbox's /dev is its own, made by
    bubblewrap or gVisor, so an image needs none."""
    return member.ischr() or member.isblk() or member.isfifo()


def _checked_by_hand(member: tarfile.TarInfo, root: str) -> tarfile.TarInfo | None:
    """What tarfile's "tar" filter does, for a Python whose tarfile has no extraction
    filters (before 3.11.4: Debian 12's python3 is 3.11.2, where setting
    ``extraction_filter`` does nothing, so a layer's ``../`` name would be written outside
    the image): leading slashes stripped; no name that lands outside the image, symlinks
    followed (so nothing is written through a link out of it); no hard link to outside it;
    no setuid, setgid or sticky bit, no write for group or others; and, as `_owned_by_root`,
    every owner root and no device file (None: skipped). ``root``: the image's directory,
    its real path."""
    if _special(member):
        return None
    member.name = member.name.lstrip("/" + os.sep)
    if os.path.isabs(member.name):
        raise tarfile.TarError(f"{member.name!r} is an absolute path")
    _inside(root, os.path.realpath(os.path.join(root, member.name)), repr(member.name))
    if member.islnk():
        _inside(root, os.path.realpath(os.path.join(root, member.linkname)), f"the hard link {member.name!r}")
    member.mode &= ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH)
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    return member


def _extract_all(archive: tarfile.TarFile, dest: str) -> None:
    if hasattr(tarfile, "tar_filter"):
        archive.extraction_filter = _owned_by_root
        archive.extractall(dest, numeric_owner=True)
        return
    root = os.path.realpath(dest)  # once: every member is checked against it
    for member in archive:  # one at a time, each checked before it is written
        checked = _checked_by_hand(member, root)
        if checked is not None:
            archive.extract(checked, dest, numeric_owner=True)


def _extract(layer_path: str, diff_id: str, dest: str) -> None:
    sha = hashlib.sha256()

    class Tee:  # the uncompressed stream, hashed as tarfile reads it
        def __init__(self, inner):
            self.inner = inner

        def read(self, n: int = -1) -> bytes:
            data = self.inner.read(n)
            sha.update(data)
            return data

    try:
        with gzip.open(layer_path, "rb") as unzipped:
            stream = Tee(unzipped)
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                _extract_all(archive, dest)
            while stream.read(CHUNK):  # the tar's trailing padding counts too
                pass
    except (tarfile.TarError, OSError, EOFError, KeyError) as exc:  # KeyError: a hard link to nothing unpacked
        raise OciError(f"the layer cannot be unpacked: {exc}") from None
    if "sha256:" + sha.hexdigest() != diff_id:
        raise OciError(f"the unpacked layer does not match the config's diff_id {diff_id}; nothing was imported",
                       code="digest_mismatch")


def _relocate(document: t.Any, old: str, new: str) -> t.Any:
    """Each string of ``document`` under ``old`` (a directory) moved under ``new``."""
    if isinstance(document, dict):
        return {k: _relocate(v, old, new) for k, v in document.items()}
    if isinstance(document, list):
        return [_relocate(v, old, new) for v in document]
    if isinstance(document, str) and (document == old or document.startswith(old.rstrip("/") + "/")):
        return new + document[len(old.rstrip("/")):]
    return document


def import_layout(store: ImageStore, layout: str, tag: str | None = None, digest: str | None = None,
                  name: str | None = None) -> tuple[dict, str]:
    """Take the image of an OCI layout into the store, every blob verified (``digest``: the
    manifest must be that one; ``name``: the image must be that one); (its image.json, the
    manifest's digest). An image of the same name and recipe already here is kept as it is;
    another recipe is refused."""
    if digest and not DIGEST_RE.match(digest):
        raise OciError(f"{digest!r} is not a sha256 digest (sha256: and 64 hex digits)")
    descriptor = _manifest_descriptor(layout, tag, digest)
    manifest = _json_blob(layout, descriptor, "manifest")
    config_descriptor, layers = manifest.get("config") or {}, manifest.get("layers") or []
    config = _json_blob(layout, config_descriptor, "config")
    labels = (config.get("config") or {}).get("Labels") or {}
    found, source_dir = labels.get(f"{LABEL}.name", ""), labels.get(f"{LABEL}.images-dir", "")
    if not NAME_RE.match(found) or not source_dir or len(layers) != 1 or layers[0].get("mediaType") != LAYER:
        raise OciError("the layout is not an image of this project (one gzip layer, labelled with the image's name)")
    if name and found != name:
        raise OciError(f"the layout holds image {found!r}, not {name!r}; nothing was imported")
    name = found
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or [None]
    layer_path = _verified(layout, layers[0], "layer")
    existing = store.get(name)
    if existing is not None:
        return _kept(existing, labels), descriptor["digest"]
    staging = os.path.join(store.state.images, f".import-{name}-{secrets.token_hex(4)}")
    os.makedirs(staging, mode=0o755)
    try:
        _extract(layer_path, diff_ids[0], staging)
        info = _relocate(_read_info(staging), source_dir, store.state.images)
        missing = [m.get("tree") for m in info.get("mounts") or [] if m.get("tree") and not os.path.exists(
            m["tree"].replace(store.path(name), staging, 1))]
        if missing:
            base = info.get("base")
            first = (f"build or pull {base!r} first" if base else
                     "build this node's own default image first (sandbox-kernel image build): its interpreter copy")
            raise OciError(f"image {name!r} names trees this node lacks ({', '.join(missing)}): {first}",
                           code="conflict")
        with open(os.path.join(staging, "image.json"), "w") as f:
            json.dump(info, f, indent=2)
        with store.lock(name):
            if store.get(name) is not None:
                return _kept(store.get(name), labels), descriptor["digest"]
            os.rename(staging, store.path(name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return info, descriptor["digest"]


def _read_info(tree: str) -> dict:
    try:
        with open(os.path.join(tree, "image.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise OciError(f"the layer holds no readable image.json: {exc}") from None


def _kept(existing: dict, labels: dict) -> dict:
    if existing.get("hash") != labels.get(f"{LABEL}.hash"):
        raise OciError(f"image {existing['name']!r} already exists here with another recipe; images are immutable: "
                       f"remove it first (sandbox-kernel image rm {existing['name']})", code="conflict")
    return existing
