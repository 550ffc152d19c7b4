"""User tokens at the gateway, with the real gateway and a real node on loopback: one user's
sandbox is an unknown id to another (every route, at the effect: her variable and her file
unchanged afterwards), the shared token sees everyone's with their owners, forged tokens get
401, and the token Zero to JupyterHub's hook (deploy/kubernetes/jupyterhub/values.yaml) puts
into a single-user pod is one the gateway accepts as that user.

Kubernetes is the boundary that cannot be reached here: the hook runs in the real KubeSpawner
(jupyterhub-kubespawner from PyPI) in its own test mode (``_mock=True``: no cluster, a
stand-in user and hub; a kubeconfig naming an API server that is not there, which the spawner
loads but never calls), and the pod it would create is read from its real pod manifest."""

from __future__ import annotations

import asyncio
import secrets
import typing as t

import httpx
import pytest
import yaml

import support
from conftest import GatewayProcess
from sandbox.gateway import users

pytestmark = pytest.mark.timeout(300)

VALUES = support.REPO / "deploy" / "kubernetes" / "jupyterhub" / "values.yaml"


@pytest.fixture(scope="module")
def user_secret() -> str:
    return secrets.token_hex(32)


@pytest.fixture(scope="module")
def user_gateway(node: support.Server, user_secret: str) -> t.Iterator[GatewayProcess]:
    gw = GatewayProcess(node.token, node.state_dir / "gateway-users.log", "--node", node.url,
                        "--refresh-seconds", "0.5", env={"SANDBOX_KERNEL_USER_SECRET": user_secret}).start()
    yield gw
    gw.stop()


def as_token(gateway: GatewayProcess, token: str) -> httpx.Client:
    return httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {token}"},
                        timeout=httpx.Timeout(60, connect=5))


@pytest.fixture
def create_as(user_gateway: GatewayProcess) -> t.Iterator[t.Callable[[httpx.Client], str]]:
    """create_as(client): the id of a sandbox made with that client's token; every one is
    deleted afterwards with the shared token (whoever the test left it to)."""
    made: list[str] = []

    def create(client: httpx.Client) -> str:
        made.append(support.create(client, ttl_seconds=300)["id"])
        return made[-1]

    yield create
    with user_gateway.client() as admin:
        for sandbox_id in made:
            admin.delete(f"/v1/sandboxes/{sandbox_id}")


def run(client: httpx.Client, sandbox_id: str, code: str) -> httpx.Response:
    """An execute, read to its end (a refusal is a plain JSON answer)."""
    return client.post(f"/v1/sandboxes/{sandbox_id}/execute", json={"code": code})


def printed(client: httpx.Client, sandbox_id: str, code: str) -> str:
    return support.stream_text(support.execute(client, sandbox_id, code))


def probes(client: httpx.Client, sandbox_id: str) -> dict[str, httpx.Response]:
    """Every way to reach a sandbox, each of which could change or reveal it."""
    return {
        "get": client.get(f"/v1/sandboxes/{sandbox_id}"),
        "execute": run(client, sandbox_id, "secret_value = 'overwritten'"),
        "files list": client.get(f"/v1/sandboxes/{sandbox_id}/files"),
        "file read": client.get(f"/v1/sandboxes/{sandbox_id}/files/notes.txt"),
        "file write": client.put(f"/v1/sandboxes/{sandbox_id}/files/notes.txt", content=b"overwritten"),
        "delete": client.delete(f"/v1/sandboxes/{sandbox_id}"),
    }


def listed(client: httpx.Client) -> dict[str, dict]:
    r = client.get("/v1/sandboxes")
    assert r.status_code == 200, r.text
    return {s["id"]: s for s in r.json()["sandboxes"]}


def as_unknown(answer: httpx.Response, sandbox_id: str, unknown: httpx.Response, unknown_id: str) -> bool:
    """Whether ``answer`` about ``sandbox_id`` is exactly what an id that never existed gets."""
    return (answer.status_code == unknown.status_code == 404
            and answer.json() == {**unknown.json(), "error": {**unknown.json()["error"],
                                  "message": unknown.json()["error"]["message"].replace(unknown_id, sandbox_id)}})


