"""Red-team probes of what a sandbox's own mount table gives away or lets it spend.

22. /dev is bwrap's minimal device set, read-only (it is a tmpfs as large as half the
    host's memory), and /dev/shm is a tmpfs of shm_mb: writing past it is ENOSPC.
23. /proc/self/mountinfo names, for every bind mount, the host path of its source: the
    runtime and the matplotlib cache are copied into tmpfs mounts of the sandbox's own, and
    each image tree (venv, interpreter copy) is an ext4 filesystem of its own, loop-mounted
    read-only on the host and bound at a neutral path, so that no line names the state
    directory. Without root (no loop mounts) the trees are bound as directories: that probe
    is skipped, saying so. The copy of the host's interpreter is mounted at a neutral path
    and the host's prefix is a symlink to it: no line names the host's install prefix.

Each probe runs the same code on the host as its control, so that a probe that could not
write or could not parse would not pass as "protected".
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest
from redteam_support import minimal_dev

import support

MARK = "@@MOUNTS@@"
USUAL_DEVICES = {"null", "zero", "full", "random", "urandom", "tty"}

FILL = '''
import errno, json, os
def fill(path, mib):
    """Write `mib` MiB to `path`; what happened and how many MiB got in. Removed after."""
    n = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"\\1" * (1 << 20))
                f.flush()
                n += 1
        return ["ok", n]
    except OSError as e:
        return [type(e).__name__, errno.errorcode.get(e.errno), n]
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
'''

MOUNTS = '''
def mounts(text):
    """(root in its filesystem, mount point, filesystem type) of each line of a mountinfo."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        out.append((fields[3], fields[4], fstype))
    return out
'''


def run_json(api, sandbox_id: str, code: str):
    events = support.execute(api, sandbox_id, code, timeout_seconds=120)
    out = support.stream_text(events)
    assert MARK in out, events[-3:]
    return json.loads(out.split(MARK, 1)[1].splitlines()[0])


def test_p22_dev_is_minimal_and_read_only_and_shm_is_capped(api, new_sandbox, isolation):
    sandbox = new_sandbox()
    shm_mb = sandbox["limits"]["shm_mb"]
    result = run_json(api, sandbox["id"], FILL + f'''
st = os.statvfs("/dev/shm")
with open("/dev/null", "wb") as f:
    f.write(b"still works")
print({MARK!r} + json.dumps({{"ls": sorted(os.listdir("/dev")), "dev": fill("/dev/planted", 1),
                             "shm": fill("/dev/shm/fill", {shm_mb} + 32), "shm_mib": st.f_blocks * st.f_frsize >> 20}}))
''')
    assert USUAL_DEVICES <= set(result["ls"]) <= minimal_dev(isolation), result["ls"]
    # bwrap's /dev is a read-only mount; gVisor's is its own devtmpfs, root's and 0755
    planted = ["PermissionError", "EACCES", 0] if isolation == "gvisor" else ["OSError", "EROFS", 0]
    assert result["dev"] == planted, result["dev"]
    assert result["shm_mib"] == shm_mb, result
    assert result["shm"][:2] == ["OSError", "ENOSPC"] and result["shm"][2] <= shm_mb, result["shm"]
    # control: the same fill on the host's /dev/shm gets past that size
    scope: dict = {}
    exec(FILL, scope)
    host = scope["fill"](f"/dev/shm/sbk-redteam-{os.getpid()}", shm_mb + 32)
    assert host == ["ok", shm_mb + 32], host
    print(f"\nPROBE 22 | /dev, /dev/shm | /dev = {result['ls']} not writable ({result['dev'][1]}), /dev/shm {result['shm_mib']} MiB: "
          f"ENOSPC after {result['shm'][2]} MiB (host: {host[1]} MiB written)")


def _image_info(server: support.Server, sandbox: dict) -> dict:
    return json.loads((server.state_dir / "images" / sandbox["image"] / "image.json").read_text())


def _bwrap_point(info: dict, mount: dict) -> str:
    """Where bwrap mounts one of the image's trees: its path, but the interpreter copy's at
    a neutral path (the host's prefix is a link to it there)."""
    from sandbox.isolation.bwrap import PYTHON_MOUNT

    return PYTHON_MOUNT if info.get("python_copy") and mount["path"] == info["python_prefix"] else mount["path"]


def _mountinfo(api, sandbox_id: str) -> list[list[str]]:
    return run_json(api, sandbox_id, MOUNTS + f'''
