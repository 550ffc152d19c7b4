"""Session-wide fixtures: one real sandbox server per test process, and the run as a whole.

The server is started for real (``python -m sandbox serve``, real bwrap, real cgroups) on a
state directory of its own that borrows the run's built default image (tests/testrun.py:
built once per run, or kept between runs in SANDBOX_KERNEL_TEST_STATE_DIR; tests/support.py
lists the other variables).

The run is spread over pytest-xdist workers (pyproject's addopts). Conventions, in docs/testing.md
too:
- each worker has its own session server and state directories; never a fixed path or port;
- tests that share a module- or class-scoped fixture (a suite's own server, the isolation
  tier, the client flavour) run on one worker, so that it is set up once: they get an
  ``xdist_group`` of their file and those fixtures' parameters (``--dist loadgroup``); a test
  that must run alone with others of its kind takes ``@pytest.mark.xdist_group("name")``;
- the workers take the groups longest first, by the seconds in tests/durations.json
  (tests/longest_first.py; ``--record-durations`` writes them);
- the gVisor tier's tests are marked ``gvisor`` (and ``slow``): ``-m gvisor`` runs that tier;
- the run fails when it leaves a process, a mount or a file behind (`pytest_sessionfinish`).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import typing as t

import httpx
import pytest

# Every suite imports `support` by that one name: pytest's default import mode would put
# this directory on sys.path too, but not under --import-mode=importlib.
HERE = str(pathlib.Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import longest_first  # noqa: E402
import support  # noqa: E402
import testrun  # noqa: E402

from sandbox.isolation import gvisor  # noqa: E402

#: The isolation tiers the tiered suites (tests/security, tests/reliability) run against.
TIERS = ("bwrap", "gvisor")


@pytest.fixture(scope="module", params=TIERS)
def isolation(request: pytest.FixtureRequest) -> str:
    """The isolation tier of a suite's sandboxes: a test that creates its sandboxes through
    this fixture (or a fixture built on it) runs once per tier, the tier in its id. The gvisor
    half is skipped, with the reason, where runsc cannot run. Module scope, so that a suite's
    own servers and shared sandboxes are made once per tier."""
    if request.param == "gvisor":
        ok, why = gvisor.available()
        if not ok:
            pytest.skip(f"gvisor backend unavailable here: {why}")
    return request.param


RUN_OWNER = pytest.StashKey[bool]()
EARLY_BUILD = pytest.StashKey["subprocess.Popen | None"]()


def pytest_configure(config: pytest.Config) -> None:
    """The run is named here, before xdist starts its workers (which inherit it)."""
    worker = hasattr(config, "workerinput")
    config.stash[RUN_OWNER] = testrun.begin() and not worker
    if worker:  # the order xdist's controller hands out (tests/longest_first.py)
        config.pluginmanager.register(longest_first.LongestFirst(longest_first.load()), "sandbox-kernel-longest-first")
    if not worker:
        # The run starts hundreds of Python processes from this checkout (servers, a
        # supervisor per sandbox, kernels); with PYTHONDONTWRITEBYTECODE set in the
        # environment, none keeps the bytecode it compiled, so each compiled the package
        # again (a supervisor's start: 0.26 s of CPU instead of 0.10). The workers and all
        # they start inherit this.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if config.stash[RUN_OWNER] and needs_the_image(config):
        config.stash[EARLY_BUILD] = testrun.start_default_image(testrun.image_home(), support.server_env(None),
                                                                support.REPO)
    record = config.getoption("record_durations")
    if record and not worker:
        config.pluginmanager.register(longest_first.RecordDurations(pathlib.Path(record)), "sandbox-kernel-durations")


def needs_the_image(config: pytest.Config) -> bool:
    """Whether the run may start a server (so its default image is built ahead): not when
    a server elsewhere is used, nor for the unit tests alone."""
    if os.environ.get("SANDBOX_KERNEL_TEST_URL"):
        return False
    paths = [a.split("::")[0] for a in config.args if not a.startswith("-")]
    unit = (support.REPO / "tests" / "unit").resolve()
    return not paths or not all(pathlib.Path(p).resolve().is_relative_to(unit) for p in paths)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", metavar="PATH", default=None,
                     help="write each test's seconds (setup, call, teardown) to PATH when the run "
                          "ends; tests/durations.json orders the groups, longest first (tests/longest_first.py)")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture (and every worker) is done: fail the run if it left anything
    behind, list it, and end and remove it all the same."""
    support.remove_kernelspec()  # installed once per process by whichever suite needed it first
    support.end_fork_servers()  # started by this process's first forked kernel
    if not session.config.stash.get(RUN_OWNER, False):
        return
    testrun.end_default_image(session.config.stash.get(EARLY_BUILD, None))
    left = testrun.leftovers()
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["", f"this test run left {len(left)} thing(s) behind (now ended and removed):", *left]
        if reporter is not None:
            reporter.write_sep("=", "left behind", red=True)
            for line in lines:
                reporter.write_line(line)
        else:
            print("\n".join(lines), file=sys.stderr)
        testrun.clean_up()
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    testrun.finish()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the gVisor tier and group the tests that share a module-scoped fixture."""
    skip_bwrap_only_in_gvisor(items)
    for item in items:
        if is_gvisor_tier(item):
            item.add_marker(pytest.mark.gvisor)
            item.add_marker(pytest.mark.slow)
        group = shared_fixture_group(item)
        if group and not any(True for _ in item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(group))


def is_gvisor_tier(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return (callspec is not None and callspec.params.get("isolation") == "gvisor") or "gvisor" in item.path.name


def shared_fixture_group(item: pytest.Item) -> str | None:
    """``FILE(params)`` when the test uses a module-, class- or package-scoped fixture (so
    that its worker sets that fixture up once), else None: the test may run on any worker.
    Never a ``]`` in it: xdist takes the group from after the last ``@`` of the test's id only
    when no ``]`` follows it, and otherwise schedules the test alone (so a name like
    ``FILE[params]`` spread one module's tests over every worker, each setting the module's
    servers up again)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    shared = [name for name, defs in info.name2fixturedefs.items()
              if defs and defs[-1].scope in ("module", "class", "package")]
    if not shared:
        return None
    callspec = getattr(item, "callspec", None)
    params = sorted(f"{name}={callspec.params[name]}" for name in shared
                    if callspec is not None and name in callspec.params)
    return f"{item.nodeid.split('::')[0]}({','.join(params)})"


