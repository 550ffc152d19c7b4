"""State by value: a sandbox's namespace saved inside it, kept by the server as bytes, and
loaded inside a new sandbox after the first one ended (its TTL, a server restart).

Each test looks where the bytes land: the owner's store under STATE/saves (what the host
keeps), the new sandbox's namespace (what came back), a marker file on the host (a pickle
the host must never load).
"""

from __future__ import annotations

import pathlib
import pickle

import pytest

from tests import support
from tests.saved_namespace import BACK, CHECK
from tests.saved_namespace import NOTEBOOK as SAVED_NOTEBOOK

pytestmark = pytest.mark.bwrap_only("state by value is the default tier's way to outlive a sandbox")

NOTEBOOK = SAVED_NOTEBOOK + 'print(df.memory_usage(deep=True).sum() // 2**20, "MiB")\n'


def saves_dir(server: support.Server) -> pathlib.Path:
    return server.state_dir / "saves"


def stored_files(server: support.Server) -> list[pathlib.Path]:
    return sorted(saves_dir(server).glob("*/sv-*/state.bin"))


@pytest.mark.slow
def test_a_namespace_comes_back_after_its_sandbox_ended_by_ttl_and_a_server_restart(spawn_server):
    """No explicit save: a sandbox with a save_label is saved by value just before its TTL ends it."""
    server = spawn_server()
    with server.client(timeout=300) as api:
        sandbox = support.create(api, ttl_seconds=8, metadata={"save_label": "nb-1"})
        first = support.ok(support.execute(api, sandbox["id"], NOTEBOOK))
        assert support.stream_text(first).strip() == "100 MiB"
        # its TTL ends it ...
        support.wait_for(lambda: api.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 410, 120)
    # ... and the server restarts
    server.terminate()
    server.start()
    with server.client(timeout=300) as api:
        listed = api.get("/v1/saves", params={"label": "nb-1"}).json()["saves"]
        # newest first; a loaded host that takes past the TTL's last seconds to save may save twice
        assert listed and all(s["by"] == "ttl" and s["source_sandbox"] == sandbox["id"] for s in listed), listed
        save = listed[0]
        assert save["bytes"] > 100 * 2**20
        lost = {item["name"]: item for item in save["summary"]["lost"]}
        assert set(lost) == {"log"} and "TextIOWrapper" in lost["log"]["type"] and "open file" in lost["log"]["why"]
        assert {"df", "model", "scale", "expected", "LeastSquares"} <= {i["name"] for i in save["summary"]["saved"]}
        created = api.post("/v1/sandboxes", json={"from_save": save["id"]})
        assert created.status_code == 201, created.text
        restored = created.json()["restored"]
        assert "error" not in restored, restored
        assert {"df", "model", "scale"} <= {i["name"] for i in restored["restored"]}
        assert [i["name"] for i in restored["lost"]] == ["log"]
        assert restored["save"]["id"] == save["id"] and restored["save"]["age_seconds"] >= 0
        events = support.ok(support.execute(api, created.json()["id"], CHECK))
        assert support.result_text(events) == BACK
        api.delete(f"/v1/sandboxes/{created.json()['id']}")


@pytest.mark.slow
def test_an_orderly_stop_that_ends_sandboxes_saves_the_labelled_ones_first(spawn_server):
    server = spawn_server("--set", "delete_on_shutdown=true")
    with server.client(timeout=120) as api:
        kept = support.create(api, metadata={"save_label": "agent-task"})
        support.create(api)  # no label: not saved
        support.ok(support.execute(api, kept["id"], "answer = {'rows': 3}"))
    server.sigterm()
    server.wait(120)
    server.start()
    with server.client(timeout=120) as api:
        saves = api.get("/v1/saves").json()["saves"]
        assert [(s["label"], s["by"], s["source_sandbox"]) for s in saves] == [("agent-task", "server_stop", kept["id"])]
        created = api.post("/v1/sandboxes", json={"from_save": saves[0]["id"]}).json()
        assert support.result_text(support.ok(support.execute(api, created["id"], "answer"))) == "{'rows': 3}"


