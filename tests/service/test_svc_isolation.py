"""What a cell cannot do: reach the network, see another sandbox, install packages, write
outside /workspace. Each probe runs inside a real sandbox and has a control showing the
same action works where the protection does not apply.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import tempfile

import pytest
from support import cmdline, of_type, process_tree, supervisor_pid
from svc_support import last_json_line, sandbox_for_module

NETWORK_WORDS = ("NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                 "Name or service not known", "Network is unreachable", "No matching distribution found",
                 "Could not find a version", "Operation not permitted", "Permission denied")


@pytest.fixture(scope="module")
def sid(sandbox_server):
    """The probes here leave their sandbox usable: share one."""
    yield from sandbox_for_module(sandbox_server)


def host_addresses() -> list[str]:
    """127.0.0.1 and the host's other IPv4 addresses, if any can be found."""
    found = ["127.0.0.1"]
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=5).stdout
        found += [a for a in out.split() if "." in a and a not in found]
    except (OSError, subprocess.SubprocessError):
        pass
    return found


def test_no_network_from_inside(sid, run):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    addresses = host_addresses()
    try:
        probe = last_json_line(run(sid, f"""
import json, socket, urllib.request
out = {{}}
for address in {addresses!r}:
    try:
        socket.create_connection((address, {port}), timeout=2).close()
        out[address] = "connected"
    except OSError as exc:
        out[address] = [type(exc).__name__, exc.errno, str(exc)]
try:
    urllib.request.urlopen("http://example.com", timeout=3)
    out["http"] = "connected"
except Exception as exc:
    out["http"] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""))
        print("inside the sandbox:", probe)
        for address in addresses:
            assert probe[address] != "connected", probe
            assert probe[address][0] in ("PermissionError", "OSError", "ConnectionRefusedError", "TimeoutError",
                                         "ConnectionError"), probe
        assert probe["http"] != "connected" and probe["http"][0] in ("URLError", "PermissionError", "OSError",
                                                                     "TimeoutError", "socket.gaierror"), probe
        # the listener never saw a connection from the sandbox
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
        # control: from the host the same listener accepts, on every address tried
        listener.setblocking(True)
        listener.settimeout(5)
        for address in addresses:
            with socket.create_connection((address, port), timeout=5):
                conn, _ = listener.accept()
                conn.close()
    finally:
        listener.close()


def test_sandboxes_cannot_see_each_other(sandbox_server, sid, new_sandbox, run):
    a = sid
    b = new_sandbox()["id"]
    marker = "7371"
    seen_by_a = last_json_line(run(a, "\n".join([
        "import json, os, subprocess, time",
        "open('/workspace/secret.txt', 'w').write('only for A')",
        f"keeper = subprocess.Popen(['sleep', '{marker}'])",
        "time.sleep(0.2)",
        "cmds = [open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode() for p in os.listdir('/proc') if p.isdigit()]",
        "print(json.dumps({'cmds': cmds, 'exists': os.path.exists('/workspace/secret.txt')}))",
    ])))
    # control: A itself sees its file and its marker process
    assert seen_by_a["exists"] is True
    assert any(f"sleep {marker}" in c for c in seen_by_a["cmds"]), seen_by_a

    a_workspace = str(sandbox_server.state_dir / "sandboxes" / a / "workspace")
    seen_by_b = last_json_line(run(b, "\n".join([
        "import json, os",
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]",
        "cmds = [open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode() for p in pids]",
        "def probe(path):",
        "    try:",
        "        return sorted(os.listdir(path))",
        "    except OSError as exc:",
        "        return type(exc).__name__",
        "print(json.dumps({'exists': os.path.exists('/workspace/secret.txt'), 'workspace': os.listdir('/workspace'),",
        f"    'pids': pids, 'cmds': cmds, 'a_host_dir': probe({a_workspace!r}),",
        f"    'sandboxes_dir': probe({str(sandbox_server.state_dir / 'sandboxes')!r}),",
        f"    'token': os.path.exists({str(sandbox_server.state_dir / 'token')!r}), 'above': probe('/workspace/..')}}))",
    ])))
    print("inside B:", seen_by_b)
    assert seen_by_b["exists"] is False
    assert seen_by_b["workspace"] == []
    assert seen_by_b["a_host_dir"] == "FileNotFoundError"
    assert seen_by_b["sandboxes_dir"] == "FileNotFoundError"
    assert seen_by_b["token"] is False
    assert a not in json.dumps(seen_by_b["above"]) and "sandboxes" not in seen_by_b["above"], seen_by_b
    assert not any(marker in c for c in seen_by_b["cmds"]), seen_by_b
    # B's /proc holds its own few processes: bwrap's init, its runtime (and what the probe ran)
    assert len(seen_by_b["pids"]) <= 4, seen_by_b
    assert all(int(p) < 100 for p in seen_by_b["pids"]), seen_by_b

    # and on the host, A's marker process is under A's supervisor, not B's
    tree_a = {" ".join(cmdline(p)) for p in process_tree(supervisor_pid(sandbox_server, a))}
    tree_b = {" ".join(cmdline(p)) for p in process_tree(supervisor_pid(sandbox_server, b))}
    assert f"sleep {marker}" in tree_a and f"sleep {marker}" not in tree_b


def test_pip_install_fails_inside(sid, run):
    probe = last_json_line(run(sid, "\n".join([
        "import importlib.util, json, subprocess, sys",
        "before = importlib.util.find_spec('six') is not None",
        "version = subprocess.run([sys.executable, '-m', 'pip', '--version'], capture_output=True, text=True)",
        "r = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', '--disable-pip-version-check',",
        "                    '--retries', '0', '--timeout', '3', 'six'], capture_output=True, text=True)",
        "print(json.dumps({'before': before, 'pip_version_rc': version.returncode, 'rc': r.returncode,",
        "                  'output': (r.stdout + r.stderr)[-3000:]}))",
    ])))
    print("pip inside:", probe)
    assert probe["before"] is False, "six is in the image: pick a package that is not"
    assert probe["pip_version_rc"] == 0, "pip itself does not run in the sandbox, so this probe proves nothing"
    assert probe["rc"] != 0, probe
    assert any(word in probe["output"] for word in NETWORK_WORDS), probe["output"]
    events = run(sid, "import six")
    assert [e["ename"] for e in of_type(events, "error")] == ["ModuleNotFoundError"], events

    # control: the host, with the network the sandbox lacks, can fetch the same package
    with tempfile.TemporaryDirectory() as d:
        host = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                               "--disable-pip-version-check", "-d", d, "six"],
                              capture_output=True, text=True, timeout=120)
        if host.returncode != 0:
            print("control skipped: the host cannot reach the package index either:", host.stdout[-500:], host.stderr[-500:])
        else:
            assert any(name.startswith("six-") for name in os.listdir(d))


def test_writes_outside_workspace_fail(sid, run):
    probe = last_json_line(run(sid, "\n".join([
        "import json",
        "out = {}",
        "for path in ['/etc/x', '/usr/x', '/opt/x', '/x', '/bin/x', '/proc/x', '/tmp/x', '/workspace/x']:",
        "    try:",
        "        with open(path, 'w') as f:",
        "            f.write('data')",
        "        out[path] = open(path).read()",
        "    except OSError as exc:",
        "        out[path] = [type(exc).__name__, exc.errno]",
        "print(json.dumps(out))",
    ])))
    print("writes inside:", probe)
    for path in ("/etc/x", "/usr/x", "/opt/x", "/x", "/bin/x", "/proc/x"):
        assert isinstance(probe[path], list), (path, probe)
        assert probe[path][1] in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT), (path, probe)
    for path in ("/etc/x", "/usr/x", "/opt/x"):
        assert probe[path][1] in (errno.EROFS, errno.EACCES, errno.EPERM), (path, probe)
    # control: the two writable places are writable
    assert probe["/tmp/x"] == "data"
    assert probe["/workspace/x"] == "data"