@pytest.mark.slow
def test_a_users_sandbox_is_an_unknown_id_to_another_user(user_gateway, user_secret, create_as):
    """Bob's token reaches nothing of Alice's sandbox, each refusal the same as for an id that
    never existed (no hint it exists), and Alice's variable and file are as she left them.
    Control: the same probes with the shared token do reach it (get, execute, files, delete),
    so the probes can fire; the shared token lists both users' sandboxes with their owners."""
    alice = as_token(user_gateway, users.mint(user_secret, "alice"))
    bob = as_token(user_gateway, users.mint(user_secret, "bob"))
    admin = user_gateway.client()
    try:
        hers, his = create_as(alice), create_as(bob)
        assert printed(alice, hers, "secret_value = 41\nprint(secret_value)") == "41\n"
        assert alice.put(f"/v1/sandboxes/{hers}/files/notes.txt", content=b"alice's notes").status_code == 201

        unknown_id = hers[:-4] + ("0000" if not hers.endswith("0000") else "1111")
        unknown = bob.get(f"/v1/sandboxes/{unknown_id}")
        for route, answer in probes(bob, hers).items():
            assert as_unknown(answer, hers, unknown, unknown_id), (route, answer.status_code, answer.text)
        assert hers not in listed(bob) and his in listed(bob)
        assert his not in listed(alice) and hers in listed(alice)

        # At the effect: nothing of hers changed.
        assert printed(alice, hers, "print(secret_value)") == "41\n"
        assert alice.get(f"/v1/sandboxes/{hers}/files/notes.txt").content == b"alice's notes"

        everyone = listed(admin)
        assert everyone[hers]["owner"]["name"] == "alice" and everyone[his]["owner"]["name"] == "bob", everyone

        # Control: the shared token's probes reach her sandbox (the last one deletes it).
        reached = probes(admin, hers)
        assert {route: r.status_code for route, r in reached.items()} == {
            "get": 200, "execute": 200, "files list": 200, "file read": 200, "file write": 201, "delete": 200}
        assert alice.get(f"/v1/sandboxes/{hers}").status_code == 410  # hers, deleted: she is told so
    finally:
        for client in (alice, bob, admin):
            client.close()


def test_forged_and_other_secrets_tokens_get_401_and_users_stay_off_the_admins_routes(user_gateway, user_secret):
    """Right name with a wrong secret, a name swapped under another user's signature, a
    malformed one: 401 with a JSON body, on the relay's routes and the app's alike. A user
    token on the administrator's routes: 403. Control: the real token is accepted."""
    name_b64 = users.mint(user_secret, "alice").split(".")[1]
    bobs_signature = users.mint(user_secret, "bob").rsplit(".", 1)[1]
    forged = {
        "other secret": users.mint(secrets.token_hex(32), "alice"),
        "swapped name": f"{users.PREFIX}{name_b64}.{bobs_signature}",
        "no signature": f"{users.PREFIX}{name_b64}.",
        "not base64": f"{users.PREFIX}%%%.{bobs_signature}",
    }
    for why, token in forged.items():
        with as_token(user_gateway, token) as client:
            for method, path in (("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"),
                                 ("GET", "/v1/sandboxes/sbx-loop1-0123456789ab"), ("GET", "/v1/info")):
                r = client.request(method, path, json={} if method == "POST" else None)
                assert r.status_code == 401, (why, path, r.status_code, r.text)
                assert r.json()["error"]["code"] == "unauthorized", (why, path, r.text)
    with as_token(user_gateway, users.mint(user_secret, "alice")) as alice:
        for path in ("/v1/nodes", "/v1/usage", "/metrics"):
            r = alice.get(path)
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (path, r.text)
        assert alice.get("/v1/sandboxes").status_code == 200  # control: the real token is taken
    with user_gateway.client() as admin:
        assert admin.get("/v1/nodes").status_code == 200  # control: the shared token's routes


def test_an_agents_scope_under_a_user_token_stays_within_that_user(user_gateway, user_secret, create_as):
    """A user's agent declares its own scope (and '*'): it reaches its own sandboxes and its
    user's, never another user's, whose sandbox answers 404 even to '*'. Control: the user's
    unscoped kernel reaches the agent's sandbox."""
    alice_token, bob_token = users.mint(user_secret, "alice"), users.mint(user_secret, "bob")
    agent = as_token(user_gateway, alice_token)
    agent.headers["Sandbox-Scope"] = "helper, *"
    alice, bob = as_token(user_gateway, alice_token), as_token(user_gateway, bob_token)
    try:
        agents, bobs = create_as(agent), create_as(bob)
        assert agent.get(f"/v1/sandboxes/{bobs}").status_code == 404
        assert bobs not in listed(agent)
        assert bob.get(f"/v1/sandboxes/{agents}").status_code == 404
        assert alice.get(f"/v1/sandboxes/{agents}").status_code == 200 and agents in listed(alice)
        assert listed(agent)[agents]["owner"]["name"] == "alice"
    finally:
        for client in (agent, alice, bob):
            client.close()