import json
print({MARK!r} + json.dumps(mounts(open("/proc/self/mountinfo").read())))
''')


def _named_sources(entries: list[list[str]]) -> dict[str, str]:
    """Mount point -> the host path its source names, where that says more than the mount
    point itself: bwrap's own tmpfs files, device nodes and /usr (seen at /usr) say nothing."""
    named = {}
    for root, point, fstype in entries:
        if root == "/" or root == point or fstype in ("devtmpfs", "proc", "devpts"):
            continue
        if root.startswith(("/newroot", "/bindfile", "/usr/")):
            continue
        named[point] = root
    return named


@pytest.mark.bwrap_only(reason="inspects bwrap's mount layout (the runtime and font cache copied into tmpfs mounts); "
                        "under gVisor they are files of the pinned root, and the stricter "
                        "test_p23_mountinfo_names_no_state_path_at_all passes there")
def test_p23_mountinfo_names_no_state_layout_but_the_images(sandbox_server, api, new_sandbox):
    """In every mode: the runtime and the font cache are tmpfs copies, each image tree is at
    its neutral sandbox path, and a mount naming the state directory is at most an image's
    tree (bound as a directory where the server cannot loop-mount its pack)."""
    from sandbox.isolation.bwrap import MPLCACHE_MOUNT, RUNTIME_MOUNT

    sandbox = new_sandbox()
    state = str(sandbox_server.state_dir.resolve())
    entries = _mountinfo(api, sandbox["id"])
    by_point = {point: (root, fstype) for root, point, fstype in entries}
    assert by_point[RUNTIME_MOUNT] == ("/", "tmpfs"), by_point.get(RUNTIME_MOUNT)
    if MPLCACHE_MOUNT in by_point:
        assert by_point[MPLCACHE_MOUNT] == ("/", "tmpfs"), by_point[MPLCACHE_MOUNT]
    info = _image_info(sandbox_server, sandbox)
    assert {_bwrap_point(info, m) for m in info["mounts"]} <= set(by_point), (info["mounts"], by_point)
    trees = {m["tree"] for m in info["mounts"]}
    version = sandbox["isolation"].get("rootfs_version")
    if version:  # on the pinned root: its system view is bound as / (a directory where nothing is loop-mounted)
        trees.add(json.loads((sandbox_server.state_dir / "rootfs" / version / "system.json").read_text())["tree"])
    naming_state = {point: root for root, point, _ in entries if state in root or state in point}
    if sandbox["isolation"].get("disk", "").startswith("none"):
        # An ordinary user's server binds /workspace as a plain directory (no loop mount
        # without root; README, "Many users on one machine"), so its line names its path.
        plain = naming_state.pop("/workspace", None)
        print(f"\nPROBE 23 | /workspace is a plain directory here, named by mountinfo: {plain}")
    assert set(naming_state.values()) <= trees, naming_state
    named = _named_sources(entries)
    print(f"\nPROBE 23 | mountinfo | runtime and font cache on tmpfs; host sources named: {named}")


def test_p23_mountinfo_names_no_state_path_at_all(sandbox_server, api, new_sandbox, isolation):
    """Where the server can loop-mount: each image tree is the root of a read-only ext4 of
    its own at its neutral path, and no line of mountinfo names the state directory."""
    sandbox = new_sandbox()
    if not sandbox["isolation"].get("disk", "").startswith("ext4"):
        pytest.skip(f"the server cannot loop-mount ({sandbox['isolation'].get('disk')}): its sandboxes bind the "
                    "image trees, and mountinfo names their host paths")
    info = _image_info(sandbox_server, sandbox)
    if not all(m.get("pack") for m in info["mounts"]):
        pytest.skip("the image has no ext4 packs (mke2fs missing when it was built): its trees are bound")
    state = str(sandbox_server.state_dir.resolve())
    entries = _mountinfo(api, sandbox["id"])
    assert not [e for e in entries if state in e[0] or state in e[1]], entries
    by_point = {point: (root, fstype) for root, point, fstype in entries}
    # bwrap binds each pack at its neutral path; under gVisor the trees are files of the pinned root
    tree_mount = None if isolation == "gvisor" else ("/", "ext4")
    for mount in info["mounts"]:
        point = mount["path"] if isolation == "gvisor" else _bwrap_point(info, mount)
        assert by_point.get(point) == tree_mount, (mount, by_point.get(point))
    # control: the same parser on the host's mountinfo finds the packs' mounts, which name
    # the state directory
    scope: dict = {}
    exec(MOUNTS, scope)
    host = scope["mounts"](pathlib.Path("/proc/self/mountinfo").read_text())
    from sandbox.isolation.imagefs import mount_point

    packs = {mount_point(m["pack"]) for m in info["mounts"]}
    assert packs <= {point for _, point, _ in host}, (packs, host)
    points = [m["path"] if isolation == "gvisor" else _bwrap_point(info, m) for m in info["mounts"]]
    print(f"\nPROBE 23 | mountinfo | image trees {sorted((str(by_point.get(p)), p) for p in points)};"
          f" no line names {state}")


#: The control's server: bwrap binds the interpreter copy at the host's prefix again.
PREFIX_MOUNTED = '''
from sandbox.isolation import bwrap
_build_argv = bwrap.build_argv
def build_argv(*args, **kwargs):
    argv, command = _build_argv(*args, **kwargs)
    for i in range(len(argv) - 5):
        if argv[i] == "--ro-bind" and argv[i + 2] == bwrap.PYTHON_MOUNT and argv[i + 3] == "--symlink":
            argv[i:i + 6] = ["--ro-bind", argv[i + 1], argv[i + 5]]
            break
    return argv, command
