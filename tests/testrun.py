"""One test run as a whole: its name, its temporary directory, its built images, and the check
that it left nothing behind.

A run may be spread over several pytest-xdist workers (pyproject's addopts), each with its own
session server. What they must share is made once per run here:

- the run's tag (a few hex digits) and directory ``/tmp/sbk-TAG-r`` (0711, so that sandbox
  uids can traverse it; short, as tmp_path goes in it and a unix socket's path holds 107 bytes), made by the process that owns the run (the xdist controller, or
  pytest alone) and handed to the workers in the environment (``SANDBOX_KERNEL_TEST_RUN``);
  TMPDIR points into it, so that whatever the run and its children make with ``tempfile``
  (a gateway's socket directory, browser profiles, kernelspec prefixes) is found there;
- the built default image (``image_home``): built once, under the image store's own lock, by
  the first worker that needs it; every session server borrows it read-only
  (``support.make_state_dir(images_from=...)``). SANDBOX_KERNEL_TEST_STATE_DIR, when set,
  is that home, kept between runs.

At the end the owner lists what the run left (``leftovers``): entries of /tmp named with the
run's tag or inside its directory, mounts under them, and live processes that carry the run's
tag in their environment or command line (servers, supervisors, bwrap, runsc, kernels,
JupyterLab, chromium). Other runs on the same machine carry other tags and are not looked at.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ENV_TAG = "SANDBOX_KERNEL_TEST_RUN"
ENV_DIR = "SANDBOX_KERNEL_TEST_RUN_DIR"
RUN_PREFIX = "sbk-"
#: What may stay in the run's directory until the owner removes it at the very end: the
#: shared image home and pytest's own temporary directories (tmp_path).
KEPT_IN_RUN_DIR = ("image-home", "pytest-of-")


def begin() -> bool:
    """Give this process (and so every worker and child it starts) a run, unless it already
    has one: a worker of the run, or a pytest started by a test. True when this process owns
    the run: it made it, it checks and removes it at the end."""
    if os.environ.get(ENV_TAG):
        return False
    while True:
        tag = secrets.token_hex(3)
        run_dir = pathlib.Path(f"/tmp/{RUN_PREFIX}{tag}-r")
        try:
            run_dir.mkdir(mode=0o711)
            break
        except FileExistsError:
            continue
    run_dir.chmod(0o711)  # mkdir's mode is filtered by the umask
    os.environ[ENV_TAG] = tag
    os.environ[ENV_DIR] = str(run_dir)
    os.environ["TMPDIR"] = str(run_dir)
    tempfile.tempdir = None  # gettempdir() caches its first answer
    return True


def tag() -> str:
    """The run's tag, part of the names of every state directory the run makes in /tmp."""
    return os.environ.get(ENV_TAG, "")


def run_dir() -> pathlib.Path | None:
    value = os.environ.get(ENV_DIR)
    return pathlib.Path(value) if value else None


def image_home() -> pathlib.Path:
    """Where the run's built images live: SANDBOX_KERNEL_TEST_STATE_DIR (kept between runs),
    else a directory of the run. Made here; built by `ensure_default_image`."""
    kept = os.environ.get("SANDBOX_KERNEL_TEST_STATE_DIR")
    if kept:
        home = pathlib.Path(kept).absolute()  # servers run in the repo, the tests anywhere
    else:
        base = run_dir() or pathlib.Path(tempfile.mkdtemp(prefix="sbk-images-", dir="/tmp"))
        home = base / "image-home"
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o711)  # the sandboxes' uids traverse it to their image
    return home


def image_build_argv(home: pathlib.Path) -> list[str]:
    """`sandbox image build` of the default image into the state directory ``home``."""
    return [sys.executable, "-m", "sandbox", "image", "build", "--state-dir", str(home)]