@pytest.mark.slow
def test_a_save_past_its_cap_is_refused_with_a_note_and_loses_nothing(spawn_server):
    server = spawn_server("--set", "save_max_mb=4")
    with server.client(timeout=120) as api:
        sandbox = support.create(api)
        support.ok(support.execute(api, sandbox["id"], "big = bytes(8 * 2**20); small = {'kept': 42}"))
        refused = api.post(f"/v1/sandboxes/{sandbox['id']}/save", json={})
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "save_refused" and "nothing else was touched" in error["message"]
        assert "cap" in error["message"] and error["limit"] == 4 * 2**20
        # nothing else lost: the namespace, no save, no partial file in the workspace or the store
        events = support.ok(support.execute(api, sandbox["id"], "len(big), small"))
        assert support.result_text(events) == "(8388608, {'kept': 42})"
        assert api.get("/v1/saves").json()["saves"] == []
        assert stored_files(server) == [] and not list(saves_dir(server).glob("*/.partial-*"))
        files = [f["path"] for f in api.get(f"/v1/sandboxes/{sandbox['id']}/files").json()["files"]]
        assert not [f for f in files if f.startswith(".sandbox-state/") and f.endswith(".bin")], files
        # under the cap the same sandbox saves
        support.ok(support.execute(api, sandbox["id"], "del big"))
        assert api.post(f"/v1/sandboxes/{sandbox['id']}/save", json={}).status_code == 201


HOSTILE = """
import os
class Evil:
    def __reduce__(self):
        return (os.system, ({command!r},))
evil = Evil()
del Evil  # the instance alone: its pickle then needs nothing but os.system to load
"""


@pytest.mark.slow
def test_a_hostile_pickle_in_a_save_runs_only_inside_a_sandbox_never_on_the_host(spawn_server, tmp_path):
    marker = tmp_path / "host-marker"
    server = spawn_server()
    with server.client(timeout=120) as api:
        sandbox = support.create(api)
        support.ok(support.execute(api, sandbox["id"], HOSTILE.format(command=f"mkdir -p {tmp_path} && touch {marker}")))
        save = api.post(f"/v1/sandboxes/{sandbox['id']}/save", json={"label": "hostile"})
        assert save.status_code == 201, save.text
        save_id = save.json()["id"]
        # every host path that handles the save: list, get, restore into a new sandbox, a restart
        assert api.get(f"/v1/saves/{save_id}").status_code == 200
        created = api.post("/v1/sandboxes", json={"from_save": save_id})
        assert created.status_code == 201, created.text
        # it ran, inside the new sandbox (whose /tmp is its own), and not on the host
        ran_inside = support.execute(api, created.json()["id"], f"import os; os.path.exists({str(marker)!r})")
        assert support.result_text(support.ok(ran_inside)) == "True"
    server.terminate()
    server.start()
    with server.client(timeout=60) as api:
        assert api.get("/v1/saves").json()["saves"][0]["id"] == save_id
    assert not marker.exists()
    # control: the same bytes, unpickled on the host, do run (the probe fires)
    [stored] = stored_files(server)
    with stored.open("rb") as f:
        pickle.load(f)
    assert marker.exists()


def test_bad_save_ids_get_a_clear_error(api, new_sandbox):
    assert api.post("/v1/sandboxes", json={"from_save": "nope"}).status_code == 422
    missing = api.post("/v1/sandboxes", json={"from_save": "sv-0123456789abcdef"})
    assert missing.status_code == 404 and "no save" in missing.json()["error"]["message"]
    assert api.get("/v1/saves/sv-0123456789abcdef").status_code == 404
    assert api.delete("/v1/saves/../../token").status_code == 404
    sandbox = new_sandbox()
    bad = api.post(f"/v1/sandboxes/{sandbox['id']}/restore", json={"save_id": "sv-0123456789abcdef"})
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "save_not_found"


