"""The CLI on a real server: `ls` (header, human times, empty message, --json), `rm --all`,
`exec ID -- CMD` (streamed output, the command's exit code), `logs ID`, and help texts with
examples. One server of the test module's own, so that "empty" and "--all" are ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import REPO, with_repo_on_path

from sandbox.cli import build_parser
from sandbox.cli.human import duration, relative, size, table


def cli(server, *args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = with_repo_on_path({k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")})
    command, *rest = args  # the state directory before a command's `--`
    return subprocess.run([sys.executable, "-m", "sandbox", command, "--state-dir", str(server.state_dir), *rest],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout,
                          input=stdin if stdin is not None else "")


@pytest.fixture(scope="module")
def server(image_source):
    import support

    srv = support.own_server(image_source)
    srv.start()
    yield srv
    srv.close()


def create(server) -> str:
    with server.client(timeout=120) as c:
        r = c.post("/v1/sandboxes", json={"ttl_seconds": 600})
        assert r.status_code == 201, r.text
        return r.json()["id"]


def test_ls_says_when_empty_then_shows_a_table(server):
    empty = cli(server, "ls")
    assert empty.returncode == 0 and empty.stdout == ""
    assert "no sandboxes on" in empty.stderr and "Sandbox.create()" in empty.stderr
    assert json.loads(cli(server, "ls", "--json").stdout) == []
    sandbox_id = create(server)
    out = cli(server, "ls")
    header, row = out.stdout.splitlines()
    assert header.split()[:8] == ["ID", "STATE", "IMAGE", "ISOLATION", "CREATED", "EXPIRES", "CELLS", "MEMORY"]
    assert row.startswith(sandbox_id) and " ago " in row and " in 10 min " in row and "GiB" in row, row
    [raw] = json.loads(cli(server, "ls", "--json").stdout)
    assert raw["id"] == sandbox_id and raw["state"] == "running"
    if "usage" in raw:  # the server's usage figures, as columns
        assert header.split()[8:] == ["CPU", "MEM", "USED", "DISK", "USED"] and " s " in row, (header, row)


def test_exec_streams_and_exits_with_the_commands_code(server):
    sandbox_id = create(server)
    r = cli(server, "exec", sandbox_id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
    line = cli(server, "exec", sandbox_id, "--", "echo $((6*7)) | tr 4 X")  # one word: a shell line
    assert (line.returncode, line.stdout) == (0, "X2\n")
    piped = cli(server, "exec", sandbox_id, "--", "wc", "-c", stdin="12345")
    assert piped.stdout.strip() == "5"
    missing = cli(server, "exec", "sbx-0000000000000000", "--", "true")
    assert missing.returncode == 1 and "no sandbox" in missing.stderr and "Traceback" not in missing.stderr


def test_logs_show_what_the_host_knows(server):
    sandbox_id = create(server)
    out = cli(server, "logs", sandbox_id)
    assert out.returncode == 0 and "== state.json" in out.stdout and "state: running" in out.stdout
    unknown = cli(server, "logs", "sbx-nothere")
    assert unknown.returncode == 1 and "sandbox-kernel ls" in unknown.stderr


def test_rm_all_deletes_every_sandbox(server):
    ids = {create(server), create(server)}
    out = cli(server, "rm", "--all")
    assert out.returncode == 0, out.stderr
    assert {line.split()[1] for line in out.stdout.splitlines() if line.startswith("deleted ")} >= ids
    assert json.loads(cli(server, "ls", "--json").stdout) == []
    again = cli(server, "rm", "--all")
    assert again.returncode == 0 and "nothing to delete" in again.stdout
    both = cli(server, "rm", "--all", "sbx-x")
    assert both.returncode == 2 and "not both" in both.stderr


def test_every_command_has_help_with_examples():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        assert p.epilog and p.epilog.startswith("examples:\n") and f"sandbox-kernel {name}" in p.epilog, name


def test_human_units():
    from datetime import datetime, timedelta, timezone

    assert [size(n) for n in (None, 512, 1536, 20 * 2**20, 3 * 2**30)] == ["-", "512 B", "1.5 KiB", "20 MiB", "3.0 GiB"]
    assert [duration(s) for s in (5, 600, 3 * 3600 + 300, 2 * 86400 + 7200)] == ["5 s", "10 min", "3 h 05 min", "2 d 2 h"]
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert relative(now + timedelta(minutes=52), now) == "in 52 min"
    assert relative(now - timedelta(seconds=30), now) == "30 s ago"
    assert table(["A", "N"], [["x", 1], ["yy", 10]], right={1}) == "A    N\nx    1\nyy  10"
