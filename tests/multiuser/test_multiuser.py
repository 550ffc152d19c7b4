"""Many users on one machine, with real Unix accounts (``useradd``, ``runuser``).

- A system-wide server (``serve --multi-user``, as root) ties each request on its socket to
  the caller's uid (SO_PEERCRED): a user lists, runs code in, reads files of and deletes only
  their own sandboxes; another user's id answers 404 exactly like an unknown one.
- A per-user server's socket (0600) cannot even be connected to by another user.
- Two users, each starting sandbox kernels through jupyter_client on the embedded default
  at the same time: each gets a server of their own (one, even for two kernels at once),
  and neither reaches the other's server, sandboxes or files.

The example notebooks as an ordinary user runs them (nbval, the embedded default) are
validated by tests/docs/test_fresh_clone.py, with README's own install.

The test users run Debian's /usr/bin/python3 (root's interpreter is under /root, 0700): the
HTTP checks with a standard-library client (peer_request.py); the kernels from a venv built
once per module with that interpreter in a world-readable directory (pip's cache keeps it
to seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import pwd
import re
import threading
import typing as t
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

import support

pytestmark = pytest.mark.slow

SYSTEM_PYTHON = "/usr/bin/python3"


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("creating test users needs root")
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing: the test users need an interpreter they may run")


@pytest.fixture(scope="module")
def users() -> list[str]:
    """Two fresh unprivileged accounts with private homes, removed afterwards."""
    _skip_unless_possible()
    made = []
    try:
        for tag in ("a", "b"):
            name = f"sbk{tag}{secrets.token_hex(3)}"
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
            made.append(name)
            home = pathlib.Path(os.path.expanduser(f"~{name}"))
            home.chmod(0o700)
        yield made
    finally:
        for name in made:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
            subprocess.run(["userdel", "--remove", name], capture_output=True)


@pytest.fixture(scope="module")
def client_script() -> pathlib.Path:
    """peer_request.py where every user can read it (the checkout may be under /root)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="sbk-peer-", dir="/tmp"))
    d.chmod(0o755)
    script = d / "peer_request.py"
    shutil.copy(pathlib.Path(__file__).with_name("peer_request.py"), script)
    script.chmod(0o644)
    yield script
    shutil.rmtree(d, ignore_errors=True)


def as_user(user: str, script: pathlib.Path, sock: pathlib.Path, method: str, path: str,
            body: dict | None = None) -> dict:
    argv = ["runuser", "-u", user, "--", SYSTEM_PYTHON, str(script), str(sock), method, path]
    if body is not None:
        argv.append(json.dumps(body))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd="/")
    assert r.returncode == 0, r
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def shared_server(sandbox_server: support.Server) -> support.Server:
    state = support.make_state_dir("sbk-mu-", images_from=sandbox_server.state_dir)
    server = support.Server(state, "--multi-user", "--pool-size", "0", token=secrets.token_hex(16))
    with server:
        yield server


