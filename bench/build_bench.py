"""The default image built with pip and with uv, side by side, from a cold and a warm cache.

    .venv/bin/python bench/build_bench.py [--rounds 1] [--out bench/results/build-latest.json]

Each round builds the default recipe four times in one scratch state directory, alternating
the installers so both see the same host load: pip with an empty cache, uv with an empty
cache, then each again with the cache its first build filled. The interpreter copy (as root)
is made once before the timed builds, as on a real host where it is shared by every image.
Reported per build: the whole build and its install step (step 2 to step 3 of the build's
own progress lines), the image's size, and whether both installers resolved the same
versions; then the ratios pip/uv. Both use pip's configuration on this host (uv through
sandbox/images/installer.py's translation), so they read the same indexes.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sandbox.common.paths import StateDir  # noqa: E402
from sandbox.images import image_packages  # noqa: E402
from sandbox.images.images import DEFAULT_IMAGE, STEP_RE, ImageStore  # noqa: E402
from sandbox.images.installer import Installer  # noqa: E402

MiB = 1024 * 1024


def timed_build(state: StateDir, installer: Installer) -> dict:
    """Build the default image with ``installer``, remove it again; its times and contents."""
    marks: dict[int, float] = {}

    def progress(line: str) -> None:
        match = STEP_RE.match(line)
        if match:
            marks[int(match[1])] = time.monotonic()

    store = ImageStore(state, installer=installer)
    started = time.monotonic()
    info = store.build(DEFAULT_IMAGE, progress=progress)
    total = time.monotonic() - started
    versions = {p["name"].lower(): p["version"] for p in image_packages.package_list(info)}
    installers = sorted({p["installer"] or "?" for p in image_packages.package_list(info) if p["layer"] == DEFAULT_IMAGE})
    store.remove(DEFAULT_IMAGE, in_use=lambda name: 0)
    return {"installer": installer.name, "seconds": round(total, 1),
            "install_seconds": round(marks.get(3, started) - marks.get(2, started), 1),
            "size_mib": info["size_bytes"] // MiB, "packages": len(versions), "recorded_installers": installers,
            "versions": versions}


def run(rounds: int) -> dict:
    scratch = tempfile.mkdtemp(prefix="sk-build-bench-")
    try:
        state = StateDir(os.path.join(scratch, "state"))
        state.ensure()
        ImageStore(state)._python_copy(lambda line: None)  # shared by every image, not timed
        caches = {name: os.path.join(scratch, f"cache-{name}") for name in ("pip", "uv")}
        builds = []
        for number in range(rounds):
            for cache in ("cold", "warm"):
                for name in ("pip", "uv") if number % 2 == 0 else ("uv", "pip"):
                    if cache == "cold":
                        shutil.rmtree(caches[name], ignore_errors=True)
                    installer = Installer(use_uv=name == "uv", cache_dir=caches[name])
                    if installer.name != name:
                        raise SystemExit("uv is not installed: pip install uv (a dependency of the project)")
                    result = timed_build(state, installer)
                    result.update(cache=cache, round=number)
                    builds.append(result)
                    print(f"{name:4} {cache} cache: {result['seconds']:6.1f} s (install {result['install_seconds']:.1f} s), "
                          f"{result['size_mib']} MiB, {result['packages']} packages", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summarise(builds)


def summarise(builds: list[dict]) -> dict:
    """The ratios pip/uv of each round (its two builds ran back to back, under the same
    load), and their median: the load of this shared host moves between rounds."""
    def of(name: str, cache: str, number: int, key: str) -> float:
        return next(b[key] for b in builds if (b["installer"], b["cache"], b["round"]) == (name, cache, number))

    rounds = sorted({b["round"] for b in builds})
    ratios = {}
    for cache in ("cold", "warm"):
        for key in ("seconds", "install_seconds"):
            each = [round(of("pip", cache, n, key) / max(of("uv", cache, n, key), 0.01), 2) for n in rounds]
            ratios[f"{cache}_{key}_pip_over_uv"] = {"median": round(statistics.median(each), 2), "rounds": each}
    pip_versions = next(b["versions"] for b in builds if b["installer"] == "pip")
    uv_versions = next(b["versions"] for b in builds if b["installer"] == "uv")
    differ = sorted(k for k in set(pip_versions) | set(uv_versions) if pip_versions.get(k) != uv_versions.get(k))
    for b in builds:
        b.pop("versions")
    return {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host_cpus": os.cpu_count(),
            "loadavg": os.getloadavg(), "builds": builds, "ratios": ratios,
            "same_versions": not differ, "versions_differ": {k: [pip_versions.get(k), uv_versions.get(k)] for k in differ}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "build-latest.json"))
    args = parser.parse_args()
    result = run(args.rounds)
    for key, value in result["ratios"].items():
        print(f"{key}: {value['median']} (rounds: {value['rounds']})")
    print(f"same versions: {result['same_versions']} {result['versions_differ'] or ''}")
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
