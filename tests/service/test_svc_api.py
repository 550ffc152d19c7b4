"""The HTTP surface itself: the token, and what bad input gets back (a JSON error with the
right status, never a crash, never a lost sandbox).
"""

from __future__ import annotations

import json

import httpx
import pytest
from support import ok, result_text
from svc_support import api_error, raw_request, sandbox_for_module


@pytest.fixture(scope="module")
def sid(sandbox_server):
    """Both tests leave their sandbox usable (that is what the second one checks)."""
    yield from sandbox_for_module(sandbox_server)


def test_token_is_required(sandbox_server, sid):
    url = sandbox_server.url
    for path in ("/v1/sandboxes", f"/v1/sandboxes/{sid}", "/v1/info", "/v1/openapi.json"):
        r = httpx.get(url + path)
        error = api_error(r, 401)
        assert error["code"] == "unauthorized" and "missing" in error["message"]
        assert r.headers["www-authenticate"] == "Bearer"
        for wrong in (sandbox_server.token[:-1], sandbox_server.token + "x", "x", "Bearer"):
            r = httpx.get(url + path, headers={"Authorization": f"Bearer {wrong}"})
            assert api_error(r, 401)["code"] == "unauthorized", (path, wrong)
        r = httpx.get(url + path, headers={"Authorization": sandbox_server.token})  # no "Bearer "
        assert api_error(r, 401)["code"] == "unauthorized"
    # what a caller without the token must not be able to do
    assert api_error(httpx.post(url + "/v1/sandboxes", json={}), 401)["code"] == "unauthorized"
    assert api_error(httpx.post(f"{url}/v1/sandboxes/{sid}/execute", json={"code": "1"}), 401)
    assert api_error(httpx.delete(f"{url}/v1/sandboxes/{sid}"), 401)
    assert api_error(httpx.get(f"{url}/v1/sandboxes/{sid}/files"), 401)

    r = httpx.get(url + "/v1/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    # control: the right token opens the same routes, and the sandbox survived the attempts
    r = httpx.get(f"{url}/v1/sandboxes/{sid}", headers={"Authorization": f"Bearer {sandbox_server.token}"})
    assert r.status_code == 200 and r.json()["state"] == "running"


def test_bad_input_gets_json_errors_and_loses_nothing(sandbox_server, api, sid, run):
    ok(run(sid, "kept = 'still here'"))
    before = {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]}
    post = lambda path, raw: api.post(path, content=raw, headers={"Content-Type": "application/json"})  # noqa: E731

    for path in ("/v1/sandboxes", f"/v1/sandboxes/{sid}/execute", f"/v1/sandboxes/{sid}/renew"):
        error = api_error(post(path, b'{"ttl_seconds": '), 400)
        assert "JSON" in error["message"], error
        assert api_error(post(path, b"[1, 2]"), 400)["code"] == "invalid_request"
        assert api_error(post(path, b"\xff\xfe"), 400)

    error = api_error(api.post("/v1/sandboxes", json={"ttl_seconds": 60, "colour": "blue"}), 422)
    assert "colour" in error["message"] and error["code"] == "invalid_request"
    error = api_error(api.post(f"/v1/sandboxes/{sid}/execute", json={"code": "1", "timeout": 5}), 422)
    assert "timeout" in error["message"]
    error = api_error(api.post(f"/v1/sandboxes/{sid}/execute", json={}), 422)
    assert "code" in error["message"]

    for body, field in ((b'{"memory_mb": "x"}', "memory_mb"), (b'{"ttl_seconds": true}', "ttl_seconds"),
                        (b'{"pids": 1.5}', "pids"), (b'{"metadata": []}', "metadata"),
                        (b'{"ttl_seconds": -1}', "ttl_seconds"), (b'{"memory_mb": 1}', "memory_mb")):
        error = api_error(post("/v1/sandboxes", body), 422)
        assert field in error["message"], (body, error)
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        error = api_error(post("/v1/sandboxes", b'{"cpus": ' + literal + b"}"), 400)
        assert "JSON" in error["message"] or literal.decode().lstrip("-") in error["message"], error
    error = api_error(post(f"/v1/sandboxes/{sid}/execute", json.dumps({"code": 5}).encode()), 422)
    assert "code" in error["message"]

    huge = json.dumps({"code": "x = 1  # " + "a" * (2 * 1024 * 1024)}).encode()
    assert api_error(post(f"/v1/sandboxes/{sid}/execute", huge), 413)["code"] == "too_large"
    assert api_error(post("/v1/sandboxes", huge), 413)["code"] == "too_large"

    error = api_error(api.get("/v1/sandboxes/sbx-doesnotexist"), 404)
    assert error["code"] == "not_found" and "sbx-doesnotexist" in error["message"]
    for method, path in (("POST", "/v1/sandboxes/sbx-nope/execute"), ("DELETE", "/v1/sandboxes/sbx-nope"),
                         ("POST", "/v1/sandboxes/sbx-nope/renew"), ("GET", "/v1/sandboxes/sbx-nope/files")):
        error = api_error(api.request(method, path, json={"code": "1"} if method == "POST" else None), 404)
        assert "sbx-nope" in error["message"], (method, path, error)

    error = api_error(api.get("/v1/nothing-here"), 404)
    assert error["code"] == "not_found" and "/v1/nothing-here" in error["message"]
    error = api_error(api.put("/v1/sandboxes", json={}), 405)
    assert error["code"] == "method_not_allowed"
    assert api_error(api.patch(f"/v1/sandboxes/{sid}", json={}), 405)["code"] == "method_not_allowed"
    # a request line httpx would not send: must still be a JSON error, not a crash
    r = raw_request(sandbox_server.url, "GET", "/v1/sandboxes/%ZZ", token=sandbox_server.token)
    assert "%ZZ" in api_error(r, 404)["message"]

    # nothing stored was lost, and no stray sandbox was made by the refused creates
    assert {s["id"] for s in api.get("/v1/sandboxes").json()["sandboxes"]} == before
    assert api.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
    assert result_text(ok(run(sid, "kept"))) == "'still here'"
    assert api.get("/v1/health").json()["status"] == "ok"
