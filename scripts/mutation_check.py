#!/usr/bin/env python3
"""Mutation check: every protection has a test that fails without it.

Each mutation below removes one protection with a minimal edit, described as (file, exact
old text, new text). The script copies the repository to a scratch directory, checks
that the unmutated tests pass there (the baseline), then for each mutation applies it,
runs the tests that must catch it (by node id) and puts the file back. A mutation is
*killed* when one of its tests fails, *survived* when they all pass. Exit status: 0 when
every mutation was killed; 1 when one survived or could not be judged (its tests were
skipped or errored); 2 when a mutation no longer applies (the old text is gone or no
longer unique: a refactor moved it, so update the list rather than pass silently) or the
baseline fails.

    .venv/bin/python scripts/mutation_check.py            # all, ~15 min on 2 cores
    .venv/bin/python scripts/mutation_check.py --check    # do they all still apply? (instant)
    .venv/bin/python scripts/mutation_check.py -k uid     # the mutations whose name has "uid"

Run as root (several protections exist only for a root server: per-sandbox uids,
cgroups). Set SANDBOX_KERNEL_TEST_STATE_DIR to a state directory with a built image: the
run borrows its images in a state directory of its own (otherwise the image is built once
for the run). Not part of every CI
run because of its length; tests/unit/test_mutation_list.py checks on every run that each
mutation still applies and names tests that exist.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutation:
    name: str
    removes: str  # the protection, in a few words
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # node ids, any of which must fail


def mutation(name: str, removes: str, path: str, old: str, new: str, *tests: str) -> Mutation:
    return Mutation(name, removes, (Edit(path, old, new),), tests)


SVC = "tests/service/"
REL = "tests/reliability/"
LAYERS = SVC + "test_svc_layers.py::"
EGRESS = "tests/egress/"

MUTATIONS: tuple[Mutation, ...] = (
    # ---- the ten the suite caught from the start
    mutation("airlock-dotdot", "the airlock's refusal of '..' in paths",
             "sandbox/core/files.py", 'if part in (b".", b".."):', 'if part in (b".",):',
             SVC + "test_svc_files.py::test_lexically_bad_paths_are_refused"),
    mutation("seccomp-ptrace", "seccomp's rule against ptrace",
             "sandbox/isolation/seccomp.py", '    "ptrace",\n', "",
             "tests/security/test_redteam.py::test_p12_ptrace_and_process_vm[bwrap]"),
    mutation("seccomp-socket-families", "seccomp's rule against every socket family but AF_UNIX",
             "sandbox/isolation/seccomp.py",
             "flt.add_rule(nosupport, name, sc.Arg(0, sc.NE, _AF_UNIX))", "pass",
             LAYERS + "test_seccomp_alone_keeps_a_sandbox_off_the_network"),
    mutation("environment-leak", "the supervisor's clean environment (the server's is not passed on)",
             "sandbox/core/launcher.py",
             'return {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH")}',
             "return dict(os.environ)",
             SVC + "test_svc_canary.py::test_server_environment_is_not_visible_inside"),
    mutation("ttl-renew", "renew's sliding of the TTL",
             "sandbox/supervisor/control.py",
             '            record["extended_until"] = time.time() + int(request["extend_seconds"])\n        record.touch()\n',
             '            record["extended_until"] = time.time() + int(request["extend_seconds"])\n',
             SVC + "test_svc_lifecycle.py::test_ttl_slides_on_execute_and_renew_then_expires"),
    mutation("lifetime-cap", "the absolute lifetime cap on renewals",
             "sandbox/supervisor/record.py",
             'min(expires, self["max_expires_at"])',
             'expires',
             SVC + "test_svc_lifecycle.py::test_max_lifetime_caps_renewals"),
    mutation("error-status", "status 'error' for a cell that raised",
             "sandbox/runtime/runtime.py", "            if not run():\n                status = V.ERROR\n",
             "            run()\n",
             SVC + "test_svc_execute.py::test_errors_are_one_error_event"),
    mutation("interrupt", "the runtime's SIGINT to a running cell",
             "sandbox/runtime/runtime.py", "signal.pthread_kill(self.main_thread, signal.SIGINT)", "pass",
             SVC + "test_svc_execute.py::test_interrupt_stops_the_cell_and_keeps_state"),
    mutation("readoption", "re-attaching to live sandboxes after a server restart",
             "sandbox/core/readoption.py",
             '            handle.record = reply["state"]\n            self.registry.live[sandbox_id] = handle\n',
             '            handle.record = reply["state"]\n',
             REL + "test_rel_restart.py::test_sandboxes_survive_server_kill9_and_a_dead_supervisor_is_reported_lost[bwrap]"),
    mutation("token", "the bearer token check",
             "sandbox/service/auth.py", "if not hmac.compare_digest(given, expected):", "if False:",
             SVC + "test_svc_api.py::test_token_is_required"),
    # ---- the ones no test caught (issue 22), and the layers each proved on its own
    mutation("ttl-renewal-at-end", "the TTL's renewal when an execute ends",
             "sandbox/supervisor/execute.py",
             '            record["execution_count"] = done["execution_count"]\n        record.touch()\n',
             '            record["execution_count"] = done["execution_count"]\n',
             SVC + "test_svc_lifecycle.py::test_a_cell_longer_than_the_ttl_leaves_the_sandbox_alive"),
    mutation("die-with-parent", "bwrap's --die-with-parent",
             "sandbox/isolation/bwrap.py", '        "--die-with-parent",\n', "",
             REL + "test_rel_restart.py::test_a_sandbox_that_outlives_its_channel_still_ends_with_its_supervisor[bwrap]"),
    mutation("distinct-host-uids", "a host uid of each sandbox's own",
             "sandbox/core/launcher.py", "            if uid not in used:\n                return uid\n",
             "            if uid not in used:\n                return self.config.uid_base\n",
             LAYERS + "test_distinct_host_uids_alone_keep_sandboxes_apart"),
    mutation("kernel-fallback-cancel", "the kernel's cancel of a cell waiting for the server",
             "kernel/control.py", "        cell.loop.call_soon_threadsafe(cell.task.cancel)\n", "",
             "tests/kernel/test_kernel.py::test_interrupt_while_the_cell_waits_for_the_server_gives_keyboardinterrupt"),
    mutation("kernel-shell-task-held", "the kernel's hold on each shell message's task while it waits",
             "kernel/queue.py", "return spawn(self.dispatch(msg), context=self._context.copy())",
             "return asyncio.get_running_loop().create_task(self.dispatch(msg), context=self._context.copy())",
             "tests/unit/test_shell_queue.py::test_a_message_waiting_on_the_sandbox_is_not_collected"),
    mutation("kernel-control-task-held", "the kernel's hold on each control message's task while it waits",
             "kernel/kernel.py", "        return spawn(super().dispatch_control(msg))",
             "        return super().dispatch_control(msg)",
             "tests/unit/test_kernel_components.py::test_a_control_message_waiting_on_the_server_is_not_collected"),
    mutation("pool-readoption", "putting re-adopted warm sandboxes back in the pool",
             "sandbox/core/readoption.py",
             "                self.pool.add(handle.image, sandbox_id, spec.get(\"isolation_backend\") or V.BWRAP)\n",
             "                pass\n",
             REL + "test_rel_restart.py::test_a_restarted_server_claims_the_pooled_sandbox_it_readopted[bwrap]"),
    mutation("network-namespace", "the sandbox's own network namespace",
             "sandbox/isolation/bwrap.py", '"--unshare-pid", "--unshare-net", ', '"--unshare-pid", ',
             LAYERS + "test_the_network_namespace_alone_keeps_a_sandbox_off_the_network"),
    mutation("seccomp-applied", "handing the seccomp filter to bwrap at all",
             "sandbox/isolation/bwrap.py", '        argv += ["--seccomp", str(seccomp_fd)]\n', "        pass\n",
             LAYERS + "test_seccomp_alone_keeps_a_sandbox_off_the_network"),
    mutation("supervisor-output-budget", "the supervisor's own output budget per execute (behind the runtime's)",
             "sandbox/supervisor/execute.py",
             'cell = CellRun(f"x{self.channel.next_id()}", self.channel.output_budget())',
             'cell = CellRun(f"x{self.channel.next_id()}", 1 << 62)',
             "tests/security/test_redteam_frames.py::test_supervisor_budget_cuts_frames_written_straight_to_the_channel[bwrap]"),
    mutation("supervisor-flood-stop", "the supervisor's stop of a flood of frames past a cell's output budget",
             "sandbox/supervisor/channel.py", "            if cell.past_budget > FLOOD_FRAMES:\n", "            if False:\n",
             "tests/security/test_redteam_frames.py::"
             "test_a_flood_of_tiny_frames_is_told_truncated_then_stopped_without_parsing_it[bwrap]"),
    mutation("runtime-output-cap", "the runtime's output cap per execute",
             "sandbox/runtime/capture.py", "return max(0, self.limit - self.used)", "return 1 << 62",
             LAYERS + "test_the_runtime_output_cap_alone_cuts_a_flood"),
    # ---- egress (sandbox/egress/): each check of the proxy, and the secret's binding
    mutation("egress-address-check", "the egress proxy's refusal of non-public resolved addresses",
             "sandbox/egress/proxy.py", "            session.policy.check_address(host, address, port)\n", "            pass\n",
             EGRESS + "test_proxy.py::test_ip_literal_and_non_public_addresses_are_refused",
             EGRESS + "test_sandbox_egress.py::test_refusals_are_clear"),
    mutation("egress-secret-binding", "replacing a placeholder only for the secret's bound hosts",
             "sandbox/egress/secrets.py", "            if secret is not None and secret.bound_to(host):",
             "            if secret is not None:",
             EGRESS + "test_proxy.py::test_placeholder_replaced_only_for_the_bound_host"),
    mutation("egress-host-header", "the egress proxy's Host header check",
             "sandbox/egress/proxy.py", '    values = [v for k, v in request.headers if k.lower() == b"host"]\n',
             "    return\n", EGRESS + "test_proxy.py::test_host_header_mismatch_is_refused",
             "tests/security/test_redteam_egress.py::test_host_header_mismatch[bwrap]"),
    mutation("egress-own-address", "the egress proxy's refusal of the sandbox server's own address",
             "sandbox/egress/proxy.py", "            if (str(address), port) in self.own_addresses or", "            if",
             EGRESS + "test_proxy.py::test_the_servers_own_address_is_refused_even_when_listed"),
    mutation("egress-upgrades", "the egress proxy's refusal of protocol upgrades",
             "sandbox/egress/proxy.py", '        if any(k.lower() == b"upgrade" for k, _ in request.headers):',
             "        if False:", EGRESS + "test_proxy.py::test_websocket_and_h2c_upgrades_are_refused"),
    mutation("egress-http1-only", "offering only HTTP/1.1 by ALPN where the proxy terminates TLS",
             "sandbox/egress/ca.py", 'context.set_alpn_protocols(["http/1.1"])', 'context.set_alpn_protocols(["h2", "http/1.1"])',
             "tests/security/test_redteam_egress.py::test_http2_and_upgrade_tricks[bwrap]"),
    # ---- the gvisor tier (tests in their [gvisor] runs; node ids of tiered tests name their tier)
    mutation("gvisor-network-none", "runsc's --network=none (gVisor's netstack with its own loopback only)",
             "sandbox/isolation/gvisor.py", '"--network", "none",', '"--network", "host",',
             "tests/security/test_redteam.py::test_p05_network[gvisor]"),
    mutation("gvisor-die-with-supervisor", "runsc's SIGKILL when its supervisor dies (bwrap's --die-with-parent)",
             "sandbox/isolation/backends/gvisor.py", "preexec_fn=_dying_with_the_supervisor(launch.child_setup)",
             "preexec_fn=launch.child_setup",
             REL + "test_rel_restart.py::test_a_sandbox_that_outlives_its_channel_still_ends_with_its_supervisor[gvisor]"),
    mutation("egress-raw-sockets", "seccomp's refusal of raw INET sockets in a sandbox with egress",
             "sandbox/isolation/seccomp.py", "            for kind in _RAW_TYPES:", "            for kind in ():",
             "tests/unit/test_seccomp.py::test_egress_variant_denies_raw_sockets"),
    # ---- supervisors forked from the supervisor template
    Mutation("template-descriptors", "a forked supervisor holding only its own descriptors (two layers: the "
             "template closes each request's after the fork, the child all but its own)",
             (Edit("sandbox/supervisor/template.py",
                   "            for fd in fds:  # the child has its own copies; the next child must not get these\n"
                   "                os.close(fd)\n", "            pass\n"),
              Edit("sandbox/supervisor/template.py", "            os.closerange(low + 1, high)\n", "            pass\n")),
             (SVC + "test_svc_supervisor_template.py::test_supervisors_are_forked_by_the_template_and_hold_only_their_own_files",)),
    mutation("forked-supervisor-identity", "telling a forked supervisor by its sandbox's log on its stdout (else "
             "the server files it as crashed, and a new server as lost)",
             "sandbox/common/paths.py", "return bool(log) and (log == expected or log == os.path.realpath(expected))",
             "return False",
             SVC + "test_svc_supervisor_template.py::test_forked_supervisors_outlive_the_server_are_readopted_and_"
             "their_ttl_still_ends_them"),
    mutation("jvm-memory-limit", "a JVM's heap sized from the sandbox's memory limit (else from the host's "
             "memory: filling it is an out-of-memory kill, on gVisor of the whole sandbox)",
             "sandbox/isolation/bwrap.py",
             "        **runtime_environment(limits),  # a JVM's heap inside the sandbox's memory limit\n", "",
             "tests/images/test_java_image.py::test_javac_and_java_run_from_a_python_cell_on_each_tier[bwrap]",
             "tests/images/test_java_image.py::test_javac_and_java_run_from_a_python_cell_on_each_tier[gvisor]"),
)


# ----------------------------------------------------------------------- checking


def problems(m: Mutation, root: pathlib.Path = REPO) -> list[str]:
    """Why a mutation cannot be applied to the code under ``root`` as described, or why
    its tests cannot be found; empty when all is well."""
    found = []
    for edit in m.edits:
        path = root / edit.path
        if not path.is_file():
            found.append(f"{edit.path} does not exist")
            continue
        count = path.read_text().count(edit.old)
        if count != 1:
            found.append(f"mutation no longer applies: {edit.path} holds the old text {count} times "
                         f"(expected once): {edit.old.strip()[:80]!r}")
    for node in m.tests:
        file, _, name = node.partition("::")
        test_file = root / file
        if not test_file.is_file():
            found.append(f"test file {file} does not exist")
        elif f"def {name.split('[')[0]}(" not in test_file.read_text():
            found.append(f"no test {name} in {file}")
    return found


def apply(m: Mutation, root: pathlib.Path) -> dict[pathlib.Path, str]:
    """Apply a mutation under ``root``; returns the files' original texts."""
    originals: dict[pathlib.Path, str] = {}
    for edit in m.edits:
        path = root / edit.path
        text = originals.setdefault(path, path.read_text())
        path.write_text(path.read_text().replace(edit.old, edit.new, 1))
        assert text != path.read_text()
    return originals


