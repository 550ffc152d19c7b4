"""deploy/kubernetes: every manifest valid against the Kubernetes schemas (offline, with
kubernetes-validate's bundled schemas; no API server is reachable here), and the manifests
consistent with each other and with the gateway's and node server's command lines."""

from __future__ import annotations

import pathlib

import pytest
import yaml

import support

DEPLOY = support.REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"


def documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


def by_kind(kind: str) -> list[dict]:
    return [d for _, d in documents() if d["kind"] == kind]


def one(kind: str, name: str) -> dict:
    found = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def test_every_manifest_is_valid_against_the_schemas():
    import kubernetes_validate

    docs = documents()
    kinds = {d["kind"] for _, d in docs}
    assert {"Namespace", "DaemonSet", "Service", "Deployment", "NetworkPolicy", "PodDisruptionBudget"} <= kinds
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


def test_an_invalid_manifest_is_caught():
    """The validation above can fail: a misspelt field is refused in strict mode."""
    import kubernetes_validate

    bad = one("DaemonSet", "sandbox-node")
    bad = yaml.safe_load(yaml.safe_dump(bad))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def _labels(doc: dict) -> dict:
    return doc["spec"]["template"]["metadata"]["labels"]


def _args(doc: dict) -> dict[str, str]:
    container = doc["spec"]["template"]["spec"]["containers"][0]
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"])


def test_the_manifests_agree_with_each_other():
    namespace = one("Namespace", "sandbox-kernel")["metadata"]["name"]
    assert {d["metadata"]["namespace"] for d in by_kind("DaemonSet") + by_kind("Deployment") + by_kind("Service")} == {namespace}
    nodes, gateway = one("DaemonSet", "sandbox-node"), one("Deployment", "sandbox-gateway")
    headless = one("Service", "sandbox-nodes")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= _labels(nodes).items()
    assert not headless["spec"]["selector"].items() <= _labels(gateway).items()
    node_args, gw_args = _args(nodes), _args(gateway)
    # The gateway resolves the headless Service, and dials the port the nodes listen on.
    assert gw_args["dns-name"] == f"{headless['metadata']['name']}.{namespace}.svc.cluster.local"
    assert gw_args["dns-port"] == node_args["port"] == str(headless["spec"]["ports"][0]["port"])
    # Every node names itself after its Kubernetes node: stable across pod restarts.
    env = {e["name"]: e for e in nodes["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert node_args["node-id"] == "$(NODE_NAME)"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The state directory is the node's, and the init step builds images into it.
    volume = nodes["spec"]["template"]["spec"]["volumes"][0]
    assert volume["hostPath"]["path"] == node_args["state-dir"]
    init = nodes["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"][:3] == ["sandbox-kernel", "image", "build"] and node_args["state-dir"] in init["command"]
    # Nodes take calls from gateway pods only, on their API port.
    policy = one("NetworkPolicy", "sandbox-nodes-from-gateway-only")
    assert policy["spec"]["podSelector"]["matchLabels"] == nodes["spec"]["selector"]["matchLabels"]
    [rule] = policy["spec"]["ingress"]
    assert [p["podSelector"]["matchLabels"] for p in rule["from"]] == [gateway["spec"]["selector"]["matchLabels"]]
    assert [p["port"] for p in rule["ports"]] == [int(node_args["port"])]
    # Budgets cover both roles.
    selectors = [b["spec"]["selector"]["matchLabels"] for b in by_kind("PodDisruptionBudget")]
    assert gateway["spec"]["selector"]["matchLabels"] in selectors and nodes["spec"]["selector"]["matchLabels"] in selectors


def test_the_commands_in_the_manifests_exist():
    """The manifests' command lines parse with the real CLI (a renamed flag fails here)."""
    from sandbox.cli import build_parser

    parser = build_parser()
    for kind, name in (("DaemonSet", "sandbox-node"), ("Deployment", "sandbox-gateway")):
        container = one(kind, name)["spec"]["template"]["spec"]["containers"][0]
        args = [a.replace("$(NODE_NAME)", "node-a") for a in container["command"][1:] + container["args"]]
        parser.parse_args(args)
    init = one("DaemonSet", "sandbox-node")["spec"]["template"]["spec"]["initContainers"][0]
    parser.parse_args(init["command"][1:])


def test_the_nodes_name_the_image_registry():
    """Each node's image_registry is the registry Service's DNS name and port, which only node
    pods may reach: what a gateway relies on when it has a node pull an image first."""
    from sandbox.core.config import ServiceConfig

    nodes, service = one("DaemonSet", "sandbox-node"), one("Service", "sandbox-registry")
    registry = one("Deployment", "sandbox-registry")
    container = nodes["spec"]["template"]["spec"]["containers"][0]
    sets = dict(a.removeprefix("--set=").split("=", 1) for a in container["args"] if a.startswith("--set="))
    namespace = service["metadata"]["namespace"]
    port = service["spec"]["ports"][0]["port"]
    assert sets["image_registry"] == f"http://{service['metadata']['name']}.{namespace}.svc.cluster.local:{port}"
    assert ServiceConfig(image_registry=sets["image_registry"]).image_registry == sets["image_registry"]
    assert service["spec"]["selector"].items() <= _labels(registry).items()
    listens = registry["spec"]["template"]["spec"]["containers"][0]
    assert listens["ports"][0]["containerPort"] == port
    assert {e["name"]: e["value"] for e in listens["env"]}["REGISTRY_HTTP_ADDR"].endswith(f":{port}")
    policy = one("NetworkPolicy", "sandbox-registry-from-nodes-only")
    assert policy["spec"]["podSelector"]["matchLabels"] == registry["spec"]["selector"]["matchLabels"]
    [rule] = policy["spec"]["ingress"]
    assert [p["podSelector"]["matchLabels"] for p in rule["from"]] == [nodes["spec"]["selector"]["matchLabels"]]
    assert [p["port"] for p in rule["ports"]] == [port]
