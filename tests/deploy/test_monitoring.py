"""deploy/kubernetes/monitoring: the Prometheus scrape configuration checked by Prometheus'
own promtool, its targets consistent with the manifests, its two manifests valid against the
Kubernetes schemas, and the Grafana dashboard's every query valid PromQL (promtool) naming
only metrics that the node server's and the gateway's /metrics expose."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

import support

MONITORING = support.REPO / "deploy" / "kubernetes" / "monitoring"
KUBERNETES = support.REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")


def _manifest(path) -> dict:
    return yaml.safe_load(path.read_text())


def _scrape_config() -> dict:
    return yaml.safe_load((MONITORING / "prometheus-scrape.yml").read_text())


def _promtool_check_config(config: dict, tmp_path) -> subprocess.CompletedProcess:
    """promtool also checks that each credentials file exists: the cluster's path is
    pointed at a stand-in token file, nothing else is changed."""
    token = tmp_path / "token"
    token.write_text("stand-in\n")
    for job in config["scrape_configs"]:
        job["authorization"]["credentials_file"] = str(token)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([PROMTOOL, "check", "config", str(path)], capture_output=True, text=True)


@needs_promtool
def test_scrape_config_passes_promtool(tmp_path):
    checked = _promtool_check_config(_scrape_config(), tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_a_broken_scrape_config_is_caught(tmp_path):
    config = _scrape_config()
    config["scrape_configs"][0]["scrape_intervall"] = "30s"
    checked = _promtool_check_config(config, tmp_path)
    assert checked.returncode != 0


def _container_port(manifest: str) -> int:
    spec = _manifest(KUBERNETES / manifest)["spec"]["template"]["spec"]["containers"][0]
    return next(p["containerPort"] for p in spec["ports"] if p["name"] == "api")


def test_scrape_targets_match_the_manifests():
    jobs = {job["job_name"]: job for job in _scrape_config()["scrape_configs"]}
    node_service = _manifest(KUBERNETES / "20-node-service.yaml")
    gateway_service = _manifest(MONITORING / "gateways-headless-service.yaml")
    for job, service, port in (("sandbox-kernel-nodes", node_service, _container_port("10-node-daemonset.yaml")),
                               ("sandbox-kernel-gateways", gateway_service, _container_port("30-gateway-deployment.yaml"))):
        meta = service["metadata"]
        sd = jobs[job]["dns_sd_configs"][0]
        assert sd["names"] == [f"{meta['name']}.{meta['namespace']}.svc.cluster.local"], job
        assert sd["port"] == port and service["spec"]["clusterIP"] == "None", job
        assert jobs[job]["metrics_path"] == "/metrics"
    gateway_pods = _manifest(KUBERNETES / "30-gateway-deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    assert gateway_service["spec"]["selector"].items() <= gateway_pods.items()
    policy = _manifest(MONITORING / "metrics-network-policy.yaml")
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": _container_port("10-node-daemonset.yaml"), "protocol": "TCP"}]


def test_monitoring_manifests_are_valid_against_the_schemas():
    import kubernetes_validate

    for name in ("gateways-headless-service.yaml", "metrics-network-policy.yaml"):
        kubernetes_validate.validate(_manifest(MONITORING / name), KUBERNETES_VERSION, strict=True)


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["panels"]
    queries = []
    for panel in dashboard["panels"]:
        assert panel["datasource"]["type"] == "prometheus" and panel["targets"], panel["title"]
        queries += [target["expr"] for target in panel["targets"]]
    return queries


def _exposed_names(tmp_path) -> set[str]:
    """Every sample name the node server and the gateway expose, from their real registries."""
    from prometheus_client.parser import text_string_to_metric_families

    from sandbox.core.config import ServiceConfig
    from sandbox.gateway.config import GatewayConfig
    from sandbox.gateway.discovery import StaticNodes
    from sandbox.gateway.metrics import GatewayMetrics
    from sandbox.gateway.nodes import NodeTable
    from sandbox.core.manager import SandboxManager
    from sandbox.usage.metrics import ServerMetrics

    server = ServerMetrics(SandboxManager(ServiceConfig(state_dir=str(tmp_path))))
    server.creates.labels(tier="bwrap", from_pool="true")  # a labelled counter shows once it has a child
    server.executes.labels(status="ok")
    server.lifecycle_seconds.labels(operation="pause")
    config = GatewayConfig(nodes=["127.0.0.1:1"])
    gateway = GatewayMetrics(NodeTable(config, StaticNodes(config.nodes)))
    names = set()
    for text in (server.exposition(), gateway.exposition()):
        for family in text_string_to_metric_families(text.decode()):
            names |= {sample.name for sample in family.samples} | {family.name}
    return names


PROMQL_WORDS = {"sum", "by", "rate", "max", "histogram_quantile", "le", "state", "tier", "from_pool", "status",
                "node", "operation", "image", "job", "pod"}


def test_dashboard_queries_name_only_exposed_metrics(tmp_path):
    exposed = _exposed_names(tmp_path)
    for query in _dashboard_queries():
        names = set(re.findall(r"\bsandbox_kernel_\w+", query))
        assert names, query
        assert names <= exposed, f"{query}: {sorted(names - exposed)} not exposed"
    assert "sandbox_kernel_no_such_metric" not in exposed  # the check above can fail


@needs_promtool
def test_dashboard_queries_are_valid_promql(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": query} for i, query in enumerate(_dashboard_queries())]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules["groups"][0]["rules"].append({"record": "dashboard:broken", "expr": "sum by (le (rate(x[5m]))"})
    path.write_text(yaml.safe_dump(rules))
    assert subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True).returncode != 0
