"""The baseline of benchmark 9's pause and resume: bare ``runsc checkpoint`` and ``runsc restore``.

A container of our own, outside the server, on the same pinned root filesystem and
interpreter as a sandbox (read from a live sandbox's bundle), with the same runsc flags
(``--platform ptrace --network none --ignore-cgroups``), holding the same N MB of random
bytes objects and the modules the sandbox's runtime preloads (numpy, pandas, ... : its
checkpoint holds them too). What it times is gVisor's own share of a pause and a resume: whatever our
pause or resume takes beyond it is ours.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

HOLD = ("import os, time\n"
        "{imports}"
        "blobs = [os.urandom(1 << 20) for i in range({mb})]\n"
        "open('/out/ready', 'w').close()\n"
        "while True:\n"
        "    time.sleep(3600)\n")


def _runsc(root: str, *args: str, timeout: float = 600) -> float:
    """Seconds of one runsc command. Its output goes to a file, not a pipe: a detached
    container inherits runsc's stdio and would hold a pipe open after runsc returns."""
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        r = subprocess.run(["runsc", "--root", root, "--platform", "ptrace", "--network", "none", "--ignore-cgroups",
                            *args], stdin=subprocess.DEVNULL, stdout=log, stderr=log, timeout=timeout)
        seconds = time.perf_counter() - t0
        if r.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"runsc {args[0]} failed: {log.read().decode(errors='replace').strip()[-400:]}")
    return seconds


def _bundle(work: pathlib.Path, theirs: dict, mb: int, preloaded: list[str]) -> pathlib.Path:
    """A bundle running HOLD with the sandbox's interpreter on the sandbox's root
    (``theirs``: a sandbox bundle's config.json)."""
    out = work / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    config = {
        "ociVersion": "1.0.0",
        "process": {"terminal": False, "user": theirs["process"]["user"], "cwd": "/",
                    "args": [theirs["process"]["args"][0], "-c", HOLD.format(mb=mb, imports="".join(f"import {m}\n" for m in preloaded))],
                    "env": theirs["process"]["env"], "noNewPrivileges": True},
        "root": {"path": theirs["root"]["path"], "readonly": True},
        "hostname": "bare",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/out", "type": "bind", "source": str(out), "options": ["bind", "rw"]}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]},
    }
    bundle = work / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def checkpoint_restore(sandbox_bundle: dict, mb: int, preloaded: list[str], scratch: str | None = None) -> dict:
    """Seconds of a bare checkpoint and restore of a container holding ``mb`` MB, the image's size."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="runsc-bare-", dir=scratch))
    root, cid, image = str(work / "root"), f"bare-{os.getpid()}", work / "image"
    try:
        bundle = _bundle(work, sandbox_bundle, mb, preloaded)
        _runsc(root, "run", "--detach", "--bundle", str(bundle), cid)
        deadline = time.monotonic() + 300
        while not (work / "out" / "ready").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the bare container did not fill its memory within 300 s")
            time.sleep(0.05)
        checkpoint_s = _runsc(root, "checkpoint", "--image-path", str(image), cid)
        size = sum(f.stat().st_size for f in image.iterdir())
        delete_s = _runsc(root, "delete", "--force", cid)
        restore_s = _runsc(root, "restore", "--detach", "--image-path", str(image), "--bundle", str(bundle), cid)
        return {"checkpoint_s": round(checkpoint_s, 3), "restore_s": round(restore_s, 3),
                "delete_s": round(delete_s, 3), "image_mb": round(size / 1e6, 1)}
    finally:
        subprocess.run(["runsc", "--root", root, "delete", "--force", cid], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
