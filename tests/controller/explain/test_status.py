"""`tessera status` against the fake apiserver: who holds which GPU, what is free, MIG placements still
possible, and a card map that is valid SVG."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import tessera.clusterread
from controller.cluster.capacityfit import quantity
from controller.explain.explain import ClusterView
from controller.explain.status import GpuStatus, StatusReport, cluster_status
from controller.explain.svg import BAR_W, BAR_X, status_svg
from tessera.cli import main
from tests.fakes.cluster import FakeCluster

SVG = "{http://www.w3.org/2000/svg}"
GiB = 1 << 30


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.publish("node-a", "a100-pcie-4")
    c.publish("node-m", "e2e/profiles/one-h100-mig.yaml", "dynamic")
    c.publish("node-x", "mixed")
    c.run_pod("w", "w", ("node-a", "gpu-0"))
    c.run_pod("s1", "s1", ("node-a", "gpu-1"), memory="10Gi")
    c.run_pod("s2", "s2", ("node-a", "gpu-1"), memory="12Gi")
    c.run_pod("m", "m", ("node-m", "gpu-0-mig-1g10gb-6"))
    c.run_pod("m2", "m2", ("node-m", "gpu-0-mig-3g40gb-0"))
    return c


def report(c: FakeCluster) -> StatusReport:
    r = c.reader()
    return cluster_status(ClusterView(r.resource_slices(), {}, r.resource_claims()))


def gpu(rep: StatusReport, node: str, name: str) -> GpuStatus:
    return next(g for n in rep.nodes if n.name == node for g in n.gpus if g.name == name)


def test_whole_gpus_and_shares_are_listed_by_claim_and_pod_with_the_free_memory(cluster: FakeCluster) -> None:
    rep = report(cluster)
    whole = gpu(rep, "node-a", "gpu-0")
    assert [(s.kind, s.claim, s.pods, s.memory) for s in whole.segments] == [
        ("whole", "default/w", ("default/w",), 40 * GiB)]
    assert whole.free == 0
    shared = gpu(rep, "node-a", "gpu-1")
    assert sorted((s.kind, s.pods[0], s.memory) for s in shared.segments) == [
        ("share", "default/s1", 10 * GiB), ("share", "default/s2", 12 * GiB)]
    assert shared.free == 18 * GiB
    assert gpu(rep, "node-a", "gpu-2").segments == []


def test_mig_instances_have_their_placement_and_the_placements_left_are_listed(cluster: FakeCluster) -> None:
    card = gpu(report(cluster), "node-m", "gpu-0")
    assert card.mig == "dynamic" and card.memory_slices == 8
    assert [(s.profile, s.placement, s.slices, s.pods) for s in card.segments] == [
        ("3g.40gb", 0, (0, 4), ("default/m2",)), ("1g.10gb", 6, (6, 1), ("default/m",))]
    # slices 0-3 and 6 are taken, 4 of 7 compute slices: what fits is in slices 4-5
    assert card.mig_possible == {"1g.10gb": [4, 5], "1g.20gb": [4], "2g.20gb": [4]}


def test_a_whole_gpu_on_a_dynamic_mig_card_leaves_no_mig_placement(cluster: FakeCluster) -> None:
    c = FakeCluster()
    c.publish("node-m", "e2e/profiles/one-h100-mig.yaml", "dynamic")
    c.run_pod("share", "share", ("node-m", "gpu-0"), memory="8Gi")
    card = gpu(report(c), "node-m", "gpu-0")
    assert [s.kind for s in card.segments] == ["share"]
    assert card.mig_possible == {}


def test_a_static_mig_card_is_drawn_from_its_instances(cluster: FakeCluster) -> None:
    card = gpu(report(cluster), "node-x", "gpu-1")
    assert not card.published and card.mig == "static"
    instances = ("gpu-1-mig-1g10gb-6", "gpu-1-mig-2g20gb-4", "gpu-1-mig-3g40gb-0")
    assert card.memory == sum(int(quantity(cluster._device("node-x", d)["capacity"]["memory"]["value"]) or 0)
                              for d in instances)
    assert card.mig_possible == {"1g.10gb": [6], "2g.20gb": [4], "3g.40gb": [0]}


def test_the_table_shows_every_gpu_and_holder(cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tessera.clusterread, "connect", lambda kubeconfig=None: cluster)
    assert main(["--log-level", "error", "status"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "GPU", "PRODUCT", "MEMORY", "FREE", "ALLOCATED"]
    assert any(line.startswith("node-a") and "gpu-0" in line and "whole  claim default/w  pod default/w" in line
               for line in lines)
    assert any("share 12Gi  claim default/s2  pod default/s2" in line for line in lines)
    assert any("MIG 1g.10gb at slice 6 (gpu-0-mig-1g10gb-6)  claim default/m  pod default/m" in line for line in lines)
    assert "MIG placements free: 1g.10gb at 4,5; 1g.20gb at 4; 2g.20gb at 4" in out
    assert lines[-1].startswith("3 node(s), 9 GPU(s): 1 whole, 2 share(s), 2 MIG instance(s) allocated")


def test_json_lists_allocations_per_gpu(cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tessera.clusterread, "connect", lambda kubeconfig=None: cluster)
    assert main(["--log-level", "error", "status", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    node_a = next(n for n in doc["nodes"] if n["name"] == "node-a")
    gpu1 = next(g for g in node_a["gpus"] if g["name"] == "gpu-1")
    assert sorted(a["memory"] for a in gpu1["allocations"]) == ["10Gi", "12Gi"]
    assert gpu1["freeBytes"] == 18 * GiB
    node_m = next(n for n in doc["nodes"] if n["name"] == "node-m")
    mig = node_m["gpus"][0]["allocations"][0]
    assert (mig["kind"], mig["profile"], mig["placement"], mig["memorySlices"]) == ("mig", "3g.40gb", 0, [0, 4])


def test_the_svg_is_valid_and_draws_each_allocation_where_it_is(cluster: FakeCluster, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tessera.clusterread, "connect", lambda kubeconfig=None: cluster)
    target = tmp_path / "cards.svg"
    assert main(["--log-level", "error", "status", "--svg", str(target)]) == 0
    assert f"card map written to {target}" in capsys.readouterr().out
    root = ET.parse(target).getroot()  # well-formed XML, or this raises
    assert root.tag == f"{SVG}svg" and root.get("version") == "1.1"
    segments = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "seg"]
    assert len(segments) == 5  # whole, two shares, two MIG instances
    tips = {r.find(f"{SVG}title").text: r for r in segments}  # type: ignore[union-attr]
    mig = next(r for t, r in tips.items() if t and "MIG 3g.40gb at slice 0" in t)
    assert float(mig.get("x", 0)) == pytest.approx(BAR_X) and float(mig.get("width", 0)) == pytest.approx(BAR_W / 2)
    one = next(r for t, r in tips.items() if t and "MIG 1g.10gb at slice 6" in t)
    assert float(one.get("x", 0)) == pytest.approx(BAR_X + BAR_W * 6 / 8, abs=0.1)
    share = next(r for t, r in tips.items() if t and "12Gi share" in t)
    assert float(share.get("width", 0)) == pytest.approx(BAR_W * 12 / 40, abs=0.1)
    labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "lbl"]
    assert "s2 12Gi" in labels and "m2 3g.40gb" in labels


def test_svg_escapes_names(cluster: FakeCluster) -> None:
    rep = report(cluster)
    rep.nodes[0].gpus[0].segments[0] = rep.nodes[0].gpus[0].segments[0].__class__(
        "whole", "gpu-0", "ns/<claim>&", ("ns/a<b>",), "gpu", 40 * GiB)
    ET.fromstring(status_svg(rep).split("\n", 1)[1])


def test_an_unwritable_svg_path_is_a_clear_error(cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr(tessera.clusterread, "connect", lambda kubeconfig=None: cluster)
    rc = main(["--log-level", "error", "status", "--svg", str(tmp_path / "missing" / "x.svg")])
    assert rc == 2
    assert "tessera status: cannot write" in capsys.readouterr().err


def test_placements_are_written_as_ranges() -> None:
    from controller.explain.status import _ranges

    assert _ranges([0, 1, 2, 3, 4, 5, 6]) == "0-6"
    assert _ranges([0, 2, 4, 6]) == "0,2,4,6"
    assert _ranges([0, 1, 3, 4, 5]) == "0,1,3-5"


def test_pods_that_are_gone_or_not_running_are_marked(cluster: FakeCluster) -> None:
    from controller.explain.status import status_table

    r = cluster.reader()
    pods = [p for p in r.pods() or [] if p["metadata"]["name"] != "s2"]
    next(p for p in pods if p["metadata"]["name"] == "w")["status"]["phase"] = "Pending"
    table = status_table(cluster_status(ClusterView(r.resource_slices(), {}, r.resource_claims()), pods))
    assert "pod default/w (Pending)" in table
    assert "pod default/s2 (gone)" in table
    assert "pod default/s1 (" not in table  # running: nothing to say
