"""Who may call the webhook (issue 24, item 5): the chart's NetworkPolicy admits only the apiserver's
addresses to the webhook port, client certificates are wired from one value to the controller's flag,
and probes use a port of their own. Rendered by a real helm binary."""

from __future__ import annotations

import pytest

from tessera.cli import build_parser
from tests.builders.helm import render
from tests.helm.test_helm import container, one, render_error, tools  # noqa: F401 (tools is a fixture)

POLICY = ["webhook.networkPolicy.enabled=true", "webhook.networkPolicy.apiserverCIDRs={10.0.0.0/24,10.0.1.5/32}"]
CLIENT_AUTH = ["webhook.clientAuth.enabled=true", "webhook.clientAuth.caBundle=-----BEGIN CERTIFICATE-----"]


def ports_of(rule: dict) -> set:
    return {p["port"] for p in rule["ports"]}


def test_no_network_policy_unless_asked(tools):  # noqa: F811
    assert not [d for d in render(tools) if d["kind"] == "NetworkPolicy"]


def test_network_policy_admits_only_the_apiserver_to_the_webhook_port(tools):  # noqa: F811
    docs = render(tools, *POLICY)
    policy = one(docs, "NetworkPolicy")
    deployment = one(docs, "Deployment")
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = {frozenset(ports_of(r)): r for r in policy["spec"]["ingress"]}
    webhook = rules[frozenset({"webhook"})]
    assert webhook["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "10.0.1.5/32"}}]
    assert "from" not in rules[frozenset({"probes"})]  # kubelet
    assert "from" not in rules[frozenset({"metrics"})]  # metricsFrom empty: anyone
    # every port the policy names is a port the controller container declares
    declared = {p["name"] for p in container(deployment)["ports"]}
    assert {p for r in policy["spec"]["ingress"] for p in ports_of(r)} == declared


def test_metrics_scrapers_can_be_limited(tools):  # noqa: F811
    sets = [*POLICY, "webhook.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring"]
    policy = one(render(tools, *sets), "NetworkPolicy")
    (metrics,) = [r for r in policy["spec"]["ingress"] if ports_of(r) == {"metrics"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]


def test_network_policy_without_apiserver_addresses_is_refused_with_the_fix(tools):  # noqa: F811
    message = render_error(tools, "webhook.networkPolicy.enabled=true")
    assert "webhook.networkPolicy.apiserverCIDRs" in message and "10.0.0.0/24" in message


def test_a_cidr_that_is_not_one_is_refused_by_the_schema(tools):  # noqa: F811
    message = render_error(tools, "webhook.networkPolicy.enabled=true",
                           "webhook.networkPolicy.apiserverCIDRs={apiserver}")
    assert "apiserverCIDRs" in message


def test_client_auth_mounts_the_ca_and_passes_the_flag(tools):  # noqa: F811
    docs = render(tools, *CLIENT_AUTH)
    deployment = one(docs, "Deployment")
    c = container(deployment)
    assert "--client-ca=/etc/tessera/client-ca/ca.crt" in c["args"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "client-ca")
    assert mount == {"name": "client-ca", "mountPath": "/etc/tessera/client-ca", "readOnly": True}
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-ca")
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert config_map["data"] == {"ca.crt": "-----BEGIN CERTIFICATE-----"}
    parsed = build_parser().parse_args(c["args"])
    assert parsed.client_ca == "/etc/tessera/client-ca/ca.crt" and parsed.probe_addr == ":8081"
    # probes stay reachable without a certificate
    assert c["readinessProbe"]["httpGet"]["port"] == "probes"


def test_client_auth_is_off_by_default(tools):  # noqa: F811
    c = container(one(render(tools), "Deployment"))
    assert not any(a.startswith("--client-ca") for a in c["args"])


def test_client_auth_without_a_ca_is_refused_with_the_fix(tools):  # noqa: F811
    message = render_error(tools, "webhook.clientAuth.enabled=true")
    assert "webhook.clientAuth.caBundle" in message and "--set-file" in message


@pytest.mark.parametrize("port", ["controller.probePort=9090"])
def test_probe_port_moves_flag_port_and_probes_together(tools, port):  # noqa: F811
    c = container(one(render(tools, port), "Deployment"))
    assert "--probe-addr=:9090" in c["args"]
    assert {"name": "probes", "containerPort": 9090, "protocol": "TCP"} in c["ports"]
