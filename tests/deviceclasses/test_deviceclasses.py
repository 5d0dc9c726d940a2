"""The DeviceClasses tessera ships (deviceclasses/) and the example claims beside them.

A class selector that raises on one device aborts scheduling for every pod using the class, so each
selector is evaluated with tessera's CEL environment against every device of every built-in
simulated profile, under every MIG strategy, plus another driver's devices; then each class must
match exactly the devices it promises. The chart must ship the same classes.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from driver.attributes import DEVICE_ATTRIBUTES
from driver.config import ConfigError, decode_gpu_config
from tests.paths import REPO

ROOT = REPO
CLASS_DIR = ROOT / "deviceclasses"
EXAMPLE_DIR = CLASS_DIR / "examples"
DRIVER = "gpu.tessera.dev"
CLASS_FILES = sorted(CLASS_DIR.glob("*.yaml"))
EXAMPLE_FILES = sorted(EXAMPLE_DIR.glob("*.yaml"))
MIG_STRATEGIES = ("none", "static", "dynamic")


def _load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


CLASSES: dict[str, dict[str, Any]] = {}
for _path in CLASS_FILES:
    for _doc in _load(_path):
        CLASSES[_doc["metadata"]["name"]] = _doc

# One class per MIG profile lives in a single file; every other file holds one class named like it.
MIG_PROFILE_FILE = CLASS_DIR / "mig-profiles.yaml"
MIG_PROFILES = [
    doc["metadata"]["name"].removeprefix("mig-").removesuffix(f".{DRIVER}") for doc in _load(MIG_PROFILE_FILE)
]


def _attr(device: dict[str, Any], name: str) -> Any:
    value = device["attributes"].get(name)
    return None if value is None else next(iter(value.values()))


# What each class promises, as a plain predicate over a published device of this driver.
EXPECTED_MATCH = {
    "gpu.tessera.dev": lambda d: _attr(d, "type") == "gpu",
    "mig.gpu.tessera.dev": lambda d: _attr(d, "type") == "mig",
    "shared.gpu.tessera.dev": lambda d: _attr(d, "type") == "gpu",
    "timeslicing.gpu.tessera.dev": lambda d: _attr(d, "type") == "gpu",
    "nvlink.gpu.tessera.dev": lambda d: _attr(d, "type") == "gpu" and _attr(d, "nvlinkPeers") > 0,
    "h100.gpu.tessera.dev": lambda d: _attr(d, "type") == "gpu" and "H100" in _attr(d, "productName"),
}
for _profile in MIG_PROFILES:
    EXPECTED_MATCH[f"mig-{_profile}.{DRIVER}"] = (
        lambda d, p=_profile: _attr(d, "type") == "mig" and _attr(d, "profile") == p  # type: ignore[misc]
    )

# The extended resource each class answers (Kubernetes 1.36 DRAExtendedResource); None: only claims.
EXPECTED_EXTENDED_RESOURCE: dict[str, str | None] = {name: None for name in EXPECTED_MATCH}
EXPECTED_EXTENDED_RESOURCE["gpu.tessera.dev"] = "gpu.tessera.dev/gpu"
for _profile in MIG_PROFILES:
    EXPECTED_EXTENDED_RESOURCE[f"mig-{_profile}.{DRIVER}"] = f"gpu.tessera.dev/mig-{_profile}"

# Devices of another driver on the same node: a class must say false to them without erroring,
# even though they lack every tessera attribute.
FOREIGN_DEVICES: list[dict[str, Any]] = [
    {"name": "nic-0", "attributes": {"type": {"string": "gpu"}}, "capacity": {}},
    {"name": "fpga-0", "attributes": {"vendor": {"string": "example"}}, "capacity": {"memory": {"value": "8Gi"}}},
]


# --- structure (needs no CEL engine) ----------------------------------------------------------------


def test_classes_are_the_documented_set():
    assert set(CLASSES) == set(EXPECTED_MATCH)


@pytest.mark.parametrize("path", [p for p in CLASS_FILES if p != MIG_PROFILE_FILE], ids=lambda p: p.name)
def test_class_file_is_one_v1_deviceclass_named_like_the_file(path):
    docs = _load(path)
    assert len(docs) == 1
    (dc,) = docs
    assert dc["apiVersion"] == "resource.k8s.io/v1" and dc["kind"] == "DeviceClass"
    assert f"{dc['metadata']['name']}.yaml" == path.name
    assert set(dc["spec"]) <= {"selectors", "config", "extendedResourceName"}


def test_mig_profile_classes_cover_every_profile_of_every_mig_table_once():
    from driver.mig import A100_40GB, H100_80GB

    tables = {p.name for layout in (A100_40GB, H100_80GB) for p in layout.profiles}
    assert len(MIG_PROFILES) == len(set(MIG_PROFILES))
    assert set(MIG_PROFILES) == tables
    for doc in _load(MIG_PROFILE_FILE):
        assert doc["apiVersion"] == "resource.k8s.io/v1" and doc["kind"] == "DeviceClass"
        assert set(doc["spec"]) == {"selectors", "extendedResourceName"}


# Kubernetes' IsExtendedResourceName: has a domain outside kubernetes.io, and "requests.<name>" is a
# qualified name (DNS-subdomain prefix, then a name part of at most 63 characters).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _is_extended_resource_name(name: str) -> bool:
    if "/" not in name or "kubernetes.io/" in name:
        return False
    prefix, _, part = f"requests.{name}".partition("/")
    return (
        len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix) is not None
        and len(part) <= 63 and _NAME_PART.fullmatch(part) is not None
    )


def test_extended_resource_name_check_has_teeth():
    assert _is_extended_resource_name("gpu.tessera.dev/mig-1g.10gb")
    assert _is_extended_resource_name("nvidia.com/gpu")
    bad_names = ("gpu", "kubernetes.io/gpu", "gpu.tessera.dev/-gpu", "gpu.tessera.dev/" + "x" * 64, "A.dev/gpu")
    for bad in bad_names:
        assert not _is_extended_resource_name(bad), bad


@pytest.mark.parametrize("name", sorted(EXPECTED_MATCH))
def test_class_answers_its_documented_extended_resource(name):
    got = CLASSES[name]["spec"].get("extendedResourceName")
    assert got == EXPECTED_EXTENDED_RESOURCE[name]
    assert got is None or _is_extended_resource_name(got), got


def test_no_two_shipped_classes_claim_the_same_extended_resource():
    # The scheduler would silently use only the newer one (extendedresourcecache).
    names = [dc["spec"]["extendedResourceName"] for dc in CLASSES.values() if "extendedResourceName" in dc["spec"]]
    assert len(names) == len(set(names)) == 1 + len(MIG_PROFILES)


@pytest.mark.parametrize("name", sorted(EXPECTED_MATCH))
def test_selectors_test_the_driver_first_and_stay_within_api_limits(name):
    selectors = CLASSES[name]["spec"]["selectors"]
    assert 1 <= len(selectors) <= 32
    for selector in selectors:
        assert set(selector) == {"cel"}
        expression = selector["cel"]["expression"]
        assert len(expression.encode()) <= 10 * 1024
        # The driver test short-circuits every other driver's devices before any attribute read.
        assert expression.startswith(f'device.driver == "{DRIVER}" &&'), expression


TYPE_SPECIFIC = {
    name: kind
    for kind, attributes in DEVICE_ATTRIBUTES.items()
    for name in attributes
    if not all(name in other for other in DEVICE_ATTRIBUTES.values())
}
_READ = re.compile(r'device\.attributes\["' + re.escape(DRIVER) + r'"\]\.(\w+)')


@pytest.mark.parametrize("name", sorted(EXPECTED_MATCH))
def test_type_specific_attributes_are_read_only_after_testing_type(name):
    for selector in CLASSES[name]["spec"]["selectors"]:
        expression = selector["cel"]["expression"]
        for match in _READ.finditer(expression):
            attribute = match.group(1)
            assert attribute in DEVICE_ATTRIBUTES["gpu"] or attribute in DEVICE_ATTRIBUTES["mig"], attribute
            if attribute in TYPE_SPECIFIC:
                guard = f'device.attributes["{DRIVER}"].type == "{TYPE_SPECIFIC[attribute]}" &&'
                assert guard in expression[: match.start()], f"{attribute} read before {guard!r}"


@pytest.mark.parametrize("name", sorted(EXPECTED_MATCH))
def test_class_config_is_a_valid_gpu_config(name):
    for i, entry in enumerate(CLASSES[name]["spec"].get("config", [])):
        opaque = entry["opaque"]
        assert opaque["driver"] == DRIVER
        assert len(json.dumps(opaque["parameters"]).encode()) <= 10 * 1024
        decode_gpu_config(opaque["parameters"], f"spec.config[{i}].opaque.parameters")


def test_sharing_classes_carry_their_strategy():
    def strategy(name: str) -> str:
        (entry,) = CLASSES[name]["spec"]["config"]
        return str(entry["opaque"]["parameters"]["sharing"]["strategy"])

    assert strategy("shared.gpu.tessera.dev") == "MPS"
    assert strategy("timeslicing.gpu.tessera.dev") == "TimeSlicing"
    for name in ("gpu.tessera.dev", "mig.gpu.tessera.dev", "nvlink.gpu.tessera.dev", "h100.gpu.tessera.dev",
                 *(f"mig-{p}.{DRIVER}" for p in MIG_PROFILES)):
        assert "config" not in CLASSES[name]["spec"], name


def test_a_broken_config_is_what_decode_rejects():
    # Guards the test above against passing vacuously: the decoder does reject bad sharing settings.
    bad = {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Mps"}}
    with pytest.raises(ConfigError, match=r"spec\.config\[0\]\.opaque\.parameters\.sharing\.strategy"):
        decode_gpu_config(bad, "spec.config[0].opaque.parameters")


# --- evaluation with tessera's CEL environment ---------------------------------------------------------


def _published_devices() -> Iterator[tuple[str, dict[str, Any]]]:
    from driver.discovery import load_inventory
    from driver.simulated import builtin_profiles
    from driver.slices import build_slices

    for profile in builtin_profiles():
        inventory = load_inventory(f"node-{profile}", simulate=profile)
        for strategy in MIG_STRATEGIES:
            for resource_slice in build_slices(inventory, mig_strategy=strategy):
                for device in resource_slice["spec"].get("devices", []):
                    yield f"{profile}/{strategy}/{device['name']}", device


@pytest.fixture(scope="module")
def cel() -> Any:
    return pytest.importorskip("driver.cel", reason="tessera's CEL environment (driver/cel) is not there yet")


@pytest.fixture(scope="module")
def devices(cel) -> list[tuple[str, Any, dict[str, Any]]]:
    """(label, CEL view, device dict) for every published device, deduplicated by content."""
    seen: dict[str, tuple[str, Any, dict[str, Any]]] = {}
    for label, device in _published_devices():
        key = json.dumps({k: v for k, v in device.items() if k != "name"}, sort_keys=True)
        seen.setdefault(key, (label, cel.device_view(DRIVER, device), device))
    return list(seen.values())


@pytest.fixture(scope="module")
def foreign(cel) -> list[tuple[str, Any]]:
    return [(d["name"], cel.device_view("other.example.com", d)) for d in FOREIGN_DEVICES]


def _matches(cel: Any, name: str, view: Any) -> bool:
    return all(cel.compile_selector(s["cel"]["expression"]).evaluate(view) for s in CLASSES[name]["spec"]["selectors"])


def test_the_profiles_cover_every_device_shape_the_classes_distinguish(devices):
    types = {_attr(d, "type") for _, _, d in devices}
    assert types == {"gpu", "mig"}
    assert any(_attr(d, "type") == "gpu" and _attr(d, "nvlinkPeers") == 0 for _, _, d in devices)
    assert any("H100" not in _attr(d, "productName") for _, _, d in devices)


@pytest.mark.parametrize("name", sorted(EXPECTED_MATCH))
def test_selector_never_errors_and_matches_exactly_the_promised_devices(cel, devices, foreign, name):
    wrong = []
    for label, view, device in devices:
        try:
            got = _matches(cel, name, view)
        except cel.CelRuntimeError as exc:
            pytest.fail(f"{name} raises on {label}: {exc}")
        if got != EXPECTED_MATCH[name](device):
            wrong.append(f"{label}: matched={got}")
    assert not wrong, wrong
    assert any(EXPECTED_MATCH[name](d) for _, _, d in devices), f"{name} matches no simulated device at all"
    for label, view in foreign:
        assert _matches(cel, name, view) is False, label


def test_unguarded_selector_would_have_failed_this_test(cel, devices):
    # The same read without the type test raises on MIG devices: the check above has teeth.
    selector = cel.compile_selector(f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].nvlinkPeers > 0')
    mig = next(view for _, view, d in devices if _attr(d, "type") == "mig")
    with pytest.raises(cel.CelRuntimeError):
        selector.evaluate(mig)


# --- the chart ships the same classes ------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart_classes() -> dict[str, dict[str, Any]]:
    from hack.k8stools import RegistryUnreachable, UnsupportedPlatform, ensure_tools
    from tests.builders.helm import objects, render

    try:
        paths = ensure_tools()
    except (RegistryUnreachable, UnsupportedPlatform) as exc:
        pytest.skip(f"helm unavailable: {exc}")
    return {d["metadata"]["name"]: d for d in objects(render(paths), "DeviceClass")}


def test_chart_deviceclasses_equal_the_plain_manifests(chart_classes):
    assert set(chart_classes) == set(CLASSES)
    for name, dc in chart_classes.items():
        assert dc["apiVersion"] == CLASSES[name]["apiVersion"]
        assert dc["spec"] == CLASSES[name]["spec"], name


def test_chart_can_map_nvidia_gpu_to_the_whole_gpu_class_and_only_that_class(chart_classes):
    from hack.k8stools import ensure_tools
    from tests.builders.helm import objects, render

    del chart_classes  # only for its skip when helm is unavailable
    docs = render(ensure_tools(), "extendedResources.nvidiaGpu=true")
    mapped = {d["metadata"]["name"]: d for d in objects(docs, "DeviceClass")}
    assert mapped["gpu.tessera.dev"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    for name, dc in mapped.items():
        if name != "gpu.tessera.dev":
            assert dc["spec"] == CLASSES[name]["spec"], name


# --- example claims -------------------------------------------------------------------------------------


def _requests(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["spec"] if obj["kind"] == "ResourceClaimTemplate" else obj["spec"]
    out = []
    for request in spec["devices"]["requests"]:
        out += [request["exactly"]] if "exactly" in request else list(request["firstAvailable"])
    return out


def _claim_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["spec"] if obj["kind"] == "ResourceClaimTemplate" else obj["spec"]
    return spec


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_claims_use_shipped_classes_and_valid_configs(path):
    docs = _load(path)
    claims = [d for d in docs if d["kind"] in {"ResourceClaim", "ResourceClaimTemplate"}]
    assert claims, f"{path.name} holds no claim"
    for claim in claims:
        assert claim["apiVersion"] == "resource.k8s.io/v1"
        for request in _requests(claim):
            assert request["deviceClassName"] in CLASSES
            for key in request.get("capacity", {}).get("requests", {}):
                assert key in {"memory", "multiprocessors"}, f"capacity key {key!r} is not published"
        for i, entry in enumerate(_claim_spec(claim)["devices"].get("config", [])):
            decode_gpu_config(entry["opaque"]["parameters"], f"spec.devices.config[{i}].opaque.parameters")


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_pods_reference_claims_defined_beside_them(path):
    docs = _load(path)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert pods, f"{path.name} shows no pod using its claim"
    for pod in pods:
        declared = {c["name"] for c in pod["spec"]["resourceClaims"]}
        for c in pod["spec"]["resourceClaims"]:
            if "resourceClaimTemplateName" in c:
                assert ("ResourceClaimTemplate", c["resourceClaimTemplateName"]) in names
            else:
                assert ("ResourceClaim", c["resourceClaimName"]) in names
        for ctr in pod["spec"]["containers"]:
            assert {c["name"] for c in ctr["resources"]["claims"]} <= declared


@pytest.fixture(scope="module")
def nodes(cel) -> dict[str, list[tuple[Any, dict[str, Any]]]]:
    """Every published device per simulated node and MIG strategy, not deduplicated."""
    out: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for label, device in _published_devices():
        node = label.rsplit("/", 1)[0]
        out.setdefault(node, []).append((cel.device_view(DRIVER, device), device))
    return out


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.name)
def test_example_claims_are_satisfiable_on_some_simulated_node(cel, nodes, path):
    for claim in (d for d in _load(path) if d["kind"] in {"ResourceClaim", "ResourceClaimTemplate"}):
        spec = _claim_spec(claim)
        for request in spec["devices"]["requests"]:
            exact = request["exactly"]
            selectors = [cel.compile_selector(s["cel"]["expression"]) for s in exact.get("selectors", [])]
            constraints = spec["devices"].get("constraints", [])
            constraint = next((c["matchAttribute"] for c in constraints if request["name"] in c["requests"]), None)
            fits = []
            for node, node_devices in nodes.items():
                matching = [
                    d for view, d in node_devices
                    if _matches(cel, exact["deviceClassName"], view) and all(s.evaluate(view) for s in selectors)
                ]
                groups: dict[Any, int] = {}
                for d in matching:
                    key = _attr(d, constraint.split("/", 1)[1]) if constraint else None
                    groups[key] = groups.get(key, 0) + 1
                if any(n >= exact.get("count", 1) for n in groups.values()):
                    fits.append(node)
            assert fits, f"{path.name}: request {request['name']} fits on no simulated node"


def test_examples_pass_the_admission_checks_offline(cel):
    del cel
    check = pytest.importorskip("tessera.cmd_check")
    if not hasattr(check, "check_files"):
        pytest.skip("tessera check is not written yet")
    out, err = io.StringIO(), io.StringIO()
    files = [str(p) for p in CLASS_FILES + EXAMPLE_FILES]
    rc = check.check_files(files, slices=None, kubeconfig=None, out=out, err=err)
    assert rc == 0, out.getvalue() + err.getvalue()
    assert "0 error(s), 0 warning(s)" in out.getvalue(), out.getvalue()


TOGGLES = {
    "gpu": "gpu.tessera.dev", "mig": "mig.gpu.tessera.dev", "shared": "shared.gpu.tessera.dev",
    "timeslicing": "timeslicing.gpu.tessera.dev", "nvlink": "nvlink.gpu.tessera.dev", "h100": "h100.gpu.tessera.dev",
}


def test_chart_ships_the_mig_profile_classes_it_is_given(chart_classes):
    from hack.k8stools import ensure_tools
    from tests.builders.helm import objects, render

    del chart_classes  # only for its skip when helm is unavailable
    docs = render(ensure_tools(), "deviceClasses.migProfiles=null")
    none = {d["metadata"]["name"] for d in objects(docs, "DeviceClass")}
    assert none == set(TOGGLES.values())
    one = objects(render(ensure_tools(), "deviceClasses.migProfiles={2g.20gb}"), "DeviceClass")
    assert {d["metadata"]["name"] for d in one} - set(TOGGLES.values()) == {"mig-2g.20gb.gpu.tessera.dev"}


@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_each_chart_toggle_leaves_out_exactly_its_class(chart_classes, toggle):
    from hack.k8stools import ensure_tools
    from tests.builders.helm import objects, render

    del chart_classes  # only for its skip when helm is unavailable
    docs = render(ensure_tools(), f"deviceClasses.{toggle}=false")
    names = {d["metadata"]["name"] for d in objects(docs, "DeviceClass")}
    assert names == set(CLASSES) - {TOGGLES[toggle]}
