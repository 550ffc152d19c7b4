"""The kernel's pure parts: event mapping, magic parsing, path plans, kernelspec, history.
No server needed."""

from __future__ import annotations

import json
import pathlib

import pytest

from kernel.install import TIERS, install_kernelspec, kernel_spec
from kernel.kernel import history_query, local_is_complete
from kernel.failure import CellFailure
from kernel.magics import magic_name_matches, push_path_completions, split_cell
from kernel.transfer import _segments_match, local_target, push_plan
from kernel.outputs import CellMapper, died_reason, event_to_message, gone_notice

# --------------------------------------------------------------------------- outputs


def test_every_event_type_maps_to_its_message():
    assert event_to_message({"type": "stream", "name": "stderr", "text": "x"}) == (
        "stream",
        {"name": "stderr", "text": "x"},
    )
    kind, content = event_to_message({"type": "display_data", "data": {"text/plain": "p", "x/y": 1}})
    assert kind == "display_data"
    assert content == {"data": {"text/plain": "p"}, "metadata": {}, "transient": {}}
    kind, content = event_to_message(
        {"type": "update_display_data", "data": {"text/plain": "2"}, "metadata": {}, "transient": {"display_id": "d"}}
    )
    assert kind == "update_display_data" and content["transient"] == {"display_id": "d"}
    kind, content = event_to_message({"type": "execute_result", "execution_count": 7, "data": {"text/plain": "1"}})
    assert (kind, content) == ("execute_result", {"execution_count": 7, "data": {"text/plain": "1"}, "metadata": {}})
    assert event_to_message({"type": "clear_output", "wait": True}) == ("clear_output", {"wait": True})
    assert event_to_message({"type": "done", "status": "ok"}) is None
    assert event_to_message({"type": "something_new"}) is None


def test_update_without_display_id_is_shown_not_dropped():
    kind, _ = event_to_message({"type": "update_display_data", "data": {"text/plain": "x"}})
    assert kind == "display_data"


def test_mapper_ok_cell_uses_the_sandbox_count():
    m = CellMapper(execution_count=1)
    m.feed({"type": "execute_result", "execution_count": 5, "data": {"text/plain": "2"}})
    m.feed({"type": "done", "status": "ok", "execution_count": 5})
    owed, reply = m.finish()
    assert owed == []
    assert reply["status"] == "ok" and reply["execution_count"] == 5
    assert m.text_result == "2"


def test_mapper_sends_one_error_even_if_the_server_sends_two():
    m = CellMapper()
    first = m.feed({"type": "error", "ename": "SandboxDied", "evalue": "oom", "traceback": ["tb"]})
    second = m.feed({"type": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []})
    m.feed({"type": "done", "status": "error", "execution_count": 2, "reason": "oom", "sandbox_state": "dead"})
    owed, reply = m.finish()
    assert [k for k, _ in first] == ["error"]
    assert [k for k, _ in second] == ["stream"]
    assert owed == []
    assert reply["status"] == "error" and reply["ename"] == "SandboxDied"
    assert m.sandbox_gone


def test_mapper_synthesizes_an_error_for_a_failed_cell_without_one():
    m = CellMapper()
    m.feed(
        {"type": "done", "status": "aborted", "execution_count": 3, "reason": "timeout_killed", "sandbox_state": "dead"}
    )
    owed, reply = m.finish()
    assert [k for k, _ in owed] == ["error"]
    assert reply["status"] == "error"
    assert "time limit" in reply["evalue"]
    assert reply["traceback"], "frontends show the traceback: it must not be empty"


def test_gone_notice_says_what_happened_and_what_was_lost():
    text = gone_notice("sbx-1", "sandbox sbx-1 expired after 3 s idle", ["a.csv", "data/b.csv"], "sbx-2")
    assert "sbx-1" in text and "expired" in text and "sbx-2" in text
    assert "variables" in text.lower()
    assert "a.csv" in text and "data/b.csv" in text
    assert "%push" not in gone_notice("sbx-1", "deleted", [], "sbx-2")


# --------------------------------------------------------------------------- magics


