"""The first run's default image today (a venv over the host's /usr) against the same
packages on a Debian root of their own, which is what the default image would cost if it
had one: cold caches (a new machine), then warm ones (a second build on it).

    .venv/bin/python bench/own_root_bench.py [--out bench/results/own-root-latest.json]

Needs root and mmdebstrap (sandbox/images/debian_root.py). One scratch state directory;
each build's caches (pip/uv's, apt's .deb files) start empty for the cold builds and are
those of the cold build for the warm ones. The interpreter copy of the venv image is made
once before the timed builds, as on a host where every venv image shares it. Reported per
build: seconds, each step's seconds (from the build's own step lines), MiB on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sandbox.common.paths import StateDir  # noqa: E402
from sandbox.images import debian_root  # noqa: E402
from sandbox.images.images import DEFAULT_IMAGE, STEP_RE, ImageStore  # noqa: E402
from sandbox.images.installer import Installer  # noqa: E402

MiB = 1024 * 1024


def timed(store: ImageStore, name: str, **recipe) -> dict:
    marks: dict[int, float] = {}

    def progress(line: str) -> None:
        match = STEP_RE.match(line)
        if match:
            marks[int(match[1])] = time.monotonic()

    started = time.monotonic()
    info = store.build(name, progress=progress, **recipe)
    total = time.monotonic() - started
    ends = sorted(marks) + [None]
    steps = {n: round((marks[ends[i + 1]] if ends[i + 1] else started + total) - marks[n], 1)
             for i, n in enumerate(ends[:-1])}
    store.remove(name, in_use=lambda n: 0)
    return {"image": name, "seconds": round(total, 1), "steps": steps, "size_mib": info["size_bytes"] // MiB,
            "packages": len(info["package_list"])}


def run() -> dict:
    ok, why = debian_root.available()
    if not ok:
        raise SystemExit(f"cannot build a root of its own here: {why}")
    scratch = tempfile.mkdtemp(prefix="sk-own-root-bench-")
    builds = []
    try:
        state = StateDir(os.path.join(scratch, "state"))
        state.ensure()
        uv_cache = os.path.join(scratch, "uv-cache")
        store = ImageStore(state, installer=Installer(cache_dir=uv_cache))
        store._python_copy(lambda line: None)
        for cache in ("cold", "warm"):
            if cache == "cold":
                for path in (uv_cache, state.images + "/_apt-cache", state.images + "/_uv-cache"):
                    shutil.rmtree(path, ignore_errors=True)
            for kind, recipe in (("venv", {}), ("own-root", {"root": "debian"})):
                result = timed(store, DEFAULT_IMAGE if kind == "venv" else "own-root-default", **recipe)
                result.update(kind=kind, cache=cache)
                builds.append(result)
                print(f"{kind:8} {cache}: {result['seconds']:6.1f} s {result['steps']} {result['size_mib']} MiB", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_cpus": os.cpu_count(),
            "loadavg": os.getloadavg(), "builds": builds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "own-root-latest.json"))
    args = parser.parse_args()
    pathlib.Path(args.out).write_text(json.dumps(run(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