def test_shared_server_ties_each_request_to_its_user(users, client_script, shared_server):
    alice, bob = users
    sock = shared_server.state_dir / "server.sock"
    assert oct(os.stat(sock).st_mode & 0o777) == "0o666"

    def call(user, method, path, body=None):
        return as_user(user, client_script, sock, method, path, body)

    created = call(alice, "POST", "/v1/sandboxes", {"ttl_seconds": 600})
    assert created["status"] == 201, created
    sid = created["body"]["id"]
    ran = call(alice, "POST", f"/v1/sandboxes/{sid}/execute", {"code": "secret = 'alice-41'; open('notes.txt', 'w').write(secret)"})
    assert ran["status"] == 200 and ran["body"][-1]["status"] == "ok", ran
    assert [f["path"] for f in call(alice, "GET", f"/v1/sandboxes/{sid}/files")["body"]["files"]] == ["notes.txt"]

    # Bob: alice's sandbox is not there, answered exactly as an unknown id.
    unknown = call(bob, "GET", "/v1/sandboxes/sbx-0000000000000000")
    assert unknown["status"] == 404
    assert call(bob, "GET", "/v1/sandboxes")["body"]["sandboxes"] == []
    for method, path, body in [("GET", "", None), ("POST", "/execute", {"code": "print(secret)"}),
                               ("GET", "/files", None), ("GET", "/files/notes.txt", None),
                               ("POST", "/commands", {"shell": "cat notes.txt"}), ("GET", "/commands", None),
                               ("POST", "/renew", {}), ("POST", "/interrupt", None), ("DELETE", "", None)]:
        answer = call(bob, method, f"/v1/sandboxes/{sid}{path}", body)
        assert answer["status"] == 404, (method, path, answer)
        assert answer["body"]["error"]["message"] == unknown["body"]["error"]["message"].replace(
            "sbx-0000000000000000", sid), answer
    assert call(bob, "DELETE", "/v1/images/default")["status"] == 403

    # Bob's own sandbox works, and alice does not see it.
    bobs = call(bob, "POST", "/v1/sandboxes", {"ttl_seconds": 600})
    assert bobs["status"] == 201, bobs
    assert [s["id"] for s in call(bob, "GET", "/v1/sandboxes")["body"]["sandboxes"]] == [bobs["body"]["id"]]
    assert [s["id"] for s in call(alice, "GET", "/v1/sandboxes")["body"]["sandboxes"]] == [sid]
    assert call(alice, "GET", f"/v1/sandboxes/{bobs['body']['id']}")["status"] == 404

    # Alice's sandbox survived bob's attempts; the administrator (token, TCP) sees both.
    again = call(alice, "POST", f"/v1/sandboxes/{sid}/execute", {"code": "secret"})
    assert again["body"][-1]["status"] == "ok" and "alice-41" in json.dumps(again["body"]), again
    with shared_server.client() as admin:
        listed = admin.get("/v1/sandboxes").json()["sandboxes"]
        assert {s["id"]: s["owner"]["name"] for s in listed} == {sid: alice, bobs["body"]["id"]: bob}
        assert {s["owner"]["uid"] for s in listed} == {pwd.getpwnam(alice).pw_uid, pwd.getpwnam(bob).pw_uid}
        assert "sandboxes_by_owner" not in admin.get("/metrics").text  # unbounded labels only when asked
    # Root's `ls` (over the socket: root sees all) names each sandbox's owner, and so does --json.
    ls = subprocess.run([sys.executable, "-m", "sandbox", "ls", "--url", f"unix:{sock}"], capture_output=True,
                        text=True, timeout=120, env=support.with_repo_on_path(dict(os.environ)))
    assert ls.returncode == 0 and "OWNER" in ls.stdout.splitlines()[0], ls
    rows = {line.split()[0]: line.split()[1] for line in ls.stdout.splitlines()[1:]}
    assert rows == {sid: alice, bobs["body"]["id"]: bob}, ls.stdout
    as_json = subprocess.run([sys.executable, "-m", "sandbox", "ls", "--json", "--url", f"unix:{sock}"],
                             capture_output=True, text=True, timeout=120,
                             env=support.with_repo_on_path(dict(os.environ)))
    assert {s["id"]: s["owner"]["name"] for s in json.loads(as_json.stdout)} == {sid: alice, bobs["body"]["id"]: bob}
    assert call(alice, "DELETE", f"/v1/sandboxes/{sid}")["status"] == 200


def test_metrics_name_owners_only_when_the_operator_asks(users, client_script, sandbox_server):
    """metrics_owner_label: one series per owner on /metrics (the shared server above, without
    the setting, has none)."""
    state = support.make_state_dir("sbk-mu-", images_from=sandbox_server.state_dir)
    server = support.Server(state, "--multi-user", "--pool-size", "0", "--set", "metrics_owner_label=true",
                            token=secrets.token_hex(16))
    with server:
        made = as_user(users[0], client_script, state / "server.sock", "POST", "/v1/sandboxes", {"ttl_seconds": 600})
        assert made["status"] == 201, made
        with server.client() as admin:
            text = admin.get("/metrics").text
            admin.delete(f"/v1/sandboxes/{made['body']['id']}")
    assert f'sandbox_kernel_sandboxes_by_owner{{owner="{users[0]}"}} 1.0' in text, text[-2000:]


def test_a_per_user_socket_refuses_other_users(users, client_script, sandbox_server):
    """The session server (root's, per-user): another user cannot connect at all."""
    sock = sandbox_server.state_dir / "server.sock"
    assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
    answer = as_user(users[1], client_script, sock, "GET", "/v1/sandboxes")
    assert answer.get("error", "").startswith("PermissionError"), answer