def test_split_cell_takes_only_leading_magics_and_keeps_line_numbers():
    calls, rest = split_cell("%push a.csv\n# comment\n%pull 'b c.txt' out/\nx = 1\n%push late.csv")
    assert [(c.name, c.args) for c in calls] == [("push", ["a.csv"]), ("pull", ["b c.txt", "out/"])]
    assert rest.split("\n")[3] == "x = 1", "code stays on its own line number"
    assert all(line.startswith("#") for line in rest.split("\n")[:3]), "IPython drops leading blank lines"
    assert rest.endswith("%push late.csv"), "a magic after code is IPython's business"


def test_split_cell_leaves_other_magics_to_ipython():
    for code in ("%%time\nx = 1", "%time 1+1", "%pushd /tmp", "%%push\nx"):
        assert split_cell(code) == ([], code)


def test_split_cell_magic_only():
    calls, rest = split_cell("%sandbox\n%ttl renew 60\n")
    assert [c.name for c in calls] == ["sandbox", "ttl"]
    assert rest == ""


def test_split_cell_reports_bad_quoting():
    with pytest.raises(CellFailure):
        split_cell("%push 'unclosed")


def test_push_plan_keeps_relative_shape(tmp_path: pathlib.Path):
    (tmp_path / "data").mkdir()
    for name in ("a.csv", "b.csv", "c.txt"):
        (tmp_path / "data" / name).write_text(name)
    plan, _ = push_plan("data/*.csv", None, tmp_path)
    assert plan == [(["data", "a.csv"], "data/a.csv"), (["data", "b.csv"], "data/b.csv")]

    def remotes(pattern, dest):
        return [r for _, r in push_plan(pattern, dest, tmp_path)[0]]

    assert remotes("data/a.csv", "renamed.csv") == ["renamed.csv"]
    assert remotes("data/a.csv", "into/") == ["into/a.csv"]
    assert remotes("data/*.csv", "/workspace/in") == ["in/a.csv", "in/b.csv"]
    assert sorted(remotes("data", None)) == ["data/a.csv", "data/b.csv", "data/c.txt"]


def test_push_plan_nothing_matches(tmp_path: pathlib.Path):
    with pytest.raises(CellFailure) as info:
        push_plan("*.parquet", None, tmp_path)
    assert info.value.ename == "FileNotFoundError"


def test_pull_refuses_sandbox_paths_that_escape(tmp_path: pathlib.Path):
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../b"):
        with pytest.raises(CellFailure):
            local_target(bad, None, tmp_path, many=False)
    assert local_target("out/r.txt", None, tmp_path, many=False) == ["out", "r.txt"]
    assert local_target("out/r.txt", "copies/", tmp_path, many=False) == ["copies", "r.txt"]
    assert local_target("out/r.txt", "r2.txt", tmp_path, many=False) == ["r2.txt"]
    (tmp_path / "existing").mkdir()
    assert local_target("out/r.txt", "existing", tmp_path, many=False) == ["existing", "r.txt"]


def test_remote_glob_matches_by_segment():
    assert _segments_match("data/*.csv", "data/a.csv")
    assert not _segments_match("*.csv", "data/a.csv")
    assert _segments_match("**/*.png", "a/b/c.png")
    assert _segments_match("**/*.png", "c.png")