def restore(originals: dict[pathlib.Path, str]) -> None:
    for path, text in originals.items():
        path.write_text(text)


def scratch_copy(dest: pathlib.Path) -> pathlib.Path:
    """The working tree's files (tracked and new, not ignored) copied to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = REPO / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def borrow_images(source: str | None, state: pathlib.Path) -> None:
    """A state directory of the run's own, with ``source``'s built images (their
    image.json only: the venvs stay where they are), so that no image is built and no
    other test run on ``source`` meets this run's servers: servers re-adopt every
    sandbox they find in their state directory, mutated or not."""
    state.chmod(0o711)  # sandbox uids traverse it
    for info in pathlib.Path(source).glob("images/*/image.json") if source else ():
        dest = state / "images" / info.parent.name
        dest.mkdir(mode=0o755, parents=True)
        (state / "images").chmod(0o755)
        shutil.copy2(info, dest / "image.json")


@dataclass
class Outcome:
    verdict: str  # killed | survived | skipped | error
    detail: str
    seconds: float


def run_tests(root: pathlib.Path, tests: tuple[str, ...], env: dict[str, str], timeout: float) -> Outcome:
    report = root / "mutation-junit.xml"
    began = time.monotonic()
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=",
            f"--junitxml={report}", *tests]
    try:
        r = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome("error", f"tests ran past {timeout:.0f} s", time.monotonic() - began)
    seconds = time.monotonic() - began
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
    if not report.exists():
        return Outcome("error", f"pytest exit {r.returncode}, no report:\n{tail}", seconds)
    results = []
    for case in ET.parse(report).getroot().iter("testcase"):
        kind = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        message = next((child.get("message", "") for child in case if child.tag == kind), "")
        results.append((f"{case.get('classname')}.{case.get('name')}", kind, message))
    report.unlink()
    failed = [(n, m) for n, k, m in results if k in ("failure", "error")]
    if failed:
        name, message = failed[0]
        summary = " ".join(message.split())[:300]
        return Outcome("killed", f"{name.rsplit('.', 1)[-1]}: {summary}", seconds)
    skipped = [(n, m) for n, k, m in results if k == "skipped"]
    if skipped or not results:
        return Outcome("skipped", skipped[0][1][:200] if skipped else f"no test ran:\n{tail}", seconds)
    if r.returncode != 0:
        return Outcome("error", f"pytest exit {r.returncode}:\n{tail}", seconds)
    return Outcome("survived", f"{len(results)} test(s) passed", seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that every mutation still applies")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests")
    parser.add_argument("-k", dest="keyword", help="only the mutations whose name contains this")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated tests")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one mutation's tests may take")
    args = parser.parse_args(argv)

    chosen = [m for m in MUTATIONS if not args.keyword or args.keyword in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name:<24} removes {m.removes}\n{'':<24} caught by {', '.join(m.tests)}")
        return 0
    broken = {m.name: problems(m) for m in chosen}
    for name, found in broken.items():
        for problem in found:
            print(f"BROKEN   {name}: {problem}")
    if any(broken.values()):
        return 2
    if args.check:
        print(f"all {len(chosen)} mutations apply to the current code")
        return 0
    if os.geteuid() != 0:
        print("note: not root, so the mutations of root-only protections will be reported as skipped")

    began = time.monotonic()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="sbk-mutation-", dir="/tmp"))
    scratch.chmod(0o711)
    state = pathlib.Path(tempfile.mkdtemp(prefix="sbk-mutation-state-", dir="/tmp"))
    borrow_images(os.environ.get("SANDBOX_KERNEL_TEST_STATE_DIR"), state)
    env = {k: v for k, v in os.environ.items() if k not in ("SANDBOX_KERNEL_TEST_URL", "SANDBOX_KERNEL_TEST_TOKEN")}
    env.update(PYTHONPATH=str(scratch / "code"), SANDBOX_KERNEL_TEST_STATE_DIR=str(state), PYTHONDONTWRITEBYTECODE="1")
    outcomes: dict[str, Outcome] = {}
    try:
        code = scratch_copy(scratch / "code")
        print(f"scratch copy in {code}; test state in {state}", flush=True)
        imported = subprocess.run([sys.executable, "-c", "import sandbox, kernel; print(sandbox.__file__, kernel.__file__)"],
                                  cwd=code, env=env, capture_output=True, text=True).stdout.split()
        if len(imported) != 2 or not all(path.startswith(str(code)) for path in imported):
            print(f"the scratch copy's code is not what its tests would import: {imported}")
            return 2
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            base = run_tests(code, tests, env, args.timeout * 2)
            print(f"baseline ({len(tests)} tests, unmutated): {base.verdict} in {base.seconds:.0f} s", flush=True)
            if base.verdict in ("killed", "error"):
                print(f"the unmutated tests fail, so no mutation can be judged:\n{base.detail}")
                return 2
        for m in chosen:
            originals = apply(m, code)
            try:
                outcome = run_tests(code, m.tests, env, args.timeout)
            finally:
                restore(originals)
            outcomes[m.name] = outcome
            print(f"{outcome.verdict.upper():<9}{m.name:<24}{outcome.seconds:>5.0f} s  {outcome.detail.splitlines()[0] if outcome.detail else ''}",
                  flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    counts = {v: sum(1 for o in outcomes.values() if o.verdict == v) for v in ("killed", "survived", "skipped", "error")}
    print(f"\n{len(outcomes)} mutations: {counts['killed']} killed, {counts['survived']} survived, "
          f"{counts['skipped']} skipped, {counts['error']} errors; {time.monotonic() - began:.0f} s in all")
    for name, outcome in outcomes.items():
        if outcome.verdict != "killed":
            print(f"  {outcome.verdict}: {name}: {outcome.detail}")
    return 0 if counts["killed"] == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