class StandInUser:
    """Stand-in for JupyterHub's User (no hub database here): what KubeSpawner reads of it."""

    def __init__(self, name: str):
        self.name, self.id, self.url, self.escaped_name = name, 7, f"/user/{name}/", name


def no_cluster(path, monkeypatch) -> None:
    """A kubeconfig whose API server is a free loopback port nothing listens on: KubeSpawner
    loads a client configuration when it is made, and building a pod manifest calls no API."""
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "none",
              "clusters": [{"name": "none", "cluster": {"server": f"https://127.0.0.1:{support.free_port()}"}}],
              "users": [{"name": "none", "user": {"token": "none"}}],
              "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}]}
    path.write_text(yaml.safe_dump(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(path))


def pod_environment(values: dict, user_name: str, monkeypatch) -> dict[str, str]:
    """The environment of the pod KubeSpawner would create for ``user_name`` with these values:
    hub.extraConfig run as the chart's jupyterhub_config.py runs it (``exec`` with ``c``), the
    hub's extraEnv secret in the hub's environment, singleuser.extraEnv as the chart passes it
    (KubeSpawner.environment), then the spawner's pre-spawn hook and its real pod manifest."""
    from kubespawner import KubeSpawner
    from traitlets.config import Config

    c = Config()
    c.KubeSpawner.environment = dict(values["singleuser"]["extraEnv"])
    for source in values["hub"]["extraConfig"].values():
        exec(source, {"c": c})

    async def spawn() -> t.Any:  # on an event loop, as in the hub (the spawner makes its API client there)
        spawner = KubeSpawner(config=c, user=StandInUser(user_name), _mock=True)
        spawner.run_pre_spawn_hook()
        return await spawner.get_pod_manifest()

    pod = asyncio.run(spawn())
    return {e.name: e.value for e in pod.spec.containers[0].env}


@pytest.mark.slow
def test_the_hubs_hook_gives_each_pod_its_users_own_token(user_gateway, user_secret, monkeypatch, tmp_path):
    """values.yaml's hook, run by the real KubeSpawner: the pod of carol carries a token the
    real gateway takes as carol (her sandbox listed with her as owner, invisible to dave's
    pod), dave's pod another, and the pod points at the gateway with host cells off. Control:
    with another secret in the hub, the gateway refuses the pod's token."""
    no_cluster(tmp_path / "kubeconfig", monkeypatch)
    values = yaml.safe_load(VALUES.read_text())
    secret_source = values["hub"]["extraEnv"]["SANDBOX_KERNEL_USER_SECRET"]["valueFrom"]["secretKeyRef"]
    assert secret_source == {"name": "sandbox-kernel-user-secret", "key": "secret"}
    monkeypatch.setenv("SANDBOX_KERNEL_USER_SECRET", user_secret)  # the hub pod's, from that Secret
    carol, dave = pod_environment(values, "carol", monkeypatch), pod_environment(values, "dave", monkeypatch)
    assert carol["SANDBOX_KERNEL_URL"] == "http://sandbox-gateway.sandbox-kernel.svc.cluster.local"
    assert carol["SANDBOX_KERNEL_HOST_CELLS"] == "0"
    assert carol["SANDBOX_KERNEL_TOKEN"] != dave["SANDBOX_KERNEL_TOKEN"]
    made = None
    with as_token(user_gateway, carol["SANDBOX_KERNEL_TOKEN"]) as carols, \
            as_token(user_gateway, dave["SANDBOX_KERNEL_TOKEN"]) as daves, user_gateway.client() as admin:
        try:
            made = support.create(carols, ttl_seconds=300)["id"]
            assert listed(admin)[made]["owner"]["name"] == "carol"
            assert daves.get(f"/v1/sandboxes/{made}").status_code == 404 and made not in listed(daves)
        finally:
            if made:
                admin.delete(f"/v1/sandboxes/{made}")
    monkeypatch.setenv("SANDBOX_KERNEL_USER_SECRET", secrets.token_hex(32))
    elsewhere = pod_environment(values, "carol", monkeypatch)
    with as_token(user_gateway, elsewhere["SANDBOX_KERNEL_TOKEN"]) as refused:
        assert refused.get("/v1/sandboxes").status_code == 401
