"""ResourceClaim / ResourceClaimTemplate rules: capacity keys and amounts, opaque config, request
selectors (with their class's selectors in front), matching, and multi-card leftovers."""

from __future__ import annotations

import pytest

from controller.checks.claims import check_claim_spec
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.fakes.cluster import device_class

D = 'device.attributes["gpu.tessera.dev"]'
CLASSES = {
    "gpu.tessera.dev": device_class("gpu.tessera.dev", f'device.driver == "gpu.tessera.dev" && {D}.type == "gpu"'),
    "mig.gpu.tessera.dev": device_class(
        "mig.gpu.tessera.dev", f'device.driver == "gpu.tessera.dev" && {D}.type == "mig"'
    ),
    "any.gpu.tessera.dev": device_class("any.gpu.tessera.dev", 'device.driver == "gpu.tessera.dev"'),
    "nic.example.com": device_class("nic.example.com", 'device.driver == "nic.example.com"'),
}


@pytest.fixture(scope="module")
def inventory() -> DeviceIndex:
    slices = build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="static")
    slices += build_slices(load_inventory("node-b", simulate="a100-pcie-4"), mig_strategy="static")
    return DeviceIndex.from_slices(slices)


def ctx(inventory: DeviceIndex | None = None, *, complete: bool = True) -> CheckContext:
    return CheckContext(schema=published_schema(), samples=sample_index(), inventory=inventory,
                        classes=CLASSES, classes_complete=complete)


def claim(*requests: dict, config: list | None = None, constraints: list | None = None) -> dict:
    devices: dict = {"requests": list(requests)}
    if config is not None:
        devices["config"] = config
    if constraints is not None:
        devices["constraints"] = constraints
    return {"devices": devices}


def exactly(name: str = "gpu", cls: str = "gpu.tessera.dev", **fields) -> dict:
    return {"name": name, "exactly": {"deviceClassName": cls, **fields}}


