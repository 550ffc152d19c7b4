"""Stand-in images for the layout and registry tests, and a real OCI registry the test
starts (Debian's ``docker-registry``, the CNCF distribution registry): its own storage
directory, a free port on the address it is given, plain HTTP.

A stand-in image is an image directory as the store keeps one, with a venv-like tree (an
absolute symlink, an executable, a hard link) but no Python in it: the layout treats the
image directory as opaque, so it moves like a real one; the multi-host test moves a real one.

``blob_file`` is where the registry keeps a blob on disk, so that a test can alter one
behind the registry's back (what a compromised registry, or its disk, serves).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile

import httpx

import support
from sandbox.common.paths import StateDir
from sandbox.images.images import IMAGE_FORMAT, ImageStore

BINARY = "docker-registry"
NAME = "demo"


def make_store(root: pathlib.Path) -> ImageStore:
    root.mkdir(mode=0o755)
    return ImageStore(StateDir(str(root)))


def stand_in_image(store: ImageStore, name: str = NAME, base_tree: str | None = None) -> dict:
    """An image directory as the store keeps one: image.json last, naming its own tree."""
    target = pathlib.Path(store.path(name))
    (target / "venv" / "bin").mkdir(parents=True)
    (target / "venv" / "lib").mkdir()
    (target / "venv" / "lib" / "marker.py").write_text("VALUE = 'from the source node'\n")
    tool = target / "venv" / "bin" / "tool"
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    os.symlink("/usr/bin/python3", target / "venv" / "bin" / "python")
    os.link(target / "venv" / "lib" / "marker.py", target / "venv" / "lib" / "marker_link.py")
    mounts = [{"path": f"/opt/sandbox-images/{name}", "tree": str(target / "venv"), "pack": None}]
    if base_tree:
        mounts.append({"path": "/opt/sandbox-images/default", "tree": base_tree, "pack": None})
    info = {"name": name, "hash": "0123456789abcdef", "base": "default" if base_tree else None, "format": IMAGE_FORMAT,
            "venv": f"/opt/sandbox-images/{name}", "mounts": mounts, "pip": ["marker"], "built_at": "2026-12-07T00:00:00Z"}
    (target / "image.json").write_text(json.dumps(info))
    return info


def why_not_available() -> str | None:
    if shutil.which(BINARY) is None:
        return f"{BINARY} is not installed (Debian: apt-get install docker-registry)"
    if shutil.which("skopeo") is None:
        return "skopeo is not installed (Debian: apt-get install skopeo)"
    return None


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, address: str = "127.0.0.1"):
        self.address, self.port = address, _free_port(address)
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="sbk-registry-"))
        (self.root / "config.yml").write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'storage'}\n"
            f"http:\n  addr: {address}:{self.port}\n")
        self.log = open(self.root / "registry.log", "wb")
        self.proc = subprocess.Popen([BINARY, "serve", str(self.root / "config.yml")], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not support.wait_for(self._answers, 30):
            self.close()
            raise RuntimeError(f"{BINARY} did not start:\n{self.log_tail()}")

    @property
    def setting(self) -> str:
        """What ``image_registry`` / ``--registry`` takes: plain HTTP, this test's own registry."""
        return f"http://{self.address}:{self.port}"

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{BINARY} exited:\n{self.log_tail()}")
        try:
            return httpx.get(f"{self.setting}/v2/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def manifest(self, repository: str, reference: str) -> dict:
        r = httpx.get(f"{self.setting}/v2/{repository}/manifests/{reference}", timeout=10,
                      headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
        r.raise_for_status()
        return r.json()

    def blob_file(self, digest: str) -> pathlib.Path:
        hexdigest = digest.split(":", 1)[1]
        return self.root / "storage" / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexdigest[:2] / hexdigest / "data"

    def tamper(self, digest: str) -> None:
        """Flip one byte of a stored blob, its size kept."""
        path = self.blob_file(digest)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join((self.root / "registry.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)
