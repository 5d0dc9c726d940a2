"""The webhook compiles selectors in the CEL environment the apiserver uses for the same request:
new expressions (with the cluster's DRA feature gates) for a created object or changed selectors, stored
expressions for a DeviceClass update that leaves its selectors as they were."""

from __future__ import annotations

import argparse
import copy
import io
from pathlib import Path

import pytest
import yaml

from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from driver.cel import NEW, CelEnvironment
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.builders.admission import GPU_CLASS, D, claim, review
from tests.fakes.cluster import device_class

INCLUDES = f'{D}.type.includes("gpu")'
ALLOW_MULTIPLE = "device.allowMultipleAllocations"


def handler(environment: CelEnvironment = NEW) -> AdmissionHandler:
    return AdmissionHandler(lambda: CheckContext(schema=published_schema(), samples=sample_index(),
                                                 classes={"gpu.tessera.dev": GPU_CLASS}, classes_complete=True,
                                                 cel_environment=environment))


def message(body: dict) -> str:
    return str(body["response"].get("status", {}).get("message", ""))


def test_a_new_class_calling_includes_is_denied_while_list_type_attributes_is_off() -> None:
    body, _ = handler().review("/validate-deviceclass", review(device_class("x.gpu.tessera.dev", INCLUDES)))
    assert body["response"]["allowed"] is False
    assert "undeclared reference to 'includes'" in message(body)
    assert "DRAListTypeAttributes" in message(body)


def test_a_new_class_calling_includes_is_admitted_when_the_cluster_has_list_type_attributes() -> None:
    gates_on = CelEnvironment("new", list_type_attributes=True)
    body, _ = handler(gates_on).review("/validate-deviceclass", review(device_class("x.gpu.tessera.dev", INCLUDES)))
    assert body["response"]["allowed"] is True, message(body)


def test_a_class_update_keeping_its_selectors_compiles_them_as_stored_expressions() -> None:
    # admitted under another gate setting, now only its config changes: the apiserver keeps it valid
    old = device_class("x.gpu.tessera.dev", INCLUDES)
    new = copy.deepcopy(old)
    new["spec"]["extendedResourceName"] = "example.com/gpu"
    body, _ = handler().review("/validate-deviceclass", review(new, operation="UPDATE", old=old))
    assert body["response"]["allowed"] is True, message(body)


def test_a_class_update_changing_its_selectors_compiles_them_as_new_expressions() -> None:
    old = device_class("x.gpu.tessera.dev", f'{D}.type == "gpu"')
    new = device_class("x.gpu.tessera.dev", INCLUDES)
    body, _ = handler().review("/validate-deviceclass", review(new, operation="UPDATE", old=old))
    assert body["response"]["allowed"] is False
    assert "undeclared reference to 'includes'" in message(body)


def test_a_missing_selector_list_equals_an_empty_one_on_update() -> None:
    old = device_class("x.gpu.tessera.dev")
    del old["spec"]["selectors"]
    new = device_class("x.gpu.tessera.dev")
    new["spec"]["extendedResourceName"] = "example.com/gpu"
    body, _ = handler().review("/validate-deviceclass", review(new, operation="UPDATE", old=old))
    assert body["response"]["allowed"] is True, message(body)


def test_allow_multiple_allocations_needs_consumable_capacity_in_a_new_selector() -> None:
    cls = device_class("x.gpu.tessera.dev", f"{ALLOW_MULTIPLE} && {D}.type == \"gpu\"")
    off = CelEnvironment("new", consumable_capacity=False)
    body, _ = handler(off).review("/validate-deviceclass", review(cls))
    assert body["response"]["allowed"] is False
    assert "undefined field 'allowMultipleAllocations'" in message(body)
    body, _ = handler().review("/validate-deviceclass", review(cls))
    assert body["response"]["allowed"] is True, message(body)


def test_a_claim_compiles_its_own_selectors_as_new_and_its_class_as_stored() -> None:
    # the stored class's includes() compiles (so it rules out every device here, which the claim hears
    # about), while the claim's own includes() is new and rejected
    index = DeviceIndex.from_slices(build_slices(load_inventory("node-a", simulate="dgx-h100-8"), mig_strategy="none"))
    stored_class = device_class("incl.gpu.tessera.dev", f'{D}.type.includes("mig")')
    ctx = CheckContext(schema=published_schema(), samples=sample_index(), inventory=index, classes_complete=True,
                       classes={"incl.gpu.tessera.dev": stored_class, "gpu.tessera.dev": GPU_CLASS})
    webhook = AdmissionHandler(lambda: copy.copy(ctx))
    uses_class = claim({"devices": {"requests": [
        {"name": "g", "exactly": {"deviceClassName": "incl.gpu.tessera.dev"}}]}})
    body, _ = webhook.review("/validate-resourceclaim", review(uses_class))
    assert body["response"]["allowed"] is True, message(body)
    assert any('request "g" matches none of the 8' in w for w in body["response"]["warnings"])
    own_selector = claim({"devices": {"requests": [{"name": "g", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "selectors": [{"cel": {"expression": INCLUDES}}]}}]}})
    body, _ = webhook.review("/validate-resourceclaim", review(own_selector))
    assert body["response"]["allowed"] is False
    assert "spec.devices.requests[0].exactly.selectors[0].cel.expression" in message(body)


def test_tessera_check_uses_the_gates_it_is_given(tmp_path: Path) -> None:
    from tessera.cmd_check import check_files

    path = tmp_path / "class.yaml"
    path.write_text(yaml.safe_dump(device_class("x.gpu.tessera.dev", INCLUDES)))
    out = io.StringIO()
    assert check_files([str(path)], slices=None, kubeconfig=None, out=out, err=io.StringIO()) == 1
    assert "undeclared reference to 'includes'" in out.getvalue()
    gates_on = CelEnvironment("new", list_type_attributes=True)
    assert check_files([str(path)], slices=None, kubeconfig=None, out=io.StringIO(), err=io.StringIO(),
                       environment=gates_on) == 0


@pytest.mark.parametrize(("command", "extra"), [("check", ["x.yaml"]), ("controller", ["--tls-cert", "c",
                                                                                       "--tls-key", "k"])])
def test_a_bad_feature_gate_stops_the_command_with_the_gate_named(command: str, extra: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from tessera.cli import build_parser

    args: argparse.Namespace = build_parser().parse_args([command, *extra, "--feature-gates", "DRAListTypeAttributes"])
    assert args._module.run(args) == 2
    captured = capsys.readouterr()
    assert "DRAListTypeAttributes=true or DRAListTypeAttributes=false" in captured.out + captured.err
