"""What every image build shares, whichever kind of image it makes (a venv over the host's
interpreter, images.py; a root of its own, own_root.py): its numbered steps as progress
displays recognise them, its error, a tool's run with its output as progress, and a tree
packed into the read-only ext4 image a sandbox mounts (isolation/imagefs.py)."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Callable

from ..isolation import disk

Progress = Callable[[str], None]
BUILD_STEPS = 5
STEP_RE = re.compile(r"^step (\d+)/(\d+): (.*)$")


def step_line(number: int, text: str) -> str:
    """A build step as progress displays recognise it (sandbox/images/progress.py): ``step 2/5: ...``."""
    return f"step {number}/{BUILD_STEPS}: {text}"


class ImageError(Exception):
    """A build or removal that cannot be done, with a message for the person who asked."""

    def __init__(self, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.code = code


def dir_size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def tree_mount(tree: str, sandbox_path: str, pack: str, progress: Progress) -> dict:
    """One of an image's ``mounts``: the tree, where the sandbox sees it, and its ext4 pack
    (packed now if there is none yet; None where mke2fs is missing)."""
    if not os.path.exists(pack) and os.path.exists(disk.MKFS):
        progress(f"packing {os.path.basename(tree)} into a read-only ext4 image")
        tmp = pack + ".tmp"
        disk.pack(tree, tmp)
        os.rename(tmp, pack)
    return {"path": sandbox_path, "tree": tree, "pack": pack if os.path.exists(pack) else None}


def run(argv: list[str], progress: Progress, check: bool = True, env: dict | None = None,
        label: str | None = None) -> None:
    """Run a build tool, its output lines as progress; a failure raises ImageError with the
    tool's own error lines (``label`` names the tool when argv[0] is a wrapper)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:
        line = line.rstrip()
        lines.append(line)
        if line and not line.startswith("  "):
            progress(line)
    if proc.wait() != 0 and check:
        # pip says ERROR: on each line; uv says error: once and explains on indented lines after it
        first = next((i for i, l in enumerate(lines) if "error" in l.lower() or l.startswith("E:")), None)
        errors = [l.strip() for l in lines[first:first + 5] if l.strip()] if first is not None else lines[-5:]
        raise ImageError(f"{label or os.path.basename(argv[0])} {'' if label else ' '.join(argv[1:4])} failed: "
                         + " | ".join(errors))
