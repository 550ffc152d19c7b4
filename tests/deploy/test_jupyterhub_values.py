"""deploy/kubernetes/jupyterhub/values.yaml, offline: valid against the Zero to JupyterHub
chart's own values schema (kept beside this test: no chart repository is reachable here), its
Kubernetes objects valid against the Kubernetes schemas, and in agreement with the manifests
(the gateway's DNS name, port, labels and user Secret). Whether its hook's token is one the
real gateway takes as that user: tests/gateway/test_gateway_users.py."""

from __future__ import annotations

import copy
import json
import pathlib
import urllib.parse

import yaml

import support
from test_kubernetes_manifests import KUBERNETES_VERSION, one

HERE = pathlib.Path(__file__).parent
VALUES = support.REPO / "deploy" / "kubernetes" / "jupyterhub" / "values.yaml"
DOCKERFILE = support.REPO / "deploy" / "kubernetes" / "jupyterhub" / "Dockerfile"


def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def overlay_schema() -> dict:
    """The chart's schema for values given over its defaults: every field optional (helm
    checks the merged values, in which the chart's defaults fill the required ones)."""
    schema = json.loads((HERE / "z2jh_values.schema.json").read_text())

    def optional(node):
        if isinstance(node, dict):
            node.pop("required", None)
            for value in node.values():
                optional(value)
        elif isinstance(node, list):
            for value in node:
                optional(value)

    optional(schema)
    return schema


def schema_errors(doc: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(overlay_schema())
    return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_the_values_are_valid_for_the_chart():
    assert schema_errors(values()) == []


def test_a_misspelt_value_is_caught():
    """Control: the check above can fail (the chart refuses unknown keys)."""
    bad = copy.deepcopy(values())
    bad["singleuser"]["extraEnvv"] = bad["singleuser"].pop("extraEnv")
    assert any("extraEnvv" in e for e in schema_errors(bad))


def hub_env() -> list[dict]:
    """hub.extraEnv as the chart renders its dict form: a container's env entries."""
    return [{"name": k, **v} if isinstance(v, dict) else {"name": k, "value": v}
            for k, v in values()["hub"]["extraEnv"].items()]


def test_the_kubernetes_objects_in_the_values_are_valid():
    """The hub's env entries and the single-user egress rule, as the chart puts them into a
    Deployment and a NetworkPolicy, against the Kubernetes schemas."""
    import kubernetes_validate

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hub"},
           "spec": {"containers": [{"name": "hub", "image": "hub", "env": hub_env()}]}}
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "singleuser"},
              "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                       "egress": values()["singleuser"]["networkPolicy"]["egress"]}}
    for doc in (pod, policy):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_values_agree_with_the_manifests(monkeypatch):
    """Single-user pods are sent to the gateway's Service and let through to its pods' port;
    the hub reads the user Secret the gateway reads; %%host is off in the pods."""
    from kernel.host import host_cells_enabled

    v = values()
    service, gateway = one("Service", "sandbox-gateway"), one("Deployment", "sandbox-gateway")
    namespace = service["metadata"]["namespace"]
    env = v["singleuser"]["extraEnv"]
    url = urllib.parse.urlsplit(env["SANDBOX_KERNEL_URL"])
    assert url.hostname == f"{service['metadata']['name']}.{namespace}.svc.cluster.local"
    assert (url.port or 80) == service["spec"]["ports"][0]["port"]
    [rule] = v["singleuser"]["networkPolicy"]["egress"]
    [to] = rule["to"]
    assert to["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": namespace}
    assert to["podSelector"]["matchLabels"] == gateway["spec"]["selector"]["matchLabels"]
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert [p["port"] for p in rule["ports"]] == [container["ports"][0]["containerPort"]]
    gateway_env = {e["name"]: e for e in container["env"]}
    secret = gateway_env["SANDBOX_KERNEL_USER_SECRET"]["valueFrom"]["secretKeyRef"]
    hub_secret = {e["name"]: e for e in hub_env()}["SANDBOX_KERNEL_USER_SECRET"]["valueFrom"]["secretKeyRef"]
    assert (hub_secret["name"], hub_secret["key"]) == (secret["name"], secret["key"])
    monkeypatch.setenv("SANDBOX_KERNEL_HOST_CELLS", env["SANDBOX_KERNEL_HOST_CELLS"])
    assert not host_cells_enabled()
    assert v["cull"]["enabled"] and v["cull"]["timeout"] > 0
    # Never one token for all: no token in the values, only the hook that makes each user's.
    assert "SANDBOX_KERNEL_TOKEN" not in env and "SANDBOX_KERNEL_TOKEN" not in v["hub"]["extraEnv"]


def test_the_single_user_images_install_command_exists():
    """The Dockerfile's `sandbox-kernel install ...` parses with the real CLI."""
    from sandbox.cli import build_parser

    line = next(line for line in DOCKERFILE.read_text().splitlines() if "sandbox-kernel install" in line)
    args = line.split("sandbox-kernel", 1)[1].split()
    assert "--no-host-cells" in args
    build_parser().parse_args(args)