@contextlib.contextmanager
def installed_for_every_user(prefix: str, extra: str = "") -> t.Iterator[pathlib.Path]:
    """The project (with ``extra``, e.g. ``[lab]``) installed, not editable (the checkout
    may be unreadable to others), into ``ROOT/venv`` of /usr/bin/python3, which every user
    can run; ROOT is yielded, readable by all, and removed after."""
    _skip_unless_possible()
    root = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        src = root / "src"
        for part in ("sandbox", "kernel", "kernelspec"):
            shutil.copytree(support.REPO / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        for part in ("pyproject.toml", "README.md"):
            shutil.copy(support.REPO / part, src / part)
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(root / "venv")], check=True, capture_output=True)
        r = subprocess.run([str(root / "venv/bin/pip"), "install", "-q", "--disable-pip-version-check", f"{src}{extra}"],
                           capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, r.stderr[-3000:]
        subprocess.run(["chmod", "-R", "a+rX", str(root)], check=True)
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def user_venv() -> t.Iterator[pathlib.Path]:
    """The project installed for every user, with the script each user's kernels run."""
    with installed_for_every_user("sbk-uvenv-") as root:
        shutil.copy(pathlib.Path(__file__).with_name("user_kernels.py"), root / "user_kernels.py")
        (root / "user_kernels.py").chmod(0o644)
        yield root


def seed_images(user: str, sandbox_server: support.Server) -> pathlib.Path:
    """The user's default state directory, with the session's image borrowed (as
    make_state_dir does), so that each user's first kernel does not build one."""
    home = pathlib.Path(os.path.expanduser(f"~{user}"))
    state = home / ".local/share/sandbox-kernel"
    dest = state / "images/default"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox_server.state_dir / "images/default/image.json", dest / "image.json")
    subprocess.run(["chown", "-R", f"{user}:", str(home / ".local")], check=True)
    return state


