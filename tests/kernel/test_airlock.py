"""The airlock's host side (kernel/airlock.py): `%push` reads and `%pull` writes only inside
one folder, on the real filesystem. One test per rule; tests/kernel/test_kernel.py runs the
same rules through a real kernel and sandbox.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from kernel import airlock, host_code, safe_path
from kernel.airlock import AirlockError
from kernel.failure import CellFailure
from kernel.transfer import local_target, push_plan

REFUSED = CellFailure  # an AirlockError is one; run_magic shows every one the same way


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    """The notebook's folder, with a secret next to it (outside) and data inside."""
    (tmp_path / "outside").mkdir()
    secret = tmp_path / "outside" / "secret.txt"
    secret.write_text("secret")
    secret.chmod(0o600)
    inside = tmp_path / "nb"
    (inside / "data").mkdir(parents=True)
    (inside / "data" / "a.csv").write_text("a")
    return inside


def write(root: pathlib.Path, rel: str, data: bytes = b"pulled", force: bool = False) -> None:
    parts = airlock.check_local(rel, root, "%pull")
    with airlock.Writer(root, parts, force, "%pull") as f:
        f.write(data)


@pytest.mark.parametrize("path", ["/etc/passwd", "//etc/passwd", "~/x", "~root/x"])
def test_absolute_and_home_paths_are_refused(root, path):
    with pytest.raises(AirlockError) as info:
        airlock.check_local(path, root, "%push")
    assert info.value.ename == "PermissionError" and str(root) in info.value.evalue
    with pytest.raises(REFUSED):
        push_plan(path, None, root)
    with pytest.raises(REFUSED):
        local_target("r.txt", path, root, many=False)


@pytest.mark.parametrize("path", ["..", "../outside/secret.txt", "data/../../outside/secret.txt", "data/../data/a.csv"])
def test_dotdot_is_refused_even_when_it_would_stay_inside(root, path):
    with pytest.raises(AirlockError) as info:
        airlock.check_local(path, root, "%pull")
    assert "'..'" in info.value.evalue
    with pytest.raises(REFUSED):
        push_plan(path, None, root)


def test_push_does_not_follow_a_symlink_out_of_the_folder(root):
    (root / "link.txt").symlink_to(root.parent / "outside" / "secret.txt")
    (root / "linkdir").symlink_to(root.parent / "outside")
    for pattern in ("link.txt", "linkdir/secret.txt", "linkdir"):
        with pytest.raises(REFUSED) as info:
            plan, _ = push_plan(pattern, None, root)
            for parts, _remote in plan:
                airlock.open_for_read(root, parts, "%push")
        assert "symlink" in str(info.value)
    # Globs and folders skip links rather than follow them.
    plan, skipped = push_plan("*", None, root)
    assert [parts for parts, _ in plan] == [["data", "a.csv"]]
    assert sorted(skipped) == ["link.txt", "linkdir"]
    (root / "data" / "inner-link").symlink_to(root.parent / "outside" / "secret.txt")
    plan, skipped = push_plan("data", None, root)
    assert [parts for parts, _ in plan] == [["data", "a.csv"]] and skipped == ["data/inner-link"]


def test_push_reads_only_regular_files(root):
    os.mkfifo(root / "fifo")
    with pytest.raises(CellFailure) as info:
        push_plan("fifo", None, root)
    assert "not a regular file" in info.value.evalue


def test_pull_does_not_write_through_a_symlinked_folder(root):
    (root / "out").symlink_to(root.parent / "outside")
    with pytest.raises(AirlockError) as info:
        write(root, "out/new.txt")
    assert "symlink" in info.value.evalue
    assert not (root.parent / "outside" / "new.txt").exists()


def test_pull_does_not_write_through_a_dangling_symlink(root):
    target = root.parent / "outside" / "planted.py"
    (root / "sitecustomize.py").symlink_to(target)
    for force in (False, True):
        with pytest.raises(AirlockError) as info:
            write(root, "sitecustomize.py", force=force)
        assert "symlink" in info.value.evalue
    assert not target.exists(), "the link's target was created"
    assert (root / "sitecustomize.py").is_symlink(), "the link itself is left as it was"


def test_pull_does_not_overwrite_without_force(root):
    existing = root / "data" / "a.csv"
    with pytest.raises(AirlockError) as info:
        write(root, "data/a.csv", b"new")
    assert info.value.ename == "FileExistsError" and "--force" in info.value.evalue
    assert existing.read_text() == "a"
    with pytest.raises(AirlockError):
        with airlock.Writer(root, ["data", "a.csv"], False, "%pull"):
            pytest.fail("the download started although the file exists")
    write(root, "data/a.csv", b"new", force=True)
    assert existing.read_bytes() == b"new"
    assert sorted(p.name for p in existing.parent.iterdir()) == ["a.csv"], "no temporary file left behind"


def test_pull_never_replaces_a_folder(root):
    with pytest.raises(AirlockError) as info:
        write(root, "data", force=True)
    assert "not a regular file" in info.value.evalue


