"""The kubelet protos: committed generated code is current, and names/field numbers match kubelet's wire contract."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from proto import generate
from proto.dra.v1 import api_pb2 as dra_v1
from proto.dra.v1beta1 import api_pb2 as dra_v1beta1
from proto.drahealth.v1alpha1 import api_pb2 as health_v1alpha1
from proto.pluginregistration.v1 import api_pb2 as registration_v1

STRING = FieldDescriptor.TYPE_STRING
MESSAGE = FieldDescriptor.TYPE_MESSAGE
BOOL = FieldDescriptor.TYPE_BOOL
INT64 = FieldDescriptor.TYPE_INT64
ENUM = FieldDescriptor.TYPE_ENUM


def _fields(message: type) -> dict[str, tuple[int, int, bool]]:
    """name -> (number, type, repeated) as the wire sees them."""
    return {f.name: (f.number, f.type, f.is_repeated) for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_committed_generated_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    fresh = generate.generate(out_dir=tmp_path)
    committed = generate.generated_files(generate.REPO_ROOT)
    assert fresh == committed, "generated file set changed: run `make proto` and commit the result"
    stale = [str(p) for p in fresh if (tmp_path / p).read_bytes() != (generate.REPO_ROOT / p).read_bytes()]
    assert not stale, f"stale generated code (run `make proto` and commit): {stale}"


def test_generation_is_byte_identical_when_run_twice(tmp_path: Path) -> None:
    first = generate.generate(out_dir=tmp_path / "a")
    second = generate.generate(out_dir=tmp_path / "b")
    assert first == second
    for rel in first:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_every_proto_source_yields_messages_and_grpc_modules() -> None:
    sources = generate.proto_sources()
    assert [str(s) for s in sources] == [
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/drahealth/v1alpha1/api.proto",
        "proto/pluginregistration/v1/api.proto",
        "proto/podresources/v1/api.proto",
    ]
    generated = {str(p) for p in generate.generated_files(generate.REPO_ROOT)}
    for src in sources:
        stem = str(src).removesuffix(".proto")
        for suffix in generate.GENERATED_SUFFIXES:
            assert stem + suffix in generated


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        (dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", ["NodePrepareResources", "NodeUnprepareResources"]),
        (
            dra_v1beta1,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
            ["NodePrepareResources", "NodeUnprepareResources"],
        ),
        (registration_v1, "pluginregistration.Registration", ["GetInfo", "NotifyRegistrationStatus"]),
        (health_v1alpha1, "v1alpha1.DRAResourceHealth", ["NodeWatchResources"]),
    ],
)
def test_services_carry_the_full_names_kubelet_calls(module: object, service: str, methods: list[str]) -> None:
    services = module.DESCRIPTOR.services_by_name  # type: ignore[attr-defined]
    (descriptor,) = services.values()
    assert descriptor.full_name == service
    assert [m.name for m in descriptor.methods] == methods


def test_health_stream_is_server_streaming() -> None:
    method = health_v1alpha1.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name["NodeWatchResources"]
    assert method.server_streaming and not method.client_streaming


@pytest.mark.parametrize("module", [dra_v1, dra_v1beta1])
def test_dra_messages_match_the_wire_contract(module: object) -> None:
    m = module
    assert _fields(m.Claim) == {"namespace": (1, STRING, False), "uid": (2, STRING, False), "name": (3, STRING, False)}  # type: ignore[attr-defined]
    assert _fields(m.NodePrepareResourcesRequest) == {"claims": (1, MESSAGE, True)}  # type: ignore[attr-defined]
    assert _fields(m.NodeUnprepareResourcesRequest) == {"claims": (1, MESSAGE, True)}  # type: ignore[attr-defined]
    assert _fields(m.NodePrepareResourceResponse) == {"devices": (1, MESSAGE, True), "error": (2, STRING, False)}  # type: ignore[attr-defined]
    assert _fields(m.NodeUnprepareResourceResponse) == {"error": (1, STRING, False)}  # type: ignore[attr-defined]
    for resp in (m.NodePrepareResourcesResponse, m.NodeUnprepareResourcesResponse):  # type: ignore[attr-defined]
        claims = resp.DESCRIPTOR.fields_by_name["claims"]
        assert claims.number == 1 and claims.message_type.GetOptions().map_entry
        assert claims.message_type.fields_by_name["key"].type == STRING


def test_v1_device_has_optional_share_id_and_v1beta1_does_not() -> None:
    base = {
        "request_names": (1, STRING, True),
        "pool_name": (2, STRING, False),
        "device_name": (3, STRING, False),
        "cdi_device_ids": (4, STRING, True),
    }
    assert _fields(dra_v1beta1.Device) == base
    assert _fields(dra_v1.Device) == {**base, "share_id": (5, STRING, False)}
    assert dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"].has_presence
    assert not dra_v1.Device(device_name="gpu-0").HasField("share_id")


def test_v1_device_bytes_parse_as_v1beta1_minus_share_id() -> None:
    v1 = dra_v1.Device(
        request_names=["gpu"], pool_name="node-a", device_name="gpu-0",
        cdi_device_ids=["k8s.gpu.tessera.dev/claim=u-gpu-0"], share_id="3f2c8a9e-5d41-4b7a-9e2f-6c0d1a2b3c4d",
    )
    old = dra_v1beta1.Device.FromString(v1.SerializeToString())
    assert (list(old.request_names), old.pool_name, old.device_name, list(old.cdi_device_ids)) == (
        ["gpu"], "node-a", "gpu-0", ["k8s.gpu.tessera.dev/claim=u-gpu-0"],
    )


def test_registration_messages_match_the_wire_contract() -> None:
    assert _fields(registration_v1.PluginInfo) == {
        "type": (1, STRING, False),
        "name": (2, STRING, False),
        "endpoint": (3, STRING, False),
        "supported_versions": (4, STRING, True),
    }
    assert _fields(registration_v1.RegistrationStatus) == {
        "plugin_registered": (1, BOOL, False),
        "error": (2, STRING, False),
    }
    assert _fields(registration_v1.InfoRequest) == {}
    assert _fields(registration_v1.RegistrationStatusResponse) == {}


def test_health_messages_match_the_wire_contract() -> None:
    assert _fields(health_v1alpha1.NodeWatchResourcesRequest) == {}
    assert _fields(health_v1alpha1.DeviceIdentifier) == {
        "pool_name": (1, STRING, False),
        "device_name": (2, STRING, False),
    }
    assert _fields(health_v1alpha1.DeviceHealth) == {
        "device": (1, MESSAGE, False),
        "health": (2, ENUM, False),
        "last_updated_time": (3, INT64, False),
        "health_check_timeout_seconds": (4, INT64, False),
        "message": (5, STRING, False),
    }
    assert _fields(health_v1alpha1.NodeWatchResourcesResponse) == {"devices": (1, MESSAGE, True)}
    status = health_v1alpha1.HealthStatus
    assert (status.Value("UNKNOWN"), status.Value("HEALTHY"), status.Value("UNHEALTHY")) == (0, 1, 2)


def test_each_proto_registers_under_its_own_path() -> None:
    # Two files registered under the same name ("api.proto") would collide in the default pool.
    names = {m.DESCRIPTOR.name for m in (dra_v1, dra_v1beta1, registration_v1, health_v1alpha1)}
    assert names == {
        "proto/dra/v1/api.proto",
        "proto/dra/v1beta1/api.proto",
        "proto/pluginregistration/v1/api.proto",
        "proto/drahealth/v1alpha1/api.proto",
    }


def _kubelet_module() -> Path | None:
    """k8s.io/kubelet's sources from the Go module cache the e2e harness fills, when present."""
    roots = [os.environ.get("GOMODCACHE", ""), os.path.join(os.environ.get("TESSERA_CACHE", ""), "go", "mod"),
             str(Path.home() / ".cache" / "tessera" / "go" / "mod")]
    for root in filter(None, roots):
        found = sorted(Path(root).glob("k8s.io/kubelet@v0.*/pkg/apis/dra/v1/api.proto"))
        if found:
            return found[-1].parents[4]
    return None


