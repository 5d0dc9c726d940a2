"""`tessera explain` as a user runs it: target forms, namespace and kubeconfig resolution, text and JSON,
exit codes, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tessera.clusterread
from driver.kubeapi import RealKubeAPI, kubeconfig_path
from tessera.cli import main
from tessera.clusterread import ReadError, connect, resource_slices
from tessera.cmd_explain import parse_target
from tests.fakes.cluster import FakeCluster, exactly


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    c = FakeCluster()
    c.publish("node-a", "a100-pcie-4")
    c.shipped_classes()
    seen: list[str | None] = []

    def connect(kubeconfig: str | None = None) -> object:
        seen.append(kubeconfig)
        return c

    monkeypatch.setattr(tessera.clusterread, "connect", connect)
    c.kubeconfigs = seen  # type: ignore[attr-defined]
    return c


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["--log-format", "json", "--log-level", "error", "explain", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_pending_pod_is_explained_in_text_with_exit_status_1(cluster: FakeCluster,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(4):
        cluster.run_pod(f"h{i}", f"h{i}", ("node-a", f"gpu-{i}"))
    cluster.claim("want", exactly())
    cluster.pod("p", "want", message="0/1 nodes are available: 1 cannot allocate all claims.")
    rc, out, _ = run(capsys, "pod/p", "--kubeconfig", "/k")
    assert rc == 1
    assert out.startswith("pod default/p: Pending\n  scheduler: 0/1 nodes are available")
    assert "  request \"gpu\": 1 x gpu.tessera.dev" in out
    assert "Why: all 4 devices that fit are held by other claims" in out
    assert "Fix: delete pod default/h0 to free node-a/gpu-0" in out
    assert cluster.kubeconfigs == ["/k"]  # type: ignore[attr-defined]


def test_json_names_the_step_the_devices_and_the_claims(cluster: FakeCluster,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    cluster.run_pod("h", "h", ("node-a", "gpu-0"), memory="30Gi", namespace="team")
    bus = cluster._device("node-a", "gpu-0")["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
    only_gpu_0 = [f'device.attributes["resource.kubernetes.io"].pciBusID == "{bus}"']
    cluster.claim("want", exactly(memory="20Gi", device_class="shared.gpu.tessera.dev", selectors=only_gpu_0),
                  namespace="team")
    cluster.pod("p", "want", namespace="team")
    rc, out, _ = run(capsys, "p", "-n", "team", "-o", "json")
    assert rc == 1
    doc = json.loads(out)
    assert doc["kind"] == "pod" and doc["name"] == "team/p"
    verdict = doc["verdict"]
    assert (verdict["ok"], verdict["step"]) == (False, "capacity")
    assert verdict["devices"] == ["node-a/gpu-0"] and verdict["claims"] == ["team/h"] and verdict["pods"] == ["team/h"]
    steps = doc["claims"][0]["requests"][0]["steps"]
    assert [s["step"] for s in steps] == ["driver", "class", "selectors", "capacity", "allocation", "taints",
                                          "counters"]
    assert [s["count"] for s in steps[:4]] == [4, 4, 1, 0]
    assert steps[3]["dropped"][0]["heldBy"] == [{"claim": "team/h", "pods": ["team/h"]}]


def test_a_claim_that_could_be_allocated_exits_0(cluster: FakeCluster, capsys: pytest.CaptureFixture[str]) -> None:
    cluster.claim("want", exactly(count=2))
    rc, out, _ = run(capsys, "resourceclaim/want")
    assert rc == 0
    assert "tessera's part is fine: the claim could be allocated now (on node-a)" in out


def test_a_bare_name_that_is_only_a_claim_is_explained_as_the_claim(cluster: FakeCluster,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cluster.claim("want", exactly(count=5))
    rc, out, _ = run(capsys, "want")
    assert rc == 1
    assert out.startswith("resourceclaim default/want")
    assert "Why: request \"gpu\" of claim default/want needs 5 devices on one node" in out


def test_the_namespace_defaults_to_the_context_namespace(cluster: FakeCluster,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cluster.namespace = "ml"
    cluster.claim("want", exactly(), namespace="ml")
    rc, out, _ = run(capsys, "claim/want")
    assert rc == 0 and out.startswith("resourceclaim ml/want")


def test_unknown_pod_is_exit_status_2_with_the_namespace(cluster: FakeCluster,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "pod/ghost", "-n", "x")
    assert (rc, out) == (2, "")
    assert err == 'tessera explain: pod "ghost" not found in namespace "x"\n'


def test_other_kinds_are_refused_with_the_forms_that_work(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "deployment/web")
    assert rc == 2
    assert "pod/NAME or resourceclaim/NAME" in err
    assert parse_target("po/x") == ("pod", "x")
    assert parse_target("resourceclaims.resource.k8s.io/x") == ("resourceclaim", "x")


def test_a_cluster_that_cannot_be_read_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "config"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    rc, _, err = run(capsys, "pod/p", "--kubeconfig", str(bad))
    assert rc == 2
    assert err.startswith(f"tessera explain: cannot load the cluster configuration from {bad}")


def test_kubeconfig_is_found_like_kubectl_finds_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert kubeconfig_path(None) is None
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert kubeconfig_path(None) == str(tmp_path / ".kube" / "config")
    monkeypatch.setenv("KUBECONFIG", "/a:/b")
    assert kubeconfig_path(None) == "/a:/b"
    assert kubeconfig_path("/flag") == "/flag"


def test_an_unreachable_apiserver_names_the_read(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}]}))
    api = connect(str(config), timeout=2)
    assert isinstance(api, RealKubeAPI) and api.namespace == "ml" and api.source == str(config)
    with pytest.raises(ReadError, match="cannot read resourceslices"):
        resource_slices(api)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_a_search_budget_that_is_not_a_positive_number_is_refused(capsys: pytest.CaptureFixture[str],
                                                                  value: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(capsys, "pod/p", "--search-budget", value)
    assert exit_info.value.code == 2
    assert "--search-budget" in capsys.readouterr().err


def test_the_search_budget_reaches_the_search_and_shows_in_json(cluster: FakeCluster,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    cluster.claim("want", exactly(count=2))
    rc, out, _ = run(capsys, "resourceclaim/want", "--search-budget", "7.5", "-o", "json")
    assert rc == 0
    assert json.loads(out)["search"] == {"budgetSeconds": 7.5, "runs": 1, "reused": 0, "steps": 5,
                                         "cutShort": False, "note": None}
