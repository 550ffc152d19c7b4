"""What running bwrap sandboxes on the image's pinned root costs: the first create of the
default image in a state directory (which builds the root and its bwrap view) and every
create after it, against the host's /usr (``bwrap_system=host``).

    .venv/bin/python bench/pinned_root_bench.py [--state-dir DIR] [--samples 8] [--out FILE]

One state directory (kept: the image is built once, about a minute the first time); its
pinned roots are removed first, so that the first pinned create builds one. Servers run
with no warm pool, so every create spawns a sandbox (POST until 201: the runtime is up).
The settings alternate, server by server: pinned, host, pinned; each server's creates are
timed after one warm-up create.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.harness import BenchServer, HostLoad, create, delete, summary  # noqa: E402
from sandbox.isolation import disk, imagefs  # noqa: E402


def _forget_roots(state_dir: pathlib.Path) -> None:
    rootfs = state_dir / "rootfs"
    for view in rootfs.glob("*/system.json"):
        pack = json.loads(view.read_text()).get("pack")
        if pack:
            disk.unmount(imagefs.mount_point(pack))
    shutil.rmtree(rootfs, ignore_errors=True)


def _timed_create(client) -> float:
    started = time.monotonic()
    sandbox = create(client, isolation="bwrap")
    seconds = time.monotonic() - started
    delete(client, sandbox["id"])
    return seconds


def _server_run(state_dir: pathlib.Path, system: str, samples: int) -> dict:
    server = BenchServer(str(state_dir), pool_size=0, extra_args=("--set", f"bwrap_system={system}"))
    server.start()
    try:
        with server.client(timeout=300) as client:
            first = _timed_create(client)
            creates = [_timed_create(client) for _ in range(samples)]
    finally:
        server.stop()
    return {"system": system, "first_create_s": round(first, 3), "create_s": summary(creates)}


def run(state_dir: pathlib.Path, samples: int) -> dict:
    _forget_roots(state_dir)
    load = HostLoad()
    runs = [_server_run(state_dir, system, samples) for system in ("pinned", "host", "pinned")]
    built = {}
    for path in (state_dir / "rootfs").glob("*/rootfs.json"):
        root = json.loads(path.read_text())
        view = json.loads((path.parent / "system.json").read_text())
        built = {"root_build_s": root["build_seconds"], "host_files": root["host_files"],
                 "view_build_s": view["build_seconds"], "packed": bool(view.get("pack")),
                 "pack_mib": round(os.path.getsize(view["pack"]) / 2**20, 1) if view.get("pack") else None}
    return {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "samples": samples,
            "host_load": load.finish(), "build": built, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", default=os.environ.get("SANDBOX_BENCH_STATE_DIR", "/tmp/sk-bench-state"))
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "pinned-root-latest.json"))
    args = parser.parse_args()
    result = run(pathlib.Path(args.state_dir), args.samples)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