def _descriptors(include: Path, files: list[str], out: Path) -> list[descriptor_pb2.FileDescriptorProto]:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    assert protoc.main(["protoc", f"-I{include}", f"--descriptor_set_out={out}", *files]) == 0
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    for f in fds.file:
        # The file name and the (gogo) options are not on the wire; everything else must match.
        f.ClearField("name")
        f.ClearField("options")
        for m in f.message_type:
            for field in m.field:
                field.ClearField("options")
    return list(fds.file)


def test_protos_equal_kubelets_own_on_the_wire(tmp_path: Path) -> None:
    module = _kubelet_module()
    if module is None:
        pytest.skip("k8s.io/kubelet is not in the Go module cache (run `make harness` once to fill it)")
    upstream = ["dra/v1/api.proto", "dra/v1beta1/api.proto", "dra-health/v1alpha1/api.proto",
                "pluginregistration/v1/api.proto"]
    for rel in upstream:
        target = tmp_path / "src" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        lines = (module / "pkg" / "apis" / rel).read_text().splitlines(keepends=True)
        target.write_text("".join(line for line in lines if "gogo" not in line))
    theirs = _descriptors(tmp_path / "src", upstream, tmp_path / "theirs.pb")
    ours = _descriptors(
        generate.REPO_ROOT,
        [str(p) for p in generate.proto_sources()],
        tmp_path / "ours.pb",
    )
    by_package = {f.package: f for f in ours}
    for f in theirs:
        assert f.package in by_package, f"no tessera proto for package {f.package}"
        assert by_package[f.package] == f, f"{f.package} differs from {module.name}"


def test_podresources_subset_matches_kubelets_fields(tmp_path: Path) -> None:
    """The e2e PodResources client declares part of kubelet's API: every field it has is kubelet's."""
    module = _kubelet_module()
    if module is None:
        pytest.skip("k8s.io/kubelet is not in the Go module cache (run `make harness` once to fill it)")
    rel = "podresources/v1/api.proto"
    target = tmp_path / "src" / rel
    target.parent.mkdir(parents=True)
    lines = (module / "pkg" / "apis" / rel).read_text().splitlines(keepends=True)
    target.write_text("".join(line for line in lines if "gogo" not in line))
    [theirs] = _descriptors(tmp_path / "src", [rel], tmp_path / "theirs.pb")
    [ours] = _descriptors(generate.REPO_ROOT, ["proto/podresources/v1/api.proto"], tmp_path / "ours.pb")
    assert ours.package == theirs.package
    upstream = {m.name: {f.number: f for f in m.field} for m in theirs.message_type}
    for message in ours.message_type:
        assert message.name in upstream, f"kubelet has no message {message.name}"
        for field in message.field:
            assert upstream[message.name].get(field.number) == field, f"{message.name}.{field.name} differs"
    services = {s.name: {m.name: m for m in s.method} for s in theirs.service}
    for service in ours.service:
        for method in service.method:
            assert services[service.name][method.name] == method
