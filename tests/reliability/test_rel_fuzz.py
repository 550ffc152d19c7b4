"""Schema-driven fuzzing: whatever a client sends, the server answers 4xx, never 5xx, and
keeps serving.

Schemathesis generates valid (positive) and invalid (negative) requests for every
operation of the OpenAPI document the session server publishes, and sends them to a
server of this test's own (so that nothing it creates, renews or deletes can touch other
tests' sandboxes). Half of the requests on a sandbox path go to a real, live sandbox (the
"target"), so execute, files, complete and inspect are fuzzed past the 404. A second
sandbox (the "bystander") is never named to the fuzzer and must keep its variables.

On the gVisor tier, only the operations that reach a sandbox are fuzzed (a create, and every
call on one): the rest is the same server code on either tier, fuzzed on bwrap.

Left out: ``POST /v1/images`` (a positive case is a real pip build from PyPI: minutes and
network). Execute timeouts are capped at 5 s so that generated code cannot hold the run.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import support

pytestmark = pytest.mark.slow


EXAMPLES = 20
EXAMPLES_CREATE = 8  # each positive one boots a real sandbox: a create, a fork (gVisor's)
BOOTS = {("POST", "/v1/sandboxes"), ("POST", "/v1/sandboxes/{sandbox_id}/fork")}
# Draining is an admin switch that makes every later create a 503 by design (tests/gateway/).
SKIP = {("POST", "/v1/images"), ("POST", "/v1/node/drain")}


def reaches_a_sandbox(method: str, path: str) -> bool:
    """An operation whose handling depends on the sandbox's tier: a create, and every call on
    a sandbox. The others (health, info, images, secrets, usage, the node's own) run the same
    server code whatever the default tier, so their fuzzing on bwrap covers them."""
    return "{sandbox_id}" in path or (method, path) == ("POST", "/v1/sandboxes")


def test_fuzzed_requests_never_get_a_5xx_and_the_server_keeps_serving(sandbox_server, spawn_server, isolation):
    server = spawn_server()
    auth = server.headers
    schema = schemathesis.openapi.from_url(sandbox_server.url + "/v1/openapi.json",
                                           headers={"Authorization": f"Bearer {sandbox_server.token}"})
    with server.client() as c:
        bystander = support.create(c)["id"]
        target = support.create(c)["id"]
        support.ok(support.execute(c, bystander, "kept = 'bystander'"))
        support.ok(support.execute(c, target, "kept = 'target'"))
    server_pid = server.proc.pid

    server_errors: list[str] = []
    unshaped: list[str] = []
    statuses: dict[str, dict[int, int]] = {}
    created: list[str] = []

    def adjust(case, live: bool) -> None:
        method, path = case.operation.method.upper(), case.operation.path
        params = case.path_parameters
        if params and "sandbox_id" in params and live and not (method == "DELETE" and path == "/v1/sandboxes/{sandbox_id}"):
            params["sandbox_id"] = target
        if path.endswith(("/execute", "/comm")) and isinstance(case.body, dict):
            timeout = case.body.get("timeout_seconds")
            if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout > 5:
                case.body["timeout_seconds"] = 5

    def fuzz(operation, mode, examples: int) -> None:
        label = f"{operation.method.upper()} {operation.path}"

        @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        @given(case=operation.as_strategy(generation_mode=mode), live=st.booleans())
        def one(case, live):
            adjust(case, live)
            response = case.call(base_url=server.url, headers=auth, timeout=60)
            if response.status_code >= 500:
                server_errors.append(f"{label} -> {response.status_code} {response.text[:300]}\n  "
                                     f"{case.as_curl_command(headers=auth)}")
            if label == "POST /v1/sandboxes" and response.status_code == 201:
                created.append(response.json()["id"])
                with server.client() as c:
                    c.delete(f"/v1/sandboxes/{response.json()['id']}")
            if response.status_code >= 400:
                try:
                    body = response.json()
                    shaped = set(body) == {"error"} and isinstance(body["error"].get("code"), str) \
                        and isinstance(body["error"].get("message"), str)
                except (ValueError, AttributeError):
                    shaped = False
                if not shaped:
                    unshaped.append(f"{label} -> {response.status_code} {response.text[:200]!r}")
            statuses.setdefault(label, {}).setdefault(response.status_code, 0)
            statuses[label][response.status_code] += 1

        one()

    for result in schema.get_all_operations():
        operation = result.ok()
        key = (operation.method.upper(), operation.path)
        if key in SKIP:
            continue
        if isolation != "bwrap" and not reaches_a_sandbox(*key):
            continue
        examples = EXAMPLES_CREATE if key in BOOTS else EXAMPLES
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            fuzz(operation, mode, examples)

    print(f"\nfuzz: {sum(sum(c.values()) for c in statuses.values())} requests over {len(statuses)} operations, "
          f"{len(created)} sandboxes created (and deleted)")
    for label, codes in sorted(statuses.items()):
        print(f"  {label}: " + ", ".join(f"{code} x{n}" for code, n in sorted(codes.items())))

    assert not server_errors, "\n".join(server_errors[:10])
    # api.md: every error is JSON {"error": {"code", "message"}}, whatever went wrong.
    assert not unshaped, "\n".join(unshaped[:10])
    assert server.running and server.proc.pid == server_pid and server.healthy()
    assert "unexpected error" not in server.log_path.read_text(errors="replace")
    with server.client() as c:
        events = support.ok(support.execute(c, bystander, "kept"))
        assert support.result_text(events) == "'bystander'"
        listed = {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}
        assert bystander in listed and not (set(created) & listed)
        r = c.get(f"/v1/sandboxes/{target}")
        print(f"  the fuzzed target sandbox ended the run: {r.status_code} {r.text[:160]}")