def test_two_users_kernels_on_the_embedded_default(users, user_venv, sandbox_server):
    states = {user: seed_images(user, sandbox_server) for user in users}
    outputs: dict[str, subprocess.CompletedProcess] = {}

    def start(user: str, other: str, count: int) -> None:
        outputs[user] = subprocess.run(
            [shutil.which("runuser"), "-u", user, "--", str(user_venv / "venv/bin/python"), str(user_venv / "user_kernels.py"),
             str(count), str(states[other])],
            capture_output=True, text=True, timeout=1200, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": os.path.expanduser(f"~{user}")})

    alice, bob = users
    try:
        # Both users at once; alice with two kernels at once, which must share one server.
        threads = [threading.Thread(target=start, args=(alice, bob, 2)), threading.Thread(target=start, args=(bob, alice, 1))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        for user in users:
            proc = outputs[user]
            assert proc.returncode == 0 and "RESULT " in proc.stdout, (user, proc.stdout[-3000:], proc.stderr[-3000:])
        results = {user: json.loads(outputs[user].stdout.split("RESULT ", 1)[1]) for user in users}
        assert len(results[alice]) == 2 and len(results[bob]) == 1
        for user in users:
            for r in results[user]:
                assert r["cell"] == "answer 42\n", (user, r)
                # each kernel talks to its own user's socket, no other
                assert f"server     unix:{states[user]}/server.sock" in r["sandbox"], (user, r["sandbox"])
                assert r["probe"] == "refused\n", (user, r)
                assert re.search(r"^isolation .*own user namespace", r["sandbox"], re.M), r["sandbox"]
        for user in users:
            log = (states[user] / "server.log").read_text(errors="replace")
            assert log.count("--- started by kernel pid") == 1, log[-3000:]  # alice's two kernels: one server
            sock = states[user] / "server.sock"
            owner = os.stat(sock).st_uid
            assert owner == int(subprocess.run(["id", "-u", user], capture_output=True, text=True).stdout)
        # Bob cannot reach alice's server even by its path.
        probe = subprocess.run(["runuser", "-u", bob, "--", SYSTEM_PYTHON, "-c",
                                f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(states[alice] / 'server.sock')!r})"],
                               capture_output=True, text=True)
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe
        # Shut-down kernels left no sandbox running (the warm pool's may still be starting).
        for user in users:
            live = support.running_in(states[user])
            assert not live, (user, live)
    finally:
        for user in users:
            stop_users_server(states[user])


def stop_users_server(state: pathlib.Path) -> None:
    """The server a user's first kernel started outlives the kernels: stopped, and all it left swept."""
    try:
        pid = json.loads((state / "server.json").read_text())["pid"]
        support.signal_server(pid, 15)
        support.wait_for(lambda: not support.pid_alive(pid), 30)
    except (OSError, ValueError, KeyError):
        pass
    support.sweep(state)


def small_shared_server(sandbox_server: support.Server, *settings: str) -> support.Server:
    """A --multi-user server with room for four sandboxes (and the given settings)."""
    state = support.make_state_dir("sbk-mu-cap-", images_from=sandbox_server.state_dir)
    args = [a for s in ("max_sandboxes=4", *settings) for a in ("--set", s)]
    return support.Server(state, "--multi-user", "--pool-size", "0", *args, token=secrets.token_hex(16))


def test_one_user_cannot_take_the_capacity_of_others(users, client_script, sandbox_server):
    """Red team: alice creates sandboxes until refused. She gets her share (user_share 0.5 of
    4) and a 409 naming her uid and what is free of her share; bob still gets his. Control:
    with user_share 1 (no per-user cap) alice takes all four and bob is left with 0 free."""
    import pwd

    alice, bob = users
    alice_uid = pwd.getpwnam(alice).pw_uid

    def grab(server: support.Server, user: str, n: int) -> list[dict]:
        sock = server.state_dir / "server.sock"
        return [as_user(user, client_script, sock, "POST", "/v1/sandboxes", {"ttl_seconds": 300}) for _ in range(n)]

    with small_shared_server(sandbox_server) as server:
        alices = grab(server, alice, 3)
        assert [a["status"] for a in alices] == [201, 201, 409], alices
        refusal = alices[2]["body"]["error"]
        assert refusal["code"] == "capacity_exceeded" and refusal["user"] == alice_uid, refusal
        assert f"uid {alice_uid}'s share of this server is used" in refusal["message"], refusal
        assert refusal["free"]["sandboxes"] == 0 and refusal["exceeded"]["sandboxes"]["server_free"] == 2, refusal
        assert [b["status"] for b in grab(server, bob, 2)] == [201, 201]
    with small_shared_server(sandbox_server, "user_share=1") as server:
        assert [a["status"] for a in grab(server, alice, 4)] == [201] * 4
        bobs = grab(server, bob, 1)[0]
        assert bobs["status"] == 409 and "0 free" in bobs["body"]["error"]["message"], bobs


def test_one_user_cannot_spend_the_secret_room_of_others(users, client_script, sandbox_server):
    """Red team: alice registers secrets until refused (secrets_max_per_user 2): a 409
    limit_exceeded with the caps, and a value past the size cap a 422; replacing one of hers
    by its name still works. Bob, at the same time, registers his two under the same names:
    each user's secrets are their own, counted and listed apart."""
    def put(user: str, sock: pathlib.Path, name: str, value: str = "sk-test") -> dict:
        return as_user(user, client_script, sock, "PUT", f"/v1/secrets/{name}", {"value": value, "hosts": ["api.example"]})

    alice, bob = users
    with small_shared_server(sandbox_server, "secrets_max_per_user=2", "secrets_max_value_bytes=64") as server:
        sock = server.state_dir / "server.sock"
        assert [put(alice, sock, n)["status"] for n in ("one", "two")] == [200, 200]
        third = put(alice, sock, "three")
        assert third["status"] == 409 and third["body"]["error"]["code"] == "limit_exceeded", third
        assert third["body"]["error"]["limits"]["max_secrets"] == 2, third
        big = put(alice, sock, "one", "x" * 65)
        assert big["status"] == 422 and big["body"]["error"]["code"] == "limit_exceeded", big
        assert put(alice, sock, "one", "sk-replaced")["status"] == 200
        # Control: bob's room is his own, though alice is at her cap and uses the same names.
        assert [put(bob, sock, n)["status"] for n in ("one", "two")] == [200, 200]
        assert put(bob, sock, "three")["status"] == 409
        listed = {u: sorted(s["name"] for s in as_user(u, client_script, sock, "GET", "/v1/secrets")["body"]["secrets"])
                  for u in (alice, bob)}
        assert listed == {alice: ["one", "two"], bob: ["one", "two"]}, listed
        assert as_user(bob, client_script, sock, "DELETE", "/v1/secrets/one")["status"] == 200
        assert put(alice, sock, "three")["status"] == 409  # bob's delete freed bob's room, not alice's


PEEK = '''
import json, os, sys
needle, paths = json.load(sys.stdin)  # not on our own argv: the paths name the id too
argv_hits = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if needle.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            argv_hits.append(pid)
    except OSError:
        pass
readable = []
for path in paths:
    try:
        open(path, "rb").read(1)
        readable.append(path)
    except OSError:
        pass
print(json.dumps({"argv": argv_hits, "readable": readable}))
'''


def peek_as(user: str, needle: str, paths: list[pathlib.Path]) -> dict:
    r = subprocess.run(["runuser", "-u", user, "--", SYSTEM_PYTHON, "-c", PEEK],
                       input=json.dumps([needle, [str(p) for p in paths]]), capture_output=True, text=True, timeout=60,
                       cwd="/")
    assert r.returncode == 0, r
    return json.loads(r.stdout)


def test_another_user_sees_no_sandbox_id_in_ps_and_reads_no_log(users, client_script, shared_server):
    """Bob looks for alice's sandbox id on every command line (what `ps` shows) and tries her
    sandbox's supervisor and runtime logs. Controls: a process with the id on its argv, and a
    0644 file next to the logs, which the same probe does find and read."""
    alice, bob = users
    created = as_user(alice, client_script, shared_server.state_dir / "server.sock", "POST", "/v1/sandboxes",
                      {"ttl_seconds": 600})
    sid = created["body"]["id"]
    directory = shared_server.state_dir / "sandboxes" / sid
    logs = [directory / "supervisor.log", directory / "runtime.log"]
    control_file = directory / "probe-control.txt"
    control_file.write_text("readable")
    control_file.chmod(0o644)
    control = subprocess.Popen([SYSTEM_PYTHON, "-c", "import time; time.sleep(60)", sid])  # the id on argv, as before
    try:
        assert all(p.exists() for p in logs), logs
        assert oct(directory.stat().st_mode & 0o777) in ("0o711", "0o700")
        seen = peek_as(bob, sid, [*logs, control_file])
        assert seen["argv"] == [str(control.pid)], seen  # only the control's
        assert seen["readable"] == [str(control_file)], seen
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in logs)
    finally:
        control.kill()
        control.wait()
        control_file.unlink()
        as_user(alice, client_script, shared_server.state_dir / "server.sock", "DELETE", f"/v1/sandboxes/{sid}")