def test_magic_completions(tmp_path: pathlib.Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data.csv").write_text("")
    reply = push_path_completions("%push da", 8, tmp_path)
    assert reply is not None and set(reply["matches"]) == {"data/", "data.csv"}
    assert reply["cursor_start"] == 6
    assert push_path_completions("x = da", 6, tmp_path) is None
    assert push_path_completions("%push data.csv de", 17, tmp_path) is None
    assert magic_name_matches("%tt", 3) == ["%ttl"]
    assert magic_name_matches("x %tt", 5) == []


# --------------------------------------------------------------------------- kernel helpers


def test_history_query():
    entries = [(1, 1, "1+2+3", "6"), (1, 2, "x = 1", None), (1, 3, "1+2+3", "6")]
    assert history_query(entries, "tail", False, None, None, None, 2, None, False) == [(1, 2, "x = 1"), (1, 3, "1+2+3")]
    assert history_query(entries, "range", True, 1, 2, 3, None, None, False) == [(1, 2, ("x = 1", None))]
    assert len(history_query(entries, "search", False, None, None, None, None, "1?2*", False)) == 2
    assert len(history_query(entries, "search", False, None, None, None, None, "1?2*", True)) == 1


def test_local_is_complete():
    assert local_is_complete("x = 1")["status"] == "complete"
    assert local_is_complete("def f():")["status"] == "incomplete"
    assert local_is_complete("import = 7q")["status"] == "invalid"


# --------------------------------------------------------------------------- install


def test_kernel_spec_default_and_per_image():
    name, spec = kernel_spec()
    assert name == "sandbox"
    assert spec["display_name"] == "Python (sandbox)"
    assert spec["argv"][1:] == ["-P", "-m", "kernel", "-f", "{connection_file}"]
    assert pathlib.Path(spec["argv"][0]).is_absolute()
    assert spec["interrupt_mode"] == "message"
    assert "env" not in spec
    name, spec = kernel_spec("DataSci")
    assert name == "sandbox-datasci"
    assert spec["display_name"] == "Python (sandbox: DataSci)"
    assert spec["env"] == {"SANDBOX_KERNEL_IMAGE": "DataSci"}
    with pytest.raises(ValueError):
        kernel_spec("../evil")


def test_kernel_spec_per_isolation_tier():
    name, spec = kernel_spec(isolation="gvisor")
    assert name == "sandbox-gvisor" and spec["display_name"] == "Python (sandbox, gVisor)"
    assert spec["argv"][1:] == ["-P", "-m", "kernel", "-f", "{connection_file}", "--SandboxKernel.isolation=gvisor"]
    name, spec = kernel_spec("tiny", isolation="gvisor")
    assert name == "sandbox-tiny-gvisor" and spec["display_name"] == "Python (sandbox: tiny, gVisor)"
    assert spec["env"] == {"SANDBOX_KERNEL_IMAGE": "tiny"}
    with pytest.raises(ValueError):
        kernel_spec(isolation="firecracker")


def test_the_kernel_takes_its_isolation_from_the_kernelspec_argv():
    """The argv a tier's kernelspec adds reaches the sandbox's create request."""
    from traitlets.config import Config

    from kernel.kernel import SandboxKernel

    config = Config()
    config.SandboxKernel.isolation = kernel_spec(isolation="gvisor")[1]["argv"][-1].split("=", 1)[1]
    assert SandboxKernel.class_traits()["isolation"].metadata.get("config")
    assert SandboxKernel(config=config).create_arguments()["isolation"] == "gvisor"


def test_install_kernelspec_into_a_prefix(tmp_path: pathlib.Path):
    path = pathlib.Path(install_kernelspec(prefix=str(tmp_path), image="gpu"))
    assert path == tmp_path / "share" / "jupyter" / "kernels" / "sandbox-gpu"
    spec = json.loads((path / "kernel.json").read_text())
    assert spec["env"]["SANDBOX_KERNEL_IMAGE"] == "gpu"
    for size in (32, 64):
        assert (path / f"logo-{size}x{size}.png").read_bytes().startswith(b"\x89PNG")


def test_a_shared_hosts_kernelspecs_pin_the_server_and_turn_host_cells_off(tmp_path: pathlib.Path):
    """`sandbox-kernel install --url … --no-host-cells`, as deploy/jupyterhub/setup.sh runs it."""
    import subprocess
    import sys

    url = "unix:/var/lib/sandbox-kernel/server.sock"
    r = subprocess.run([sys.executable, "-m", "sandbox", "install", "--prefix", str(tmp_path), "--url", url,
                        "--no-host-cells"], capture_output=True, text=True, timeout=120,
                       cwd=str(pathlib.Path(__file__).resolve().parents[2]))
    assert r.returncode == 0, r.stderr
    for name in ("sandbox", "sandbox-gvisor"):
        spec = json.loads((tmp_path / "share/jupyter/kernels" / name / "kernel.json").read_text())
        assert spec["env"] == {"SANDBOX_KERNEL_URL": url, "SANDBOX_KERNEL_HOST_CELLS": "0"}, spec
    plain = json.loads((pathlib.Path(install_kernelspec(prefix=str(tmp_path / "plain"))) / "kernel.json").read_text())
    assert "env" not in plain  # a user's own install pins nothing


def test_shipped_kernelspec_matches_the_source_copy():
    root = pathlib.Path(__file__).resolve().parents[2]
    for name in ("kernel.json", "logo-32x32.png", "logo-64x64.png"):
        assert (root / "kernelspec" / name).read_bytes() == (root / "kernel" / "resources" / name).read_bytes()


@pytest.mark.parametrize("isolation", list(TIERS))
def test_pip_ships_one_kernelspec_per_tier_as_the_install_command_writes_it(isolation):
    root = pathlib.Path(__file__).resolve().parents[2]
    shipped = root / "kernelspec" / (isolation or "")
    assert json.loads((shipped / "kernel.json").read_text()) == kernel_spec(python="python", isolation=isolation)[1]
    for logo in ("logo-32x32.png", "logo-64x64.png"):
        assert (shipped / logo).read_bytes() == (root / "kernel" / "resources" / logo).read_bytes()
    name = kernel_spec(isolation=isolation)[0]
    pyproject = (root / "pyproject.toml").read_text()
    assert f'"kernelspec/{isolation + "/" if isolation else ""}kernel.json" = "share/jupyter/kernels/{name}/kernel.json"' \
        in pyproject


def test_a_protocol_stop_is_named_even_without_an_error_event():
    """A sandbox stopped for breaking the protocol: the reply and the next cell's notice say so."""
    from sandbox.runtime import vocabulary as V

    done = V.done_event(V.ERROR, execution_count=4, reason=V.PROTOCOL, sandbox_state=V.DEAD)
    m = CellMapper()
    assert m.feed(done) == []
    owed, reply = m.finish()
    assert reply["status"] == "error" and reply["ename"] == "SandboxDied", reply
    assert "protocol" in reply["evalue"] and owed == [("error", m.error)]
    assert m.sandbox_gone
    assert "protocol" in died_reason(done) and "broke the protocol" in died_reason(done)


# --------------------------------------------------------------------------- a notebook's sandbox


def test_a_notebook_lease_is_held_once_and_goes_with_its_holder(tmp_path):
    import os

    from kernel.binding import NotebookLease, all_bindings, holder_of, unbind_elsewhere

    first = NotebookLease(tmp_path, "/nb/a.ipynb", "unix:/s.sock", "")
    assert first.acquire() is None and first.held
    second = NotebookLease(tmp_path, "/nb/a.ipynb", "unix:/s.sock", "")
    assert second.acquire() == os.getpid(), "a second kernel on the notebook is refused, told who holds it"
    second.write("sbx-1", None)  # only the holder writes
    assert first.read() is None
    first.write("sbx-1", "2026-01-01T00:00:00Z")
    assert first.read().sandbox_id == "sbx-1"
    # Another tier or another server: another notebook entirely.
    assert NotebookLease(tmp_path, "/nb/a.ipynb", "unix:/s.sock", "gvisor").acquire() is None
    assert holder_of(tmp_path, "sbx-1", None) == "/nb/a.ipynb"
    first.release()
    assert holder_of(tmp_path, "sbx-1", None) is None
    assert [b.sandbox_id for b, _, held in all_bindings(tmp_path) if not held] == ["sbx-1"]
    assert second.acquire() is None, "free once its holder let go (a dead process's flock goes with it)"
    assert unbind_elsewhere(tmp_path, "sbx-1", None) == ["/nb/a.ipynb"] and second.read() is None
    assert (tmp_path / "notebooks").stat().st_mode & 0o777 == 0o700


def test_bindings_of_a_server_whose_state_is_not_ours_go_to_our_own_state(tmp_path, monkeypatch):
    """A shared host's system server keeps its state in root's directory: a user's bindings go
    to the user's own state directory (XDG_DATA_HOME/sandbox-kernel), where the user can write."""
    import os

    from kernel.binding import NotebookLease, all_bindings

    server_state, own = tmp_path / "system", tmp_path / "data"
    server_state.mkdir()
    monkeypatch.setenv("XDG_DATA_HOME", str(own))
    ours = NotebookLease(server_state, "/nb/a.ipynb", "unix:/s.sock", "")
    assert ours.dir == server_state / "notebooks"  # the server's state is ours (the embedded default)
    if os.geteuid() != 0:
        pytest.skip("giving the server's state directory to another uid needs root")
    os.chown(server_state, 65534, 65534)
    theirs = NotebookLease(server_state, "/nb/a.ipynb", "unix:/s.sock", "")
    assert theirs.dir == own / "sandbox-kernel" / "notebooks"
    assert theirs.acquire() is None
    theirs.write("sbx-1", None)
    assert [b.sandbox_id for b, _, _ in all_bindings(server_state)] == ["sbx-1"]
    assert not (server_state / "notebooks").exists()


def test_a_binding_that_is_not_ours_or_not_an_id_is_ignored(tmp_path):
    import json

    from kernel.binding import NotebookLease

    lease = NotebookLease(tmp_path, "/nb/a.ipynb", "u", "")
    assert lease.acquire() is None
    for bad in ("not json", json.dumps({"notebook": "/nb/a.ipynb", "sandbox_id": "../../etc", "bound_at": 0}),
                json.dumps({"notebook": "/nb/other.ipynb", "sandbox_id": "sbx-1", "bound_at": 0}),
                json.dumps(["a"])):
        lease.path.write_text(bad)
        assert lease.read() is None, bad


# --------------------------------------------------------------------- %sandbox: asleep


def test_sandbox_report_says_asleep_and_when_a_running_one_sleeps():
    from kernel.report import describe, sandbox_table
    from sandbox.client.models import SandboxInfo

    def state_row(info):
        return next(line for line in describe(info, "unix:/s", []).splitlines() if line.startswith("state"))

    asleep = SandboxInfo.from_dict({"id": "sbx-a", "state": "paused", "paused_by": "idle",
                                    "paused_at": "2026-12-05T05:00:00.000Z"})
    assert state_row(asleep).split(None, 1)[1].startswith("asleep since 2026-12-05 05:00:00 UTC")
    assert "sbx-a  asleep" in sandbox_table([asleep], [], None, None)
    asked = SandboxInfo.from_dict({"id": "sbx-p", "state": "paused", "paused_by": "request"})
    assert state_row(asked).split() == ["state", "paused"]
    up = SandboxInfo.from_dict({"id": "sbx-u", "state": "running", "sleeps_at": "2026-12-05T05:10:00.000Z"})
    assert "running, sleeps at 2026-12-05 05:10:00 UTC if no cell comes" in state_row(up)
    never = SandboxInfo.from_dict({"id": "sbx-n", "state": "running", "sleeps_at": None})
    assert state_row(never).split() == ["state", "running"]


def test_an_installed_kernelspec_is_current_but_for_its_interpreter(tmp_path: pathlib.Path):
    """What `lab` checks before running JupyterLab: pip's shipped copy (argv "python") is the
    current spec; an older version's (no supported_encryption: a plaintext-TCP warning per
    kernel) or a missing one is replaced."""
    from kernel.install import is_current

    root = pathlib.Path(__file__).resolve().parents[2]
    for isolation, shipped in ((None, root / "kernelspec"), ("gvisor", root / "kernelspec" / "gvisor")):
        _, spec = kernel_spec(isolation=isolation)
        assert spec["metadata"]["supported_encryption"] == ["curve"]
        assert is_current(str(shipped / "kernel.json"), spec)
        older = json.loads((shipped / "kernel.json").read_text())
        older["metadata"].pop("supported_encryption")
        (tmp_path / "kernel.json").write_text(json.dumps(older))
        assert not is_current(str(tmp_path / "kernel.json"), spec)
    assert not is_current(str(tmp_path / "missing.json"), kernel_spec()[1])
