"""`tessera check`: the admission checks offline over YAML/JSON files, with or without slices."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from driver.discovery import load_inventory
from driver.slices import build_slices
from tessera.cmd_check import check_files
from tests.paths import REPO

D = 'device.attributes["gpu.tessera.dev"]'
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.tessera.dev"},
    "spec": {"selectors": [{"cel": {"expression": f'device.driver == "gpu.tessera.dev" && {D}.type == "gpu"'}}]},
}


@pytest.fixture(scope="module")
def slices_file(tmp_path_factory) -> Path:
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="static")
    slices += build_slices(load_inventory("node-m", simulate="mixed"), mig_strategy="dynamic")
    path = tmp_path_factory.mktemp("inv") / "slices.yaml"
    path.write_text(yaml.safe_dump_all(slices))
    return path


def run(files: list[Path | str], *, slices: Path | None = None, kubeconfig: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = check_files([str(f) for f in files], slices=str(slices) if slices else None, kubeconfig=kubeconfig,
                     out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def write(tmp_path: Path, name: str, *docs: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs))
    return path


def claim(name: str, spec: dict, kind: str = "ResourceClaim") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": name, "namespace": "default"},
            "spec": spec if kind == "ResourceClaim" else {"spec": spec}}


def test_shipped_device_classes_and_examples_have_no_errors(slices_file):
    files = sorted((REPO / "deviceclasses").glob("*.yaml")) + sorted((REPO / "deviceclasses").glob("examples/*.yaml"))
    if not files:
        pytest.skip("deviceclasses/ is empty in this checkout")
    rc, out, _ = run(files, slices=slices_file)
    assert rc == 0, out
    assert " 0 error(s)" in out
    assert "DeviceClass gpu.tessera.dev\n  class: matches 12 of" in out


def test_errors_are_printed_with_object_and_field_path_and_fail_the_run(tmp_path, slices_file):
    bad = claim("share", {"devices": {"requests": [{"name": "s", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"gpu.tessera.dev/memory": "4Gi"}}}}]}})
    path = write(tmp_path, "claim.yaml", GPU_CLASS, bad)
    rc, out, _ = run([path], slices=slices_file)
    assert rc == 1
    assert f"{path} (document 2): ResourceClaim default/share\n" in out
    assert "  error: spec.devices.requests[0].exactly.capacity.requests[gpu.tessera.dev/memory]: " in out
    assert "2 object(s) checked: 1 error(s), 0 warning(s)" in out


def test_class_with_unguarded_read_fails(tmp_path):
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "u.gpu.tessera.dev"},
           "spec": {"selectors": [{"cel": {"expression": f'{D}.uuid == "x"'}}]}}
    rc, out, _ = run([write(tmp_path, "c.yaml", cls)])
    assert rc == 1
    assert 'error: spec.selectors[0].cel.expression: reads "uuid"' in out


def test_multicard_claims_are_rewritten_then_matched(tmp_path, slices_file):
    spec = {"devices": {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 2}}],
        "config": [{"requests": ["gpus"], "opaque": {"driver": "gpu.tessera.dev", "parameters": {
            "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
            "sharing": {"totalMemory": "16Gi", "sameNVLinkIsland": True}}}}],
    }}
    rc, out, _ = run([write(tmp_path, "t.yaml", GPU_CLASS, claim("pair", spec, "ResourceClaimTemplate"))],
                     slices=slices_file)
    assert rc == 0, out
    assert ('  rewritten: request "gpus" (16Gi across 2 cards) asks for 8Gi on each of 2 distinct GPUs, all on one '
            "NVLink island") in out
    assert "  request gpus: matches 12 of" in out


def test_multicard_total_that_does_not_divide_fails(tmp_path):
    spec = {"devices": {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "count": 3}}],
        "config": [{"opaque": {"driver": "gpu.tessera.dev", "parameters": {
            "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"totalMemory": "10Gi"}}}}],
    }}
    rc, out, _ = run([write(tmp_path, "c.yaml", claim("odd", spec))])
    assert rc == 1
    assert "nearest valid totals: 9Gi or 12Gi" in out


def test_classes_in_the_files_are_used_for_claims_in_the_files(tmp_path, slices_file):
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "a100.example.org"},
           "spec": {"selectors": [{"cel": {"expression":
                    f'device.driver == "gpu.tessera.dev" && {D}.productName == "NVIDIA L4"'}}]}}
    use = claim("c", {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "a100.example.org"}}]}})
    rc, out, _ = run([write(tmp_path, "both.yaml", cls, use)], slices=slices_file)
    assert rc == 0
    assert "  class: matches 2 of" in out  # the mixed profile has two L4 cards
    assert "  request g: matches 2 of" in out


def test_claim_whose_class_is_not_given_is_not_matched(tmp_path, slices_file):
    use = claim("c", {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}})
    rc, out, _ = run([write(tmp_path, "c.yaml", use)], slices=slices_file)
    assert rc == 0
    assert ('  warning: spec.devices.requests[0].exactly.deviceClassName: DeviceClass "gpu.tessera.dev" is not among '
            "the checked objects; give its file too (or --kubeconfig) to count the devices this request matches") in out
    assert "request g: matches" not in out


def test_warnings_alone_do_not_fail(tmp_path, slices_file):
    use = claim("c", {"devices": {"requests": [{"name": "g", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "selectors": [{"cel": {"expression": f'{D}.productName == "B200"'}}]}}]}})
    rc, out, _ = run([write(tmp_path, "c.yaml", GPU_CLASS, use)], slices=slices_file)
    assert rc == 0
    assert "  warning: spec.devices.requests[0].exactly: request \"g\" matches none of the" in out


def test_list_and_json_inputs(tmp_path, slices_file):
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.tessera.dev"},
           "spec": {"selectors": [{"cel": {"expression": f'{D}.type == "gpu"'}}]}}
    path = tmp_path / "list.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [cls]}))
    rc, out, _ = run([path], slices=slices_file)
    assert rc == 0
    assert f"{path} item 0: DeviceClass gpu.tessera.dev" in out


def test_without_inventory_says_how_to_get_match_counts(tmp_path):
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.tessera.dev"},
           "spec": {"selectors": [{"cel": {"expression": f'{D}.type == "gpu"'}}]}}
    rc, out, _ = run([write(tmp_path, "c.yaml", cls)])
    assert rc == 0
    assert "matches" not in out
    assert "no inventory given: use --slices FILE or --kubeconfig K" in out


def test_other_objects_are_skipped_and_other_drivers_not_checked(tmp_path):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    nic = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nic.example.com"},
           "spec": {"selectors": [{"cel": {"expression": 'device.attributes["nic.example.com"].x == 1'}}]}}
    rc, out, _ = run([write(tmp_path, "o.yaml", pod, nic)])
    assert rc == 0
    assert "Pod p: skipped (Pod is not checked)" in out
    assert "DeviceClass nic.example.com\n  not a tessera object" in out


def test_old_api_versions_are_an_error(tmp_path):
    old = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "DeviceClass", "metadata": {"name": "gpu.tessera.dev"}}
    rc, out, _ = run([write(tmp_path, "o.yaml", old)])
    assert rc == 1
    assert "error: apiVersion: tessera checks resource.k8s.io/v1 objects; got 'resource.k8s.io/v1beta1'" in out


def test_unreadable_or_invalid_input_exits_2(tmp_path):
    rc, _, err = run([tmp_path / "missing.yaml"])
    assert rc == 2 and "missing.yaml: cannot read" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [unclosed")
    rc, _, err = run([bad])
    assert rc == 2 and "not valid YAML/JSON" in err


def test_unreachable_cluster_exits_2(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "n", "cluster": {"server": "https://127.0.0.1:1", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "n", "user": "u"}}],
    }))
    rc, _, err = run([write(tmp_path, "c.yaml", {"kind": "Pod", "metadata": {"name": "p"}})],
                     kubeconfig=str(kubeconfig))
    assert rc == 2
    assert "cannot read resourceslices" in err


def test_console_script_exit_status(tmp_path, slices_file):
    bad = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.tessera.dev"},
           "spec": {"selectors": [{"cel": {"expression": f"{D}.type =="}}]}}
    good = write(tmp_path, "good.yaml", GPU_CLASS)
    ok = subprocess.run([sys.executable, "-m", "tessera", "check", str(good), "--slices", str(slices_file)],
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "class: matches 12 of" in ok.stdout
    failed = subprocess.run([sys.executable, "-m", "tessera", "check", str(write(tmp_path, "bad.yaml", bad))],
                            capture_output=True, text=True, timeout=120, check=False)
    assert failed.returncode == 1
    assert "syntax error" in failed.stdout


def test_kubeconfig_reads_slices_and_classes_from_the_cluster(tmp_path, monkeypatch):
    from tests.fakes.cluster import FakeCluster

    cluster = FakeCluster()
    for i, s in enumerate(build_slices(load_inventory("node-k", simulate="t4-4"), mig_strategy="none")):
        s["metadata"]["name"] = f"node-k-{i}"
        cluster.create_resource_slice(s)
    cluster.add_device_class(GPU_CLASS)
    monkeypatch.setattr("tessera.clusterread.connect", lambda kubeconfig: cluster)
    claims = write(
        tmp_path, "c.yaml",
        claim("a", {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}}),
        claim("b", {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "typo.gpu.tessera.dev"}}]}}),
    )
    rc, out, _ = run([claims], kubeconfig="ignored")
    assert rc == 0
    assert "  request g: matches 4 of 4 devices on 1 node (node-k: 4)" in out
    assert 'DeviceClass "typo.gpu.tessera.dev" does not exist; did you mean "gpu.tessera.dev"? pods using' in out


def test_documents_that_are_not_objects_are_errors(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- just\n- a list\n")
    rc, out, _ = run([path])
    assert rc == 1
    assert "error: : this document is not a Kubernetes object (a mapping)" in out


def test_claim_without_a_spec_object_is_an_error(tmp_path):
    bad = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": []}
    rc, out, _ = run([write(tmp_path, "c.yaml", bad)])
    assert rc == 1
    assert "error: spec: must be an object (a ResourceClaimSpec)" in out