def done_of(answer: dict) -> dict:
    """An execute's done event (one NDJSON line reads as one object, several as a list)."""
    events = answer["body"] if isinstance(answer["body"], list) else [answer["body"]]
    return events[-1]


def start_users_server(user: str, user_venv: pathlib.Path, state: pathlib.Path) -> subprocess.Popen:
    """`sandbox-kernel serve` as `user` on `state` (the user's own), up when its socket answers."""
    home = os.path.expanduser(f"~{user}")
    log = open(state / "server.log", "ab")
    proc = subprocess.Popen([shutil.which("runuser"), "-u", user, "--", str(user_venv / "venv/bin/sandbox-kernel"),
                             "serve", "--state-dir", str(state), "--pool-size", "0"], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": home})
    log.close()
    assert support.wait_for(lambda: _answers(state / "server.sock") or proc.poll() is not None, 120), "no socket"
    assert proc.poll() is None, (state / "server.log").read_text(errors="replace")[-3000:]
    return proc


def _answers(sock: pathlib.Path) -> bool:
    """Whether a server listens on `sock` (root may connect to any user's socket)."""
    import socket

    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


def test_an_ordinary_users_server_measures_usage_and_restarts_with_egress(users, user_venv, client_script,
                                                                          sandbox_server):
    """As an ordinary user (no root, no cgroup): a sandbox's CPU and memory are measured (from
    its processes in /proc), not 0; the server restarts while a sandbox with an egress policy
    lives (its CA bundle, 0444, is written again: root could, the user could not); a gVisor
    sandbox is refused naming the kernel that runs here."""
    user = users[0]
    home = pathlib.Path(os.path.expanduser(f"~{user}"))
    state = home / "own-state"
    dest = state / "images/default"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(sandbox_server.state_dir / "images/default/image.json", dest / "image.json")
    subprocess.run(["chown", "-R", f"{user}:", str(state)], check=True)
    sock = state / "server.sock"
    server = start_users_server(user, user_venv, state)
    try:
        made = as_user(user, client_script, sock, "POST", "/v1/sandboxes",
                       {"ttl_seconds": 600, "egress": {"allow": ["example.invalid"]}})
        assert made["status"] == 201, made
        sid = made["body"]["id"]
        ran = as_user(user, client_script, sock, "POST", f"/v1/sandboxes/{sid}/execute",
                      {"code": "block = b'\\x01' * (96 * 2**20)  # written: resident\nx = sum(range(3 * 10**7))"})
        assert done_of(ran)["status"] == "ok", ran
        assert support.wait_for(lambda: as_user(user, client_script, sock, "GET", f"/v1/sandboxes/{sid}")["body"]
                                ["usage"].get("measured_by") == "processes", 30)
        usage = as_user(user, client_script, sock, "GET", f"/v1/sandboxes/{sid}")["body"]["usage"]
        assert usage["memory_bytes"] >= 96 * 2**20 and usage["memory_peak_bytes"] >= usage["memory_bytes"], usage
        assert usage["cpu_seconds"] > 0.1 and usage["processes"] >= 1, usage

        server.send_signal(signal.SIGTERM)  # runuser passes it on, and ends by it
        server.wait(60)
        assert support.wait_for(lambda: not _answers(sock), 60), "the server still answers after SIGTERM"
        server = start_users_server(user, user_venv, state)
        again = as_user(user, client_script, sock, "POST", f"/v1/sandboxes/{sid}/execute", {"code": "print(len(block))"})
        assert done_of(again)["status"] == "ok" and str(96 * 2**20) in json.dumps(again["body"]), \
            (again, (state / "server.log").read_text(errors="replace")[-3000:])
        assert "PermissionError" not in (state / "server.log").read_text(errors="replace")
        # The gVisor tier cannot run for this user: the refusal names the kernel to use instead.
        refused = as_user(user, client_script, sock, "POST", "/v1/sandboxes", {"isolation": "gvisor"})
        assert refused["status"] == 422, refused
        assert 'the kernel "Python (sandbox)"' in refused["body"]["error"]["message"], refused
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
        support.sweep(state)


def test_doctor_names_root_as_what_the_gvisor_tier_lacks(users, user_venv):
    """An ordinary user with runsc installed: doctor says to run the server as root, not to
    install runsc. Where runsc is not installed here, a stand-in that answers --version as
    runsc does is put first on PATH (the package is the boundary; what is tested is doctor)."""
    user = users[1]
    path = "/usr/bin:/bin"
    bindir = pathlib.Path(tempfile.mkdtemp(prefix="sbk-runsc-", dir="/tmp"))
    try:
        if shutil.which("runsc") is None:
            bindir.chmod(0o755)
            stand_in = bindir / "runsc"
            stand_in.write_text("#!/bin/sh\necho 'runsc version release-20260101.0'\n")
            stand_in.chmod(0o755)
            path = f"{bindir}:{path}"
        r = subprocess.run([shutil.which("runuser"), "-u", user, "--", str(user_venv / "venv/bin/sandbox-kernel"),
                            "doctor", "--json"], capture_output=True, text=True, timeout=120, cwd="/",
                           env={"PATH": path, "HOME": os.path.expanduser(f"~{user}")})
    finally:
        shutil.rmtree(bindir, ignore_errors=True)
    items = {i["name"]: i for i in json.loads(r.stdout)}
    tier = items["gvisor tier (runsc)"]
    assert "root" in tier["detail"] and "apt-get install runsc" not in tier.get("fix", ""), tier
    assert tier["fix"].startswith("runsc is installed; run the server as root"), tier