def gpu_config(params: dict, requests: list[str] | None = None) -> dict:
    entry: dict = {"opaque": {"driver": "gpu.tessera.dev", "parameters": {
        "apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", **params}}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def findings(spec: dict, context: CheckContext | None = None, path: str = "spec"):
    return check_claim_spec(spec, path, context or ctx()).findings


def only(spec: dict, context: CheckContext | None = None, path: str = "spec"):
    result = findings(spec, context, path)
    assert len(result) == 1, result
    return result[0]


def memory(amount) -> dict:
    return {"capacity": {"requests": {"memory": amount}}}


# -- capacity ---------------------------------------------------------------------------------


def test_qualified_capacity_key_is_rejected_with_the_exact_fix():
    f = only(claim(exactly(capacity={"requests": {"gpu.tessera.dev/memory": "4Gi"}})))
    assert f.severity == "error"
    assert f.path == "spec.devices.requests[0].exactly.capacity.requests[gpu.tessera.dev/memory]"
    assert f.message == (
        '"gpu.tessera.dev/memory" never matches: tessera publishes this capacity under the bare key "memory" and '
        "the scheduler compares capacity keys literally, so every device would be skipped and the pod would stay "
        "Pending; write `memory: 4Gi`"
    )


def test_multiprocessors_cannot_be_requested():
    f = only(claim(exactly(capacity={"requests": {"multiprocessors": "10"}})))
    assert '"multiprocessors" cannot be requested' in f.message
    assert "sharing.mps.activeThreadPercentage" in f.message


def test_misspelled_capacity_key_gets_a_suggestion():
    f = only(claim(exactly(capacity={"requests": {"memroy": "4Gi"}})))
    assert f.message == 'tessera publishes no capacity "memroy"; did you mean "memory"? the requestable key is "memory"'


def test_other_domain_capacity_key_is_rejected():
    f = only(claim(exactly(capacity={"requests": {"example.com/memory": "4Gi"}})))
    assert f.message == 'tessera publishes no capacity "example.com/memory"; the requestable key is "memory"'


def test_amount_that_is_not_whole_mib_is_rejected_with_neighbours():
    f = only(claim(exactly(**memory("1.5Mi"))))
    assert f.path == "spec.devices.requests[0].exactly.capacity.requests[memory]"
    assert f.message == "1.5Mi is not a whole number of MiB; tessera sets the GPU memory limit in MiB, use 1Mi or 2Mi"


def test_amount_below_one_mib_offers_one_mib():
    f = only(claim(exactly(**memory("1000"))))
    assert f.message.endswith("use 1Mi")


def test_fractional_byte_amount_is_rejected():
    f = only(claim(exactly(**memory("0.5"))))
    assert "not a whole number of MiB" in f.message


def test_zero_amount_is_rejected():
    assert only(claim(exactly(**memory("0")))).message == "must be larger than zero, got 0"


def test_invalid_quantity_is_rejected():
    f = only(claim(exactly(**memory("four gig"))))
    assert f.message.startswith("'four gig' is not a Kubernetes quantity")


def test_amount_larger_than_the_largest_gpu_is_rejected(inventory):
    f = only(claim(exactly(**memory("100Gi"))), ctx(inventory))
    assert f.severity == "error"
    assert f.message == (
        "100Gi is more than the largest GPU in the cluster has (81559Mi on node-a/gpu-0 (gpu, NVIDIA H100 80GB HBM3)), "
        "so no device can ever satisfy it"
    )


def test_amount_that_fits_matches_devices(inventory):
    report = check_claim_spec(claim(exactly(**memory("41Gi"))), "spec", ctx(inventory))
    assert report.findings == ()
    [request] = report.requests
    assert request.match.per_node == {"node-a": 8}  # the A100 40GB cards hold exactly 40Gi


def test_amounts_in_decimal_units_that_are_whole_mib_are_accepted():
    assert findings(claim(exactly(**memory("1048576")))) == ()


# -- config -----------------------------------------------------------------------------------


def test_config_errors_carry_the_field_path():
    spec = claim(exactly(), config=[gpu_config({"sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 0}}})])
    f = only(spec)
    assert f.path == "spec.devices.config[0].opaque.parameters.sharing.mps.activeThreadPercentage"


def test_config_wrong_type_is_rejected():
    f = only(claim(exactly(), config=[gpu_config({"sharing": {"sameNVLinkIsland": "yes"}})]))
    assert f.path == "spec.devices.config[0].opaque.parameters.sharing.sameNVLinkIsland"
    assert f.message == 'must be true or false, got "yes"'


def test_config_wrong_api_version_is_rejected():
    spec = claim(exactly(), config=[{"opaque": {"driver": "gpu.tessera.dev",
                                               "parameters": {"apiVersion": "v1", "kind": "GpuConfig"}}}])
    assert only(spec).path == "spec.devices.config[0].opaque.parameters.apiVersion"


def test_config_naming_a_missing_request_is_rejected():
    f = only(claim(exactly(), config=[gpu_config({}, ["gpu", "gpus"])]))
    assert f.path == "spec.devices.config[0].requests[1]"
    assert f.message == '"gpus" names no request of this claim; the requests are: gpu'


def test_config_may_name_a_subrequest():
    spec = claim({"name": "acc", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.tessera.dev"}]},
                 config=[gpu_config({}, ["acc/a"])])
    assert findings(spec) == ()


def test_pending_multicard_config_is_an_error():
    spec = claim(exactly(count=2), config=[gpu_config({"sharing": {"totalMemory": "8Gi"}}, ["gpu"])])
    f = only(spec)
    assert f.path == "spec.devices.requests[0]"
    assert "mutating webhook" in f.message


def test_multicard_split_error_is_reported_by_validation_too():
    spec = claim(exactly(count=3), config=[gpu_config({"sharing": {"totalMemory": "10Gi"}}, ["gpu"])])
    f = only(spec)
    assert f.path == "spec.devices.config[0].opaque.parameters.sharing.totalMemory"
    assert "nearest valid totals: 9Gi or 12Gi" in f.message


# -- selectors and matching -------------------------------------------------------------------


def test_request_selector_guarded_by_its_class_passes():
    selectors = [{"cel": {"expression": f'{D}.profile == "1g.10gb"'}}]
    assert findings(claim(exactly(cls="mig.gpu.tessera.dev", selectors=selectors))) == ()


def test_request_selector_unguarded_when_the_class_allows_both_types_is_rejected():
    spec = claim(exactly(cls="any.gpu.tessera.dev", selectors=[{"cel": {"expression": f'{D}.profile == "1g.10gb"'}}]))
    f = only(spec)
    assert f.path == "spec.devices.requests[0].exactly.selectors[0].cel.expression"
    assert 'reads "profile"' in f.message and "every pod using this claim" in f.message


def test_request_selector_compile_error_and_unknown_attribute():
    spec = claim(exactly(selectors=[{"cel": {"expression": f"{D}.productNam == 'x'"}}, {"cel": {"expression": "("}}]))
    result = findings(spec)
    assert [f.path for f in result] == [
        "spec.devices.requests[0].exactly.selectors[1].cel.expression",
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
    ]
    assert 'did you mean "productName"?' in result[1].message


def test_request_that_matches_nothing_warns_with_the_nearest_miss(inventory):
    spec = claim(exactly(selectors=[{"cel": {"expression": f'{D}.productName == "NVIDIA B200"'}}]))
    f = only(spec, ctx(inventory))
    assert f.severity == "warning"
    assert f.path == "spec.devices.requests[0].exactly"
    assert f.message.startswith('request "gpu" matches none of the 12 tessera devices in the cluster; nearest miss: ')
    assert f'fails `{D}.productName == "NVIDIA B200"` of request "gpu" selector 0' in f.message


def test_nearest_miss_can_be_the_class_selector(inventory):
    f = only(claim(exactly(cls="mig.gpu.tessera.dev")), ctx(inventory))
    assert 'of DeviceClass "mig.gpu.tessera.dev" selector 0' in f.message


def test_count_larger_than_any_node_offers_warns(inventory):
    spec = claim(exactly(count=6, selectors=[{"cel": {"expression": f'{D}.productName.startsWith("NVIDIA A100")'}}]))
    f = only(spec, ctx(inventory))
    assert f.path == "spec.devices.requests[0].exactly.count"
    assert f.message == (
        'request "gpu" asks for 6 devices on one node, but no node has more than 4 matching devices (node-b); '
        "pods using this claim would stay Pending; `tessera explain pod/<a pod using it>` shows which step rules "
        "each device out"
    )


def test_request_match_counts_per_node(inventory):
    report = check_claim_spec(claim(exactly(count=2)), "spec", ctx(inventory))
    assert report.findings == ()
    assert report.requests[0].match.per_node == {"node-a": 8, "node-b": 4}


def test_unknown_tessera_class_warns_when_the_class_list_is_complete():
    f = only(claim(exactly(cls="typo.gpu.tessera.dev")))
    assert f.severity == "warning"
    assert f.path == "spec.devices.requests[0].exactly.deviceClassName"
    assert 'DeviceClass "typo.gpu.tessera.dev" does not exist' in f.message
    assert findings(claim(exactly(cls="typo.gpu.tessera.dev")), ctx(complete=False)) == ()


def test_misspelt_class_name_gets_a_suggestion():
    f = only(claim(exactly(cls="gpu.tesera.dev")))
    assert f.path == "spec.devices.requests[0].exactly.deviceClassName"
    assert f.message == ('DeviceClass "gpu.tesera.dev" does not exist; did you mean "gpu.tessera.dev"? Pods using '
                         "this claim stay Pending until the class exists")
    f = only(claim(exactly(cls="mgi.gpu.tessera.dev")))
    assert 'does not exist; did you mean "mig.gpu.tessera.dev"? pods using' in f.message
    assert findings(claim(exactly(cls="gpu.tesera.dev")), ctx(complete=False)) == ()


def test_requests_for_other_drivers_are_not_checked():
    spec = claim(exactly(cls="nic.example.com", capacity={"requests": {"gpu.tessera.dev/memory": "1"}}))
    assert findings(spec) == ()


def test_first_available_subrequests_are_checked_with_their_own_path():
    spec = claim({"name": "acc", "firstAvailable": [
        {"name": "full", "deviceClassName": "gpu.tessera.dev"},
        {"name": "share", "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"memory": "3.5Mi"}}},
    ]})
    f = only(spec)
    assert f.path == "spec.devices.requests[0].firstAvailable[1].capacity.requests[memory]"


def test_template_paths_start_at_spec_spec():
    f = only(claim(exactly(**memory("0"))), path="spec.spec")
    assert f.path == "spec.spec.devices.requests[0].exactly.capacity.requests[memory]"


def test_malformed_fields_are_reported_not_crashed_on():
    spec = claim(exactly(selectors={"cel": "x"}, capacity={"requests": ["memory"]}), config={"opaque": {}})
    result = {f.path: f.message for f in findings(spec)}
    assert result["spec.devices.requests[0].exactly.selectors"] == "must be a list of {cel: {expression: ...}} entries"
    assert result["spec.devices.requests[0].exactly.capacity"] == "must be {requests: {memory: <quantity>}}"
    assert result["spec.devices.config"] == "must be a list of {opaque: {driver, parameters}} entries"


def test_spec_that_is_not_an_object_is_an_error():
    [f] = check_claim_spec("nope", "spec", ctx()).findings  # type: ignore[arg-type]
    assert (f.path, f.message) == ("spec", "must be an object")


# -- how each request is shared ------------------------------------------------------------------


def test_nvidias_gpu_test5_claim_mixing_time_slicing_and_mps_is_admitted() -> None:
    spec = claim(exactly("ts-gpu"), exactly("mps-gpu"), config=[
        gpu_config({"sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}, ["ts-gpu"]),
        gpu_config({"sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 50,
                                                            "pinnedDeviceMemoryLimit": "10Gi"}}}, ["mps-gpu"]),
    ])  # fmt: skip
    assert findings(spec) == ()


def test_a_memory_share_that_a_config_time_slices_is_denied_naming_the_strategy() -> None:
    spec = claim(exactly("small", capacity={"requests": {"memory": "4Gi"}}), exactly("big"),
                 config=[gpu_config({"sharing": {"strategy": "TimeSlicing"}}, ["small"])])  # fmt: skip
    f = only(spec)
    assert f.severity == "error" and f.path == "spec.devices.config[0].opaque.parameters.sharing.strategy"
    assert f.message.startswith('request "small": a memory share is enforced by an MPS daemon, so sharing.strategy '
                                "must be MPS")


def test_mps_settings_on_a_whole_gpu_without_the_mps_strategy_are_denied_naming_the_request() -> None:
    f = only(claim(exactly("gpu"), config=[gpu_config({"sharing": {"mps": {"activeThreadPercentage": 50}}})]))
    assert f.path == "spec.devices.requests[0].exactly"
    assert f.message == 'request "gpu": sharing.mps is set but the strategy is Exclusive; set strategy MPS'


def test_a_class_that_time_slices_cannot_carry_a_memory_share() -> None:
    ts = device_class("ts.gpu.tessera.dev", 'device.driver == "gpu.tessera.dev"', config=[gpu_config(
        {"sharing": {"strategy": "TimeSlicing"}})])  # fmt: skip
    context = CheckContext(schema=published_schema(), samples=sample_index(), inventory=None,
                           classes={**CLASSES, "ts.gpu.tessera.dev": ts}, classes_complete=True)  # fmt: skip
    f = only(claim(exactly("gpu", cls="ts.gpu.tessera.dev", capacity={"requests": {"memory": "4Gi"}})), context)
    assert f.path == "spec.devices.requests[0].exactly" and "got TimeSlicing" in f.message