def test_a_file_that_appears_during_a_pull_is_not_overwritten(root):
    """The check happens before the download; link(2) at the end refuses a name that was
    taken meanwhile (here: a dangling link planted mid-transfer)."""
    parts = airlock.check_local("late.txt", root, "%pull")
    with pytest.raises(AirlockError) as info:
        with airlock.Writer(root, parts, False, "%pull") as f:
            f.write(b"pulled")
            (root / "late.txt").symlink_to(root.parent / "outside" / "late-target")
    assert info.value.ename == "FileExistsError"
    assert not (root.parent / "outside" / "late-target").exists()
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == [], "temporary file removed"


def test_a_failed_pull_leaves_nothing_behind(root):
    with pytest.raises(RuntimeError):
        with airlock.Writer(root, ["new.txt"], False, "%pull") as f:
            f.write(b"half")
            raise RuntimeError("transfer broke")
    assert sorted(p.name for p in root.iterdir()) == ["data"]


def test_pull_creates_folders_inside_the_root(root):
    write(root, "results/2024/r.txt")
    assert (root / "results" / "2024" / "r.txt").read_bytes() == b"pulled"


def test_another_root_can_be_configured(root, tmp_path, monkeypatch):
    """The kernel takes `airlock_root` from its settings (env SANDBOX_KERNEL_AIRLOCK_ROOT),
    and the rules hold there too, whatever host cells are set to."""
    import logging

    from kernel.config import SandboxSettings
    from kernel.lifecycle import SandboxLifecycle

    exchange = tmp_path / "exchange"
    exchange.mkdir()
    monkeypatch.setenv("SANDBOX_KERNEL_AIRLOCK_ROOT", str(exchange))
    for host_cells in ("1", "0"):
        monkeypatch.setenv("SANDBOX_KERNEL_HOST_CELLS", host_cells)
        life = SandboxLifecycle(SandboxSettings(), logging.getLogger("test"), cwd=root)
        assert life.airlock_root == exchange
        write(life.airlock_root, f"r{host_cells}.txt")
        assert (exchange / f"r{host_cells}.txt").exists()
        with pytest.raises(AirlockError):
            airlock.check_local(str(root / "data" / "a.csv"), life.airlock_root, "%push")
    with pytest.raises(REFUSED):
        push_plan("data/a.csv", None, exchange)  # the notebook's folder is not the root now
    monkeypatch.delenv("SANDBOX_KERNEL_AIRLOCK_ROOT")
    assert SandboxLifecycle(SandboxSettings(), logging.getLogger("test"), cwd=root).airlock_root == root


# --------------------------------------------------------------------------- host code


@pytest.mark.parametrize("path", [
    "markdown_it.py", "kernel.py", "pkg/__init__.py", "ext.cpython-311-x86_64-linux-gnu.so", "evil.pth",
    "sitecustomize.py", "usercustomize", "__pycache__/m.cpython-311.pyc", ".envrc", ".bashrc",
    ".ipynb_checkpoints/nb-checkpoint.ipynb", ".git/hooks/pre-commit", "ipython_config.py",
    "jupyter_server_config.json", "jupyter_lab_config.py", "kernel.json", "pyvenv.cfg", "deep/dir/Mod.PY",
])
def test_names_a_host_program_runs_or_imports_need_the_flag(path):
    """What a host Python, IPython, Jupyter, a shell or git would run, import or read as
    config from the notebook's folder: %pull writes it only with --allow-code."""
    assert host_code.why_host_code(path.split("/")) is not None, path


@pytest.mark.parametrize("path", ["result.txt", "out/plot.png", "data/a.csv", "report.ipynb", "model.pkl",
                                  "notes.md", "python/readme.txt", "kernel.txt"])
def test_data_names_pull_without_the_flag(path):
    assert host_code.why_host_code(path.split("/")) is None, path


def test_the_refusal_says_why_and_both_ways_on():
    message = host_code.refusal("markdown_it.py", host_code.why_host_code(["markdown_it.py"]))
    assert "--allow-code" in message and "import" in message and "markdown_it.py.txt" in message


# --------------------------------------------------------------------------- the kernel's own sys.path


def test_the_working_directory_on_sys_path_is_found_in_every_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    site = "/usr/lib/python3/dist-packages"
    assert safe_path.unsafe_entries([site], str(tmp_path)) == []
    for entry in ("", ".", "sub/..", str(tmp_path), str(tmp_path) + "/", str(tmp_path / "sub" / "..")):
        assert safe_path.unsafe_entries([site, entry], str(tmp_path)) == [entry], entry


def test_the_kernel_refuses_to_start_with_its_folder_on_sys_path(tmp_path):
    """`python -P -m kernel` with '.' on PYTHONPATH: refused, with the reason, before any
    import from that folder; the control, the same start without '.', passes the check."""
    import subprocess
    import sys

    import support

    env = support.with_repo_on_path(dict(os.environ))
    probe = "from kernel.safe_path import check_or_exit; check_or_exit(); print('checked')"
    control = subprocess.run([sys.executable, "-P", "-c", probe], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    assert control.returncode == 0 and control.stdout.strip() == "checked", control.stderr
    env["PYTHONPATH"] = os.pathsep.join([".", env["PYTHONPATH"]])
    refused = subprocess.run([sys.executable, "-P", "-m", "kernel", "-f", str(tmp_path / "never.json")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, (refused.returncode, refused.stderr)
    assert "not starting" in refused.stderr and str(tmp_path) in refused.stderr and "-P" in refused.stderr
    assert "Traceback" not in refused.stderr