bwrap.build_argv = build_argv
'''


@pytest.mark.bwrap_only(reason="bwrap binds host trees into the sandbox; gVisor's pinned root holds the interpreter "
                        "as files, and test_p23_mountinfo_names_no_state_path_at_all covers it")
def test_p23_mountinfo_names_no_host_interpreter_prefix(spawn_server, tmp_path):
    """The copy of the host's interpreter is mounted at a neutral path, and a symlink at the
    host's prefix leads to it (the venv's baked references name that prefix): no line of
    mountinfo names the host's prefix, and the interpreter runs. Control: a server whose
    bwrap binds the copy at the host's prefix again (on the host's /usr: the pinned root has
    the link there), where the probe finds it."""
    from sandbox.isolation.bwrap import PYTHON_MOUNT

    prefix = os.path.realpath(sys.base_prefix)
    probe = MOUNTS + f'''
import json, os, sys
print({MARK!r} + json.dumps({{"mounts": mounts(open("/proc/self/mountinfo").read()),
                              "base_prefix": sys.base_prefix, "real": os.path.realpath(sys.base_prefix)}}))
'''

    def mountinfo_of(server: support.Server) -> dict:
        with server.client(timeout=120) as api:
            sandbox = support.create(api)
            try:
                info = _image_info(server, sandbox)
                if not info.get("python_copy"):
                    pytest.skip(f"the image binds no copy of the interpreter (its prefix {prefix} is readable by "
                                "sandbox uids, or the server is not root): nothing of it to name")
                return run_json(api, sandbox["id"], probe)
            finally:
                api.delete(f"/v1/sandboxes/{sandbox['id']}")

    seen = mountinfo_of(spawn_server("--pool-size", "0"))
    named = [entry for entry in seen["mounts"] if prefix in entry[0] or prefix in entry[1]]
    assert named == [], named
    assert PYTHON_MOUNT in {point for _, point, _ in seen["mounts"]}, seen["mounts"]
    assert seen["real"] == PYTHON_MOUNT, seen

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(PREFIX_MOUNTED)
    control = spawn_server("--pool-size", "0", "--set", "bwrap_system=host", extra_env={
        "PYTHONPATH": f"{shim}{os.pathsep}{support.server_env(None)['PYTHONPATH']}"})
    found = [entry for entry in mountinfo_of(control)["mounts"] if entry[1] == prefix]
    assert found, "control: with the copy bound at the host's prefix, the probe finds that mount point"
    print(f"\nPROBE 23 | mountinfo | the interpreter at {PYTHON_MOUNT}, {prefix} a link: no line names it "
          f"(control: {found})")