def start_default_image(home: pathlib.Path, env: dict[str, str], cwd: pathlib.Path) -> subprocess.Popen:
    """Begin building the default image in the background. The run's owner does this before
    xdist starts its workers: the build (about 40 s) then overlaps their start and their
    collection, which each worker's first test otherwise waited for. `ensure_default_image`
    waits on the image store's lock and finds it built. Its output: ``early-build.log``."""
    scratch = home / "early-build-tmp"  # its temporary files, removed with it (see `end_default_image`)
    scratch.mkdir(exist_ok=True)
    with open(home / "early-build.log", "wb") as log:
        return subprocess.Popen(image_build_argv(home),
                                cwd=str(cwd), env={**env, "TMPDIR": str(scratch)}, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def end_default_image(build: subprocess.Popen | None) -> None:
    """At the run's end: a build nobody needed (a run of tests without a server) is stopped
    when its image would be removed with the run anyway, else awaited (a kept state
    directory must not keep half an image)."""
    if build is None:
        return
    if build.poll() is None:
        if os.environ.get("SANDBOX_KERNEL_TEST_STATE_DIR"):
            build.wait(1200)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(build.pid, signal.SIGKILL)
            build.wait(60)
    shutil.rmtree(image_home() / "early-build-tmp", ignore_errors=True)


def ensure_default_image(home: pathlib.Path, env: dict[str, str], cwd: pathlib.Path) -> None:
    """Build the default image in ``home`` unless it is built from today's recipe. Workers
    that come here at once wait on the image store's lock and then reuse the first one's."""
    r = subprocess.run(image_build_argv(home),
                       cwd=str(cwd), env=env, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0 or not (home / "images" / "default" / "image.json").is_file():
        raise RuntimeError(f"building the default image in {home} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


# ------------------------------------------------------------------ what a run left


def _ours(pid: int, needle: bytes) -> bool:
    for name in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                if needle in f.read():
                    return True
        except OSError:
            return False
    return False


def _ancestors() -> set[int]:
    """This process and those above it (the controller's own environment carries the tag)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def processes(run_tag: str) -> dict[int, str]:
    """Live processes of this run: the tag in their environment (everything started with the
    run's environment) or on their command line (state directories, the run's TMPDIR)."""
    if not run_tag:
        return {}
    needles = (f"{ENV_TAG}={run_tag}".encode(), f"-{run_tag}-".encode())
    mine = _ancestors()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        try:
            state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state in ("Z", "X"):
            continue
        if any(_ours(pid, needle) for needle in needles):
            try:
                cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            found[pid] = cmd.strip()[:200]
    return found


def paths(run_tag: str) -> list[pathlib.Path]:
    """Entries of /tmp named with the run's tag, and what is in the run's directory beyond
    the image home and pytest's own temporary directories."""
    if not run_tag or os.environ.get("SANDBOX_KERNEL_TEST_KEEP_STATE") == "1":  # kept on purpose
        return []
    own_dir = run_dir()
    found = [p for p in pathlib.Path("/tmp").glob(f"*-{run_tag}-*") if p != own_dir]
    if own_dir is not None and own_dir.is_dir():
        found += [p for p in own_dir.iterdir() if not p.name.startswith(KEPT_IN_RUN_DIR)]
    return sorted(found)


def mounts(run_tag: str) -> list[str]:
    """Mounts the run made, but those of its image home: the run's shared images stay
    packed and mounted for every server that borrows them (a server detaches only the
    image mounts of its own state directory) until `finish` detaches them."""
    own_dir = run_dir()
    shared = f"{own_dir}/image-home/" if own_dir is not None else None
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if f"-{run_tag}-" in p and not (shared and p.startswith(shared))]


def leftovers() -> list[str]:
    """What this run left: one line each (empty when it left nothing)."""
    run_tag = tag()
    lines = [f"process {pid}: {cmd}" for pid, cmd in sorted(processes(run_tag).items())]
    lines += [f"mount {point}" for point in mounts(run_tag)]
    lines += [f"path {path}" for path in paths(run_tag)]
    return lines


def clean_up() -> None:
    """End and remove whatever the run left, so that a failed check leaves nothing either:
    SIGTERM (a supervisor tears its sandbox down), then SIGKILL; lazy unmounts; the paths."""
    run_tag = tag()
    if not run_tag:
        return
    for signum, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        pids = processes(run_tag)
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and processes(run_tag) and time.monotonic() < deadline:
            time.sleep(0.2)
    for point in sorted(mounts(run_tag), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    for path in paths(run_tag):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def finish() -> None:
    """The owner's last step: remove the run's directory (the image home with it, unless it
    is SANDBOX_KERNEL_TEST_STATE_DIR's, which lives elsewhere)."""
    own_dir = run_dir()
    if own_dir is not None:
        with open("/proc/mounts") as f:
            points = [line.split()[1] for line in f if line.split()[1].startswith(f"{own_dir}/")]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        shutil.rmtree(own_dir, ignore_errors=True)
