"""The airlock: files into and out of /workspace, and the ways a sandbox (or a caller)
could try to make the root-run server read or write outside it.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import secrets
import time

import httpx
import pytest

from support import ok, sandbox_dir
from svc_support import api_error, declared_too_large, last_json_line, raw_request, sandbox_for_module

MiB = 1024 * 1024
FILE_CAP = 100 * MiB  # the server's default file_max_bytes


@pytest.fixture(scope="module")
def sid(sandbox_server):
    """One workspace for the module: every test uses its own file names in it."""
    yield from sandbox_for_module(sandbox_server)


def listing(api, sid: str) -> dict[str, dict]:
    r = api.get(f"/v1/sandboxes/{sid}/files")
    assert r.status_code == 200, r.text
    return {f["path"]: f for f in r.json()["files"]}


def test_small_file_round_trip_and_delete(api, sid, run):
    payload = b"a,b\n1,2\n" + bytes(range(256))
    r = api.put(f"/v1/sandboxes/{sid}/files/data.csv", content=payload)
    assert r.status_code == 201, r.text
    assert r.json() == {"path": "data.csv", "size": len(payload)}
    r = api.get(f"/v1/sandboxes/{sid}/files/data.csv")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.content == payload
    files = listing(api, sid)
    assert files["data.csv"]["size"] == len(payload) and files["data.csv"]["type"] == "file"

    r = api.put(f"/v1/sandboxes/{sid}/files/sub/dir/nested.txt", content=b"nested\n")
    assert r.status_code == 201 and r.json() == {"path": "sub/dir/nested.txt", "size": 7}
    files = listing(api, sid)
    assert files["sub"]["type"] == "directory" and files["sub/dir"]["type"] == "directory"
    assert files["sub/dir/nested.txt"]["size"] == 7

    # the sandbox sees both at /workspace/<path>, and what it writes comes back out
    seen = last_json_line(run(sid, "\n".join([
        "import json",
        "a = open('/workspace/data.csv', 'rb').read()",
        "b = open('/workspace/sub/dir/nested.txt').read()",
        "open('/workspace/sub/made-inside.txt', 'w').write('from the sandbox\\n')",
        "print(json.dumps([a.hex(), b]))",
    ])))
    assert seen == [payload.hex(), "nested\n"]
    r = api.get(f"/v1/sandboxes/{sid}/files/sub/made-inside.txt")
    assert r.status_code == 200 and r.content == b"from the sandbox\n"

    r = api.delete(f"/v1/sandboxes/{sid}/files/data.csv")
    assert r.status_code == 200 and r.json() == {"path": "data.csv", "deleted": True}
    assert "data.csv" not in listing(api, sid)
    assert api_error(api.get(f"/v1/sandboxes/{sid}/files/data.csv"), 404)["code"] == "not_found"
    assert api_error(api.delete(f"/v1/sandboxes/{sid}/files/data.csv"), 404)["code"] == "not_found"
    assert last_json_line(run(sid, "import os, json; print(json.dumps(os.path.exists('/workspace/data.csv')))")) is False


def test_large_file_streams_both_ways(api, sid, run):
    size = 50 * MiB
    sent = hashlib.sha256()

    def chunks():
        for _ in range(size // MiB):
            block = os.urandom(MiB)
            sent.update(block)
            yield block

    r = api.put(f"/v1/sandboxes/{sid}/files/big/blob.bin", content=chunks())
    assert r.status_code == 201, r.text
    assert r.json() == {"path": "big/blob.bin", "size": size}
    assert listing(api, sid)["big/blob.bin"]["size"] == size

    received = hashlib.sha256()
    total = 0
    with api.stream("GET", f"/v1/sandboxes/{sid}/files/big/blob.bin") as r:
        assert r.status_code == 200
        assert int(r.headers["content-length"]) == size
        for block in r.iter_bytes():
            total += len(block)
            received.update(block)
    assert total == size
    assert received.hexdigest() == sent.hexdigest()

    inside = last_json_line(run(sid, "\n".join([
        "import hashlib, json",
        "h = hashlib.sha256()",
        "with open('/workspace/big/blob.bin', 'rb') as f:",
        "    for block in iter(lambda: f.read(1 << 20), b''):",
        "        h.update(block)",
        "print(json.dumps(h.hexdigest()))",
    ])))
    assert inside == sent.hexdigest()


def test_upload_over_the_cap_is_refused(sandbox_server, api, sid):
    path = f"/v1/sandboxes/{sid}/files/huge.bin"
    # a declared length over the cap is refused before any byte of the body is read
    r = declared_too_large(sandbox_server.url, path, sandbox_server.token, FILE_CAP + 1, b"x" * 10)
    assert api_error(r, 413)["code"] == "too_large"

    # a chunked body (no declared length) is cut off once it passes the cap
    block = b"\0" * MiB
    produced = 0

    def over_cap():
        nonlocal produced
        for _ in range(FILE_CAP // MiB + 2):
            produced += 1
            yield block

    r = api.put(path, content=over_cap())
    assert api_error(r, 413)["code"] == "too_large"
    assert produced > FILE_CAP // MiB, "refused before the body reached the cap"
    assert "huge.bin" not in listing(api, sid)
    workspace = sandbox_dir(sandbox_server, sid) / "workspace"
    leftovers = [p.name for p in workspace.iterdir() if p.name == "huge.bin" or p.name.startswith(".upload-")]
    assert leftovers == [], "the refused upload left a file behind"


def test_lexically_bad_paths_are_refused(sandbox_server, api, sid):
    assert api.put(f"/v1/sandboxes/{sid}/files/ok.txt", content=b"ok").status_code == 201
    base = f"/v1/sandboxes/{sid}/files/"
    for bad in ("..", "../x", "a/../../b", "sub/../ok.txt", "./ok.txt", "%2Fetc%2Fpasswd", "a%00b",
                "%2E%2E/%2E%2E/token", "..%2F..%2Ftoken"):
        for method in ("GET", "PUT", "DELETE"):
            r = raw_request(sandbox_server.url, method, base + bad, token=sandbox_server.token,
                            body=b"data" if method == "PUT" else None)
            assert 400 <= r.status_code < 500, (method, bad, r.status_code, r.text)
            api_error(r, r.status_code)
            assert b"root:" not in r.content
    # nothing was written next to the workspace, and the good file is intact
    sandbox = sandbox_dir(sandbox_server, sid)
    assert not (sandbox / "x").exists() and not (sandbox / "b").exists()
    assert api.get(f"/v1/sandboxes/{sid}/files/ok.txt").content == b"ok"


def test_links_and_fifos_planted_by_the_sandbox_are_refused(sandbox_server, api, sid, run):
    marker = f"sbk-airlock-{secrets.token_hex(6)}"
    ok(run(sid, "\n".join([
        "import os",
        "os.symlink('/etc/passwd', '/workspace/link')",
        "os.symlink('/', '/workspace/root')",
        "os.mkdir('/workspace/real')",
        "os.symlink('../real', '/workspace/real-link')",
        "os.mkfifo('/workspace/fifo')",
        "open('/workspace/real/inside.txt', 'w').write('inside')",
    ])))
    # control: the host file the links point at really exists and has host content
    host_passwd = pathlib.Path("/etc/passwd").read_bytes()
    assert b"root:x:0:0" in host_passwd

    def refused(r: httpx.Response):
        assert r.status_code == 400, (r.request.url, r.status_code, r.text)
        assert api_error(r, 400)["code"] == "invalid_path"
        assert b"root:x:0:0" not in r.content and host_passwd[:64] not in r.content

    base = f"/v1/sandboxes/{sid}/files"
    refused(api.get(f"{base}/link"))
    refused(api.get(f"{base}/root/etc/passwd"))
    refused(api.get(f"{base}/real-link/inside.txt"))
    refused(api.put(f"{base}/root/tmp/{marker}", content=b"escaped"))
    refused(api.put(f"{base}/link", content=b"overwrite the target?"))
    assert not pathlib.Path("/tmp", marker).exists()
    assert pathlib.Path("/etc/passwd").read_bytes() == host_passwd

    t0 = time.monotonic()
    with httpx.Client(base_url=sandbox_server.url, timeout=15,
                      headers={"Authorization": f"Bearer {sandbox_server.token}"}) as quick:
        refused(quick.get(f"{base}/fifo"))
    assert time.monotonic() - t0 < 15

    # the link is listed as a link (not followed), and the real directory still works
    files = listing(api, sid)
    assert files["link"]["type"] == "symlink" and files["root"]["type"] == "symlink"
    assert files["fifo"]["type"] == "other"
    assert not any(p.startswith(("root/", "real-link/")) for p in files), files
    assert api.get(f"{base}/real/inside.txt").content == b"inside"
    # deleting a link removes the link, never its target
    assert api.delete(f"{base}/link").json() == {"path": "link", "deleted": True}
    assert pathlib.Path("/etc/passwd").read_bytes() == host_passwd


# ---------------------------------------------------------------- what the sandbox names


DEPTH = 1200  # deeper than Python's recursion limit and than 1024 open files


def test_a_tree_deeper_than_the_recursion_limit_lists_and_deletes(api, sid, run):
    import sys

    assert DEPTH > sys.getrecursionlimit(), "the probe would not reach a recursive walk's limit"
    ok(run(sid, "\n".join([
        "import os",
        "fd = os.open('/workspace', os.O_RDONLY)",
        "os.mkdir('deep', dir_fd=fd)",
        "fd = os.open('deep', os.O_RDONLY, dir_fd=fd)",
        f"for _ in range({DEPTH} - 1):",
        "    os.mkdir('d', dir_fd=fd)",
        "    nxt = os.open('d', os.O_RDONLY, dir_fd=fd)",
        "    os.close(fd)",
        "    fd = nxt",
        "os.close(os.open('bottom.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd))",
    ]), timeout_seconds=120))
    r = api.get(f"/v1/sandboxes/{sid}/files")
    assert r.status_code == 200, r.text
    body = r.json()
    deep = [f["path"] for f in body["files"] if f["path"].startswith("deep")]
    bottom = "deep/" + "d/" * (DEPTH - 1) + "bottom.txt"
    assert len(deep) == DEPTH + 1 and bottom in deep, (len(deep), deep[-1][-40:])
    assert body["truncated"] is False and body["count"] == len(body["files"])

    r = api.delete(f"/v1/sandboxes/{sid}/files/deep")
    assert r.status_code == 200 and r.json() == {"path": "deep", "deleted": True}, r.text
    assert not any(p.startswith("deep") for p in listing(api, sid))
    gone = last_json_line(run(sid, "import os, json; print(json.dumps(os.path.exists('/workspace/deep')))"))
    assert gone is False


# A name of bytes that are not UTF-8, one with a backslash, one with control characters.
ODD_NAMES = {
    b"bad-\xff-name.txt": "bad-\\xff-name.txt",
    b"back\\slash.txt": "back\\\\slash.txt",
    b"line\nbreak\x1b[31m.txt": "line\\x0abreak\\x1b[31m.txt",
}


def test_names_that_are_not_text_are_listed_escaped_and_taken_back(sandbox_server, api, sid, run):
    ok(run(sid, "\n".join([
        "import os",
        "os.makedirs('/workspace/odd', exist_ok=True)",
        f"for name in {list(ODD_NAMES)!r}:",
        "    with open(b'/workspace/odd/' + name, 'wb') as f:",
        "        f.write(b'content of ' + name)",
    ])))
    files = listing(api, sid)
    for raw, escaped in ODD_NAMES.items():
        path = "odd/" + escaped
        assert files.get(path, {}).get("type") == "file", (path, sorted(p for p in files if p.startswith("odd/")))
        r = api.get(f"/v1/sandboxes/{sid}/files/{path}")
        assert r.status_code == 200 and r.content == b"content of " + raw, (path, r.status_code, r.text)
    # what goes in under an escaped name has exactly those bytes inside
    r = api.put(f"/v1/sandboxes/{sid}/files/odd/up-\\xfe-\\\\.bin", content=b"up")
    assert r.status_code == 201 and r.json()["path"] == "odd/up-\\xfe-\\\\.bin", r.text
    inside = last_json_line(run(sid, "import os, json; print(json.dumps(sorted(n.hex() for n in os.listdir(b'/workspace/odd'))))"))
    assert sorted(inside) == sorted(n.hex() for n in [*ODD_NAMES, b"up-\xfe-\\.bin"])
    # a stray backslash, and a URL whose percent escapes are not UTF-8, are refused readably
    error = api_error(api.get(f"/v1/sandboxes/{sid}/files/odd/bad\\q"), 400)
    assert error["code"] == "invalid_path" and "escape" in error["message"], error
    r = raw_request(sandbox_server.url, "GET", f"/v1/sandboxes/{sid}/files/odd/bad-%FF-name.txt", token=sandbox_server.token)
    error = api_error(r, 400)
    assert "\\xHH" in error["message"], error
    assert api_error(api.get(f"/v1/sandboxes/{sid}/files/odd/\\x00x"), 400)["code"] == "invalid_path"
    # the escapes cannot spell a way out
    for sneaky in ("\\x2e\\x2e/token", "odd/\\x2e\\x2e/\\x2e\\x2e/token", "\\x2fetc/passwd"):
        r = api.get(f"/v1/sandboxes/{sid}/files/{sneaky}")
        assert r.status_code in (400, 404), (sneaky, r.status_code, r.text)
        assert b"root:" not in r.content
    for raw, escaped in ODD_NAMES.items():
        r = api.delete(f"/v1/sandboxes/{sid}/files/odd/{escaped}")
        assert r.status_code == 200 and r.json() == {"path": "odd/" + escaped, "deleted": True}, r.text
    assert [p for p in listing(api, sid) if p.startswith("odd/")] == ["odd/up-\\xfe-\\\\.bin"]
    assert api.delete(f"/v1/sandboxes/{sid}/files/odd").status_code == 200


def test_a_listing_stops_at_its_cap_and_says_so(api, sid, run):
    cap = 10000  # the server's default files_list_max
    ok(run(sid, "\n".join([
        "import os",
        "os.makedirs('/workspace/many', exist_ok=True)",
        f"for i in range({cap} + 500):",
        "    open(f'/workspace/many/f{i:05d}', 'w').close()",
    ]), timeout_seconds=120))
    r = api.get(f"/v1/sandboxes/{sid}/files")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["truncated"] is True and body["limit"] == cap, {k: v for k, v in body.items() if k != "files"}
    assert body["count"] == len(body["files"]) <= cap
    assert api.delete(f"/v1/sandboxes/{sid}/files/many").status_code == 200
    # control: the same workspace without the crowd is listed whole
    body = api.get(f"/v1/sandboxes/{sid}/files").json()
    assert body["truncated"] is False and body["count"] == len(body["files"]) < cap