def skip_bwrap_only_in_gvisor(items: list[pytest.Item]) -> None:
    """A test marked ``bwrap_only(reason=...)`` is skipped in its gvisor run, the reason printed."""
    for item in items:
        marker = item.get_closest_marker("bwrap_only")
        callspec = getattr(item, "callspec", None)
        if marker is not None and callspec is not None and callspec.params.get("isolation") == "gvisor":
            item.add_marker(pytest.mark.skip(reason=f"bwrap only: {bwrap_only_reason(marker)}"))


def bwrap_only_reason(marker: pytest.Mark) -> str:
    reason = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
    if not reason:
        raise pytest.UsageError("bwrap_only needs a reason: why the test does not apply to the gvisor tier")
    return reason


@pytest.fixture(scope="session")
def sandbox_server() -> t.Iterator[support.Server]:
    try:
        server = support.start_session_server()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.close()


@pytest.fixture(scope="session")
def image_source(sandbox_server: support.Server) -> t.Iterator[pathlib.Path]:
    """A state directory with a built default image, for servers of a test's own
    (`support.own_server`): the session server's, else one built here."""
    if support.has_default_image(sandbox_server.state_dir):
        yield sandbox_server.state_dir
        return
    state = support.make_state_dir("sk-images-")
    try:
        support.build_default_image(state)
        yield state
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def spawn_server(image_source: pathlib.Path) -> t.Iterator[t.Callable[..., support.Server]]:
    """spawn_server(*serve_args, extra_env=None) -> a started server of the test's own (to
    kill, stop or weaken) on a fresh state directory; all it and its sandboxes left is
    removed afterwards."""
    made: list[support.Server] = []

    def spawn(*args: str, extra_env: dict[str, str] | None = None) -> support.Server:
        server = support.own_server(image_source, *args, extra_env=extra_env)
        made.append(server)
        server.start()
        return server

    yield spawn
    for server in made:
        server.close()


@pytest.fixture
def api(sandbox_server: support.Server) -> t.Iterator[httpx.Client]:
    """An authenticated httpx client on the test server (base URL set, no timeout surprises)."""
    with sandbox_server.client(timeout=120) as client:
        yield client


@pytest.fixture
def new_sandbox(api: httpx.Client) -> t.Iterator[t.Callable[..., dict]]:
    """Factory: new_sandbox(**create_fields) -> sandbox JSON; every one is deleted afterwards."""
    made: list[str] = []

    def create(**fields) -> dict:
        sandbox = support.create(api, **fields)
        made.append(sandbox["id"])
        return sandbox

    yield create
    for sandbox_id in made:
        api.delete(f"/v1/sandboxes/{sandbox_id}")


@pytest.fixture
def run(api: httpx.Client) -> t.Callable[..., list[dict]]:
    """run(sandbox_id, code, **fields) -> the execute's events, ``done`` last."""
    return lambda sandbox_id, code, **fields: support.execute(api, sandbox_id, code, **fields)
