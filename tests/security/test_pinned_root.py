"""A bubblewrap sandbox of a venv image runs on the image's pinned root (the gVisor tier's
tree), not on the host's live /usr: what the host adds to /usr after the root was built, and
host programs outside the image's closure, are not there. Each probe's control is a server
with ``bwrap_system=host``, whose sandboxes bind the host's /usr and see them.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

import support
import testrun

pytestmark = [pytest.mark.bwrap_only(
    reason="the bubblewrap tier's root; a gVisor sandbox has always run on the pinned root (the version test "
           "makes one of its own to compare)")]

MARK = "@@PINNED@@"
HOST_SETTING = ("--pool-size", "0", "--set", "bwrap_system=host")
# Host programs no sandbox needs (none is in rootfs.TOOLS): the first the host has is the probe.
OUTSIDE_THE_CLOSURE = ("perl", "gcc", "make", "git", "curl")


def _probe(api, sandbox_id: str, code: str):
    events = support.execute(api, sandbox_id, code, timeout_seconds=120)
    out = support.stream_text(events)
    assert MARK in out, events[-3:]
    return json.loads(out.split(MARK, 1)[1].splitlines()[0])


def _sees(server: support.Server, paths: list[str]) -> dict:
    """Which of ``paths`` exist in a new bwrap sandbox of the default image of ``server``."""
    with server.client(timeout=180) as api:
        sandbox = support.create(api, isolation="bwrap")
        try:
            return _probe(api, sandbox["id"], f"import json, os\n"
                                              f"print({MARK!r} + json.dumps({{p: os.path.exists(p) for p in {paths!r}}}))")
        finally:
            api.delete(f"/v1/sandboxes/{sandbox['id']}")


@pytest.fixture
def usr_marker():
    """(path, writer) of a file for the host's /usr/local, written when the test says so (after
    the root is built) and removed after."""
    if os.getuid() != 0:
        pytest.skip("putting a marker into the host's /usr/local needs root")
    path = f"/usr/local/share/sandbox-kernel-pinned-{uuid.uuid4().hex}"

    def write() -> None:
        with open(path, "w") as f:
            f.write("host")

    yield path, write
    if os.path.exists(path):
        os.unlink(path)


@pytest.mark.slow
def test_a_file_the_host_adds_to_usr_later_is_not_in_a_new_sandbox(spawn_server, usr_marker):
    path, write = usr_marker
    server = spawn_server("--pool-size", "0")
    assert _sees(server, [path]) == {path: False}  # this first sandbox built the image's root
    write()
    assert _sees(server, [path]) == {path: False}, "a file added to the host's /usr after the root was built"
    control = _sees(spawn_server(*HOST_SETTING), [path])
    assert control == {path: True}, f"control: a sandbox on the host's /usr sees {path}"
    print(f"\nPINNED ROOT | {path} added after the build: absent (host /usr control: visible)")


@pytest.mark.slow
def test_host_programs_outside_the_closure_are_not_there(spawn_server):
    from sandbox.isolation.rootfs import TOOLS

    programs = [f"/usr/bin/{p}" for p in OUTSIDE_THE_CLOSURE if p not in TOOLS and os.path.exists(f"/usr/bin/{p}")]
    if not programs:
        pytest.skip(f"the host has none of {OUTSIDE_THE_CLOSURE} to look for")
    seen = _sees(spawn_server("--pool-size", "0"), programs + ["/usr/bin/ls", "/bin/sh"])
    assert seen == {**{p: False for p in programs}, "/usr/bin/ls": True, "/bin/sh": True}, seen
    control = _sees(spawn_server(*HOST_SETTING), programs)
    assert control == {p: True for p in programs}, f"control: a sandbox on the host's /usr sees them: {control}"
    print(f"\nPINNED ROOT | {programs} absent, the TOOLS there (host /usr control: all visible)")


INTERPRETER_PROBE = f'''
import json, os, sys, sysconfig
stdlib = sysconfig.get_paths()["stdlib"]
print({MARK!r} + json.dumps({{"executable": os.path.realpath(sys.executable), "stdlib": stdlib,
                              "has_os": os.path.isfile(os.path.join(stdlib, "os.py")),
                              "has_tests": os.path.isdir(os.path.join(stdlib, "test")),
                              "programs": {{p: os.path.exists(p) for p in PROGRAMS}}}}))
'''


def test_the_run_s_sandboxes_run_on_a_pinned_interpreter(api, new_sandbox, sandbox_server):
    """Quick, so that an ordinary user's run checks it too: there the image carries no copy of
    its interpreter (Debian's /usr/bin/python3, nothing of /usr copied) and the root holds the
    host's, copied when the root was built. Either way a sandbox of the run's server (default
    settings) reports a root version, its interpreter and standard library work, the host's
    stdlib tests (left out of every root) and programs outside the closure are not there,
    while the host has them."""
    import sysconfig

    from sandbox.isolation.rootfs import TOOLS

    sandbox = new_sandbox(isolation="bwrap")
    version = sandbox["isolation"].get("rootfs_version")
    assert version, f"a bwrap sandbox of the default image runs on no pinned root: {sandbox['isolation']}"
    assert (sandbox_server.state_dir / "rootfs" / version / "rootfs.json").is_file()
    programs = [f"/usr/bin/{p}" for p in OUTSIDE_THE_CLOSURE if p not in TOOLS and os.path.exists(f"/usr/bin/{p}")]
    found = _probe(api, sandbox["id"], f"PROGRAMS = {programs!r}\n" + INTERPRETER_PROBE)
    assert found["has_os"] and os.path.basename(found["executable"]).startswith("python"), found
    assert found["programs"] == {p: False for p in programs}, found
    host_tests = os.path.isdir(os.path.join(sysconfig.get_paths()["stdlib"], "test"))
    if host_tests:
        assert not found["has_tests"], f"the host's stdlib tests are visible: {found}"
    print(f"\nPINNED ROOT | version {version}: {found['executable']}, stdlib {found['stdlib']} "
          f"(host's tests there: {host_tests}, in the sandbox: {found['has_tests']}); absent: {programs}")


ROOT_LINE = f'''
import json
line = next(l.split() for l in open("/proc/self/mountinfo") if l.split()[4] == "/")
print({MARK!r} + json.dumps({{"device": line[2], "root": line[3], "fstype": line[line.index("-") + 1]}}))
'''


def _host_device(mount_point: str) -> str | None:
    with open("/proc/self/mountinfo") as f:
        return next((line.split()[2] for line in f if line.split()[4] == mount_point), None)


@pytest.mark.slow
def test_the_sandbox_root_is_the_pinned_root_and_gvisor_runs_on_the_same(spawn_server):
    """mountinfo's `/` is the pinned root's system view (its ext4 pack's mount where the server
    can loop-mount, else its directory); the bwrap and gVisor sandboxes of the image report one
    root version, the one rootfs.ensure names. Control: on the host's /usr, `/` is bwrap's tmpfs."""
    from sandbox.isolation import gvisor, imagefs

    server = spawn_server("--pool-size", "0")
    with server.client(timeout=180) as api:
        sandbox = support.create(api, isolation="bwrap")
        line = _probe(api, sandbox["id"], ROOT_LINE)
        version = sandbox["isolation"]["rootfs_version"]
        view = json.loads((server.state_dir / "rootfs" / version / "system.json").read_text())
        assert view["version"] == version
        if view.get("pack"):
            assert line["fstype"] == "ext4" and line["root"] == "/", line
            assert line["device"] == _host_device(os.path.realpath(imagefs.mount_point(view["pack"]))), line
        else:
            assert line["root"].endswith(view["tree"]), (line, view)
        record = json.loads((server.state_dir / "rootfs" / version / "rootfs.json").read_text())
        assert record["version"] == version and os.path.isdir(record["path"])
        ok, why = gvisor.available()
        if ok:
            other = support.create(api, isolation="gvisor")
            assert other["isolation"]["rootfs_version"] == version, other["isolation"]
            assert other["isolation"]["rootfs_path"] == record["path"], other["isolation"]
        else:
            print(f"\nPINNED ROOT | no gVisor sandbox to compare with: {why}")
    with spawn_server(*HOST_SETTING).client(timeout=180) as api:
        sandbox = support.create(api, isolation="bwrap")
        control = _probe(api, sandbox["id"], ROOT_LINE)
        assert "rootfs_version" not in sandbox["isolation"], sandbox["isolation"]
    assert control["fstype"] == "tmpfs" and control["device"] != line["device"], control
    print(f"\nPINNED ROOT | / is {line} (version {version}, gVisor's too: {ok}); host /usr control: {control}")


@pytest.mark.slow
def test_the_image_works_on_its_pinned_root(spawn_server):
    """What sandboxes rely on: numpy, pandas, a matplotlib figure (its fonts: the image's own),
    `!ls` and the shell tools, pip's CA bundle, and no /etc of the host's beyond a few files."""
    server = spawn_server("--pool-size", "0")
    with server.client(timeout=180) as api:
        sandbox = support.create(api, isolation="bwrap")
        result = _probe(api, sandbox["id"], f'''
import io, json, os, subprocess
import numpy, pandas, matplotlib.pyplot as plt
fig, ax = plt.subplots(); ax.set_title("fonts"); ax.plot([1, 2]); buf = io.BytesIO(); fig.savefig(buf, format="png")
shell = subprocess.run("ls /workspace >/dev/null && echo a b | awk '{{print $2}}' | sed s/b/ok/ | sort | head -1",
                       shell=True, capture_output=True, text=True)
print({MARK!r} + json.dumps({{"png": len(buf.getvalue()), "frame": int(pandas.DataFrame({{"a": numpy.arange(3)}}).a.sum()),
      "shell": shell.stdout.strip() + shell.stderr, "ca": os.path.getsize("/etc/ssl/certs/ca-certificates.crt") > 0,
      "etc": sorted(os.listdir("/etc"))}}))
''')
    assert result["png"] > 1000 and result["frame"] == 3 and result["shell"] == "ok" and result["ca"], result
    assert "fonts" not in result["etc"] and "apt" not in result["etc"], result["etc"]  # not the host's /etc
