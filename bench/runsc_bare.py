"""The floor of benchmark 9's pause and resume: bare ``runsc checkpoint`` and ``runsc restore``.

A container of our own, outside the server, on the same pinned root filesystem and
interpreter as a sandbox (read from a live sandbox's bundle), with the same runsc flags
(``--platform ptrace --network none --ignore-cgroups``), holding the same N MB of random
bytes objects and the modules the sandbox's runtime preloads (numpy, pandas, ... : its
checkpoint holds them too). It runs as a sandbox's runtime does: ``runsc run`` (and later
``runsc restore``) in the foreground, the process's stdin and stdout two host pipes, the
process blocked reading stdin; so "restore" is timed as a resume is, to the first answer
(a line written to the restored process and echoed back), and "checkpoint" includes the
foreground ``runsc run`` exiting, as a pause does. What it times is gVisor's own share of
a pause and a resume: whatever ours takes beyond it is ours.

``placement`` says where the container runs: ``host`` (the benchmark's own cgroup, the floor
of the issue), ``beside`` (a cgroup of its own where the server puts its sandboxes', under
the shared ``sandbox-kernel`` group, no quota) or ``beside_quota`` (the same with a
sandbox's CPU quota of 1 CPU). On a busy host the ``sandbox-kernel`` group has one share
of the CPU against every process of the host's own group, so the three apart say how much
of a gap is the placement, how much the quota, and how much is ours.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

from sandbox.isolation import cgroups

PLACEMENTS = ("host", "beside", "beside_quota")

HOLD = ("import os, sys\n"
        "{imports}"
        "blobs = [os.urandom(1 << 20) for i in range({mb})]\n"
        "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
        "for line in sys.stdin:\n"
        "    sys.stdout.write(line); sys.stdout.flush()\n")
FLAGS = ("--platform", "ptrace", "--network", "none", "--ignore-cgroups")


def _runsc(root: str, *args: str, timeout: float = 600) -> float:
    """Seconds of one runsc command. Its output goes to a file, not a pipe: a detached
    container inherits runsc's stdio and would hold a pipe open after runsc returns."""
    with tempfile.TemporaryFile() as log:
        t0 = time.perf_counter()
        r = subprocess.run(["runsc", "--root", root, *FLAGS, *args], stdin=subprocess.DEVNULL, stdout=log,
                           stderr=log, timeout=timeout)
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


def _foreground(root: str, group: cgroups.SandboxCgroup | None, *args: str) -> subprocess.Popen:
    """``runsc run`` or ``runsc restore`` attached, as a sandbox's supervisor runs them (in
    ``group`` when there is one: the Sentry and the gofer start in runsc's group)."""
    return subprocess.Popen(["runsc", "--root", root, *FLAGS, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            preexec_fn=group.join if group is not None else None)


def _group(placement: str) -> cgroups.SandboxCgroup | None:
    if placement == "host":
        return None
    support = cgroups.detect()
    if support.version is None:
        raise RuntimeError(f"no cgroup for the bare container here: {support.reason}")
    group = cgroups.SandboxCgroup(support, f"bare-{os.getpid()}-{time.monotonic_ns()}")
    group.create(None, None, 1.0 if placement == "beside_quota" else None)
    return group


def _answer(proc: subprocess.Popen, line: bytes | None) -> None:
    """Write ``line`` (None: nothing) and wait for its echo (or the first line)."""
    if line is not None:
        proc.stdin.write(line)
        proc.stdin.flush()
    got = proc.stdout.readline()
    if not got or (line is not None and got != line):
        raise RuntimeError(f"the bare container answered {got!r}, exit code {proc.poll()}")


def checkpoint_restore(sandbox_bundle: dict, mb: int, preloaded: list[str], scratch: str | None = None,
                       placement: str = "host") -> dict:
    """Seconds of a bare checkpoint (until the attached ``runsc run`` exited) and restore
    (until the restored process answered) of a container holding ``mb`` MB; the image's size."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="runsc-bare-", dir=scratch))
    root, cid, image = str(work / "root"), f"bare-{os.getpid()}-{time.monotonic_ns()}", work / "image"
    procs = []
    group = _group(placement)
    try:
        bundle = _bundle(work, sandbox_bundle, mb, preloaded)
        procs.append(_foreground(root, group, "run", "--bundle", str(bundle), cid))
        _answer(procs[0], None)  # its 'ready': the memory is filled
        _answer(procs[0], b"ping\n")
        t0 = time.perf_counter()
        checkpoint_s = _runsc(root, "checkpoint", "--image-path", str(image), cid)
        procs[0].wait(timeout=60)
        exit_s = time.perf_counter() - t0 - checkpoint_s
        size = sum(f.stat().st_size for f in image.iterdir())
        shutil.rmtree(root, ignore_errors=True)  # as a pause does: runsc's record forgotten, no `runsc delete`
        t0 = time.perf_counter()
        procs.append(_foreground(root, group, "restore", "--image-path", str(image), "--bundle", str(bundle), cid))
        _answer(procs[1], b"ping\n")
        restore_s = time.perf_counter() - t0
        return {"placement": placement, "checkpoint_s": round(checkpoint_s, 3), "container_exit_s": round(exit_s, 3),
                "pause_s": round(checkpoint_s + exit_s, 3), "restore_to_answer_s": round(restore_s, 3),
                "image_mb": round(size / 1e6, 1)}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        subprocess.run(["runsc", "--root", root, "delete", "--force", cid], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
        if group is not None:
            group.kill_all()
            group.remove()
