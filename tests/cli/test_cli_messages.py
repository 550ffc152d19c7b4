"""Every message the CLI prints on its error paths and when it has nothing to do, as a
newcomer meets them: the real CLI in a subprocess, on a fresh state directory with no server
and on a server of this module's own.

Each message is one line, is not a traceback, and names a next step (a command, an option,
a variable or what to give); a command that cannot do its job exits non-zero, one with
nothing to do exits 0 and says so. docs/cli-messages.md lists them all, and the test compares
that listing with what the CLI prints, so that neither drifts
(SANDBOX_KERNEL_TEST_WRITE_DOCS=1 rewrites it from the CLI instead).
"""

from __future__ import annotations

import os
import pathlib
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import typing as t

import pytest

import support
from support import REPO, with_repo_on_path

pytestmark = pytest.mark.slow  # some thirty CLI runs

DOC = REPO / "docs" / "cli-messages.md"
SYSTEM_PYTHON = "/usr/bin/python3"  # root's interpreter may sit where a test user cannot reach
# What a next step looks like: a command to run, an option or variable to set, a thing to give.
NEXT_STEP = re.compile(r"sandbox-kernel \w|--[a-z]|SANDBOX_KERNEL_\w|pip install|run as|\bgive\b|\buse\b|\bstart\b")

# (the command as typed after `sandbox-kernel`, its exit status). STATE is a fresh state
# directory where no server runs (the first two run before any other makes it).
WITHOUT_A_SERVER = [
    ("stop --state-dir STATE", 0),
    ("purge --state-dir STATE", 0),
    ("ls --state-dir STATE", 0),
    ("ls --url http://127.0.0.1:9", 1),
    ("ls --url ftp://example.org", 1),
    ("rm --state-dir STATE", 2),
    ("rm sbx-0123456789abcdef --state-dir STATE", 1),
    ("rm --all --state-dir STATE", 0),
    ("exec --state-dir STATE sbx-0123456789abcdef", 2),
    ("exec --state-dir STATE sbx-0123456789abcdef -- true", 1),
    ("logs sbx-0123456789abcdef --state-dir STATE", 1),
    ("usage --state-dir STATE --since yesterday", 2),
    ("usage --state-dir STATE", 1),
    ("drain --state-dir STATE", 1),
    ("image ls --state-dir STATE", 0),
    ("image inspect nope --state-dir STATE", 1),
    ("image build nope --state-dir STATE --requirements STATE/missing.txt", 2),
    ("image rm nope --state-dir STATE", 1),
    ("image rm nope --state-dir STATE --force", 1),
    ("install --image 'a b'", 2),
    ("serve --state-dir STATE --set no_such_setting=1", 1),
    ("serve --state-dir STATE --pool-image stats", 1),
    ("serve --state-dir STATE --host 0.0.0.0", 2),
    ("gateway --node http://127.0.0.1:9", 2),
    ("user-token alice", 2),
    ("mcp --transport http --port 9", 1),
]
# On a running server (SERVER: its URL); the ids are of no sandbox.
ON_A_SERVER = [
    ("ls --url SERVER", 0),
    ("rm --all --url SERVER", 0),
    ("rm sbx-0123456789abcdef --url SERVER", 1),
    ("exec --url SERVER sbx-0123456789abcdef -- true", 1),
    ("usage --url SERVER", 0),
    ("serve --state-dir STATE --port 1", 2),
]