LINKING_SAVE = """
import os
import sandbox_runtime.saving as saving
def plant_link(shell, path, *bounds):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink({target!r}, path)
    os.symlink({target!r}, "/workspace/same-link")
    return {{}}
saving.save = plant_link
"""


@pytest.mark.slow
def test_a_save_the_sandbox_swapped_for_a_link_to_a_host_file_is_refused(spawn_server, tmp_path):
    """The host reads a save through the workspace's link-refusing opens: a save file the
    sandbox made a symlink to a host path is refused, and the host file's bytes land nowhere."""
    secret = tmp_path / "host-secret"
    secret.write_text("host-only-" + "7" * 32)
    secret.chmod(0o600)
    server = spawn_server()
    with server.client(timeout=120) as api:
        sandbox = support.create(api)
        support.ok(support.execute(api, sandbox["id"], LINKING_SAVE.format(target=str(secret))))
        refused = api.post(f"/v1/sandboxes/{sandbox['id']}/save", json={})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "invalid_path" and "symlink" in refused.json()["error"]["message"]
        assert api.get("/v1/saves").json()["saves"] == []
        stored = [p for p in saves_dir(server).rglob("*") if p.is_file()] if saves_dir(server).exists() else []
        assert not [p for p in stored if b"host-only-" in p.read_bytes()]
        # control: the same link, followed on the host, reads the host's file
        link = support.sandbox_dir(server, sandbox["id"]) / "workspace" / "same-link"
        assert link.is_symlink() and link.read_text().startswith("host-only-")


@pytest.mark.slow
def test_a_save_refused_before_the_ttl_ends_the_sandbox_is_said_and_the_sandbox_ends_as_before(spawn_server):
    server = spawn_server("--set", "save_max_mb=1")
    with server.client(timeout=120) as api:
        sandbox = support.create(api, ttl_seconds=6, metadata={"save_label": "too-big"})
        support.ok(support.execute(api, sandbox["id"], "blob = bytes(4 * 2**20)"))
        support.wait_for(lambda: api.get(f"/v1/sandboxes/{sandbox['id']}").status_code == 410, 60)
        listed = api.get("/v1/saves", params={"label": "too-big"}).json()
        assert listed["saves"] == []
        failure = listed["last_failure"]
        assert failure["source_sandbox"] == sandbox["id"] and failure["by"] == "ttl", failure
        assert "refused" in failure["message"] and "nothing else was touched" in failure["message"], failure
        # a later save under the label clears it
        again = support.create(api, metadata={"save_label": "too-big"})
        support.ok(support.execute(api, again["id"], "small = 1"))
        assert api.post(f"/v1/sandboxes/{again['id']}/save", json={"label": "too-big"}).status_code == 201
        assert api.get("/v1/saves", params={"label": "too-big"}).json()["last_failure"] is None


LOADED = "import sys; print(sorted(m for m in ('asyncio', 'ssl', 'cloudpickle') if m in sys.modules))"


def test_a_sandbox_loads_its_pickler_at_its_first_save_not_at_start(api, new_sandbox):
    """Every sandbox, warm ones too, would carry cloudpickle (and asyncio and ssl, through
    the runtime's channel code) from the start; most never save. A save still uses it."""
    sandbox = new_sandbox()
    assert support.stream_text(support.ok(support.execute(api, sandbox["id"], LOADED))).strip() == "[]"
    save = api.post(f"/v1/sandboxes/{sandbox['id']}/save", json={})
    assert save.status_code == 201, save.text
    assert save.json()["summary"]["pickler"].startswith("cloudpickle "), save.json()
    after = support.stream_text(support.ok(support.execute(api, sandbox["id"], LOADED))).strip()
    assert after == "['cloudpickle']"