def cli(command: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sandbox", *shlex.split(command)], cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def clean_env(**extra: str) -> dict[str, str]:
    env = with_repo_on_path({k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")})
    return env | extra


def message_of(run: subprocess.CompletedProcess, replace: dict[str, str]) -> str:
    text = (run.stdout + run.stderr).strip()
    for real, shown in replace.items():
        text = text.replace(real, shown)
    return re.sub(r"\(pid \d+\)", "(pid PID)", text)


def check_all(cases: list[tuple[str, int]], replace: dict[str, str], env: dict[str, str]) -> list[tuple[str, int, str]]:
    """Run each case; the rows of the listing (command, status, message)."""
    rows, wrong = [], []
    for command, status in cases:
        typed = command
        for real, shown in replace.items():
            typed = typed.replace(shown, real)
        run = cli(typed, env)
        message = message_of(run, replace)
        rows.append((command, run.returncode, message))
        problems = [why for why, bad in (
            (f"exit status {run.returncode}, not {status}", run.returncode != status),
            ("a traceback", "Traceback" in message),
            ("not one line", len(message.splitlines()) != 1),
            ("no next step", status != 0 and not NEXT_STEP.search(message)),
        ) if bad]
        if problems:
            wrong.append(f"sandbox-kernel {command}: {', '.join(problems)}:\n    {message[:600]}")
    assert not wrong, "\n".join(wrong)
    return rows


def listing(title: str, rows: list[tuple[str, int, str]]) -> str:
    lines = [f"## {title}", "", "| command | exit status | what it prints |", "|---|---|---|"]
    for command, status, message in rows:
        shown = message.replace("|", "\\|")
        lines.append(f"| `sandbox-kernel {command}` | {status} | {shown} |")
    return "\n".join(lines) + "\n"


def section(title: str) -> str:
    """The listing's section `title` in docs/cli-messages.md (to its next heading)."""
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end + 1 if end != -1 else len(text)]


def compare_with_doc(title: str, rows: list[tuple[str, int, str]]) -> None:
    expected = listing(title, rows)
    if os.environ.get("SANDBOX_KERNEL_TEST_WRITE_DOCS") == "1":  # with -n 0: one writer
        text = DOC.read_text()
        DOC.write_text(text.replace(section(title).rstrip("\n") + "\n", expected))
        return
    assert section(title).strip() == expected.strip(), \
        f"docs/cli-messages.md's {title!r} is not what the CLI prints:\n{expected}"


def test_every_message_without_a_server_names_a_next_step(tmp_path):
    state = tmp_path / "state"
    rows = check_all(WITHOUT_A_SERVER, {str(state): "STATE"}, clean_env())
    compare_with_doc("Without a server", rows)


@pytest.fixture(scope="module")
def server(image_source):
    srv = support.own_server(image_source)
    srv.start()
    yield srv
    srv.close()


def test_every_message_on_a_server_names_a_next_step(server):
    rows = check_all(ON_A_SERVER, {server.url: "SERVER", str(server.state_dir): "STATE"},
                     clean_env(SANDBOX_KERNEL_TOKEN=server.token))
    compare_with_doc("On a running server", rows)


def test_the_listing_has_no_command_the_test_does_not_run():
    listed = set(re.findall(r"^\| `sandbox-kernel (.+?)` \|", DOC.read_text(), re.M))
    assert listed == {c for c, _ in WITHOUT_A_SERVER + ON_A_SERVER}


def test_the_probes_fire_on_a_traceback_and_on_a_message_without_a_next_step():
    """The control: a case whose message has no next step, or whose command fails with a
    traceback, is reported (here `--help` of an unknown option: argparse's usage line)."""
    with pytest.raises(AssertionError, match="no next step|exit status"):
        check_all([("ls --no-such-option", 1)], {}, clean_env())
    assert NEXT_STEP.search("error: no image named 'x' (sandbox-kernel image ls lists them)")
    assert not NEXT_STEP.search("error: no image named 'x'")


def test_help_is_plain_text_and_names_every_command():
    """No reStructuredText literals; the summary is generated from the subcommands, so a
    new one (or `image inspect`) cannot be left out."""
    import argparse

    from sandbox.cli import build_parser, command_summary

    run = cli("--help", clean_env())
    assert run.returncode == 0 and "``" not in run.stdout, run.stdout
    summary = " ".join(run.stdout.split("commands:", 1)[1].split("\n\n")[0].split())
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "image build/ls/inspect/rm" in summary
    for name in sub.choices:
        assert f" {name} " in f" {summary} ", (name, summary)
    sub.add_parser("brand-new")  # the control: a command added later is in the summary too
    assert command_summary(sub).endswith("| brand-new")


def test_serve_beside_a_socket_only_server_says_how_to_get_tcp_and_the_advice_works(image_source):
    """`serve --port` on a state directory whose server (say, `lab`'s embedded one) has no
    TCP: refused, saying to stop it or use another state directory; doing the first (stop,
    then the same command) gives a server on TCP."""
    from sandbox.service.endpoint import unix
    from sandbox.service.server_process import ServerProcess

    state = support.make_state_dir("sk-msg-", images_from=image_source)
    env = support.server_env(None)
    first = ServerProcess(support.serve_command(state, "--pool-size", "0"), state / "first.log", env=env, cwd=REPO)
    first.start()
    second = None
    try:
        first.wait_healthy(unix(state / "server.sock"), 120)
        port = support.free_port()
        serve_tcp = ["serve", "--state-dir", str(state), "--port", str(port), "--pool-size", "0"]
        refused = subprocess.run([sys.executable, "-m", "sandbox", *serve_tcp], env=env, cwd=REPO,
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stderr
        assert "on its socket only" in refused.stderr and f"sandbox-kernel stop --state-dir {state}" in refused.stderr
        assert "--state-dir DIR" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        stopped = subprocess.run([sys.executable, "-m", "sandbox", "stop", "--state-dir", str(state)], env=env,
                                 cwd=REPO, capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        second = ServerProcess([sys.executable, "-m", "sandbox", *serve_tcp], state / "second.log", env=env,
                               cwd=REPO)
        second.start()
        second.wait_healthy(f"http://127.0.0.1:{port}", 120)  # the advice followed: a server on TCP
    finally:
        for process in (second, first):
            if process is not None:
                process.stop(30)
        support.sweep(state)
        shutil.rmtree(state, ignore_errors=True)


def _unprivileged_user() -> t.Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("making a test user needs root")
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing: the test user needs an interpreter it may run")
    name = f"sbkl{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


unprivileged_user = pytest.fixture(_unprivileged_user)


def test_logs_that_cannot_be_read_say_so_and_exit_non_zero(unprivileged_user, tmp_path):
    """A root server's sandbox, its logs 0600: a user's `logs ID` says which files it cannot
    read and what to do, exit status 1 (it printed nothing and exited 0). The control: root,
    who may read them, gets the lines."""
    sandbox_id = "sbx-0123456789abcdef"
    state = pathlib.Path(tempfile.mkdtemp(prefix="sk-logs-", dir="/tmp"))
    try:
        state.chmod(0o755)
        d = state / "sandboxes" / sandbox_id
        d.mkdir(parents=True)
        for p in (state / "sandboxes", d):
            p.chmod(0o755)
        (d / "supervisor.log").write_text("a line only root may read\n")
        (d / "state.json").write_text('{"state": "running"}')
        for p in (d / "supervisor.log", d / "state.json"):
            p.chmod(0o600)
        argv = [SYSTEM_PYTHON, "-m", "sandbox", "logs", sandbox_id, "--state-dir", str(state)]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(state)}
        as_user = subprocess.run([shutil.which("runuser"), "-u", unprivileged_user, "--", *argv], env=env, cwd=str(state),
                                 capture_output=True, text=True, timeout=60)
        assert as_user.returncode == 1, as_user
        assert "cannot read" in as_user.stderr and "supervisor.log" in as_user.stderr, as_user.stderr
        assert "run as the server's user" in as_user.stderr and "only root" not in as_user.stdout
        as_root = subprocess.run(argv, env=env, cwd=str(state), capture_output=True, text=True, timeout=60)
        assert as_root.returncode == 0 and "a line only root may read" in as_root.stdout, as_root
        (d / "supervisor.log").unlink()
        (d / "state.json").unlink()
        empty = subprocess.run(argv, env=env, cwd=str(state), capture_output=True, text=True, timeout=60)
        assert empty.returncode == 0 and f"nothing logged of {sandbox_id}" in empty.stdout, empty
    finally:
        shutil.rmtree(state, ignore_errors=True)
