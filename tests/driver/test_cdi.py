"""CDI specs: content per device kind, schema validity, atomic writes, names that cannot escape the CDI dir."""

from __future__ import annotations

import json
import os
import stat

import jsonschema  # type: ignore[import-untyped]
import pytest

from driver.cdi import (
    CDI_KIND,
    SIMULATED_DEVICE_NUMBERS,
    CdiError,
    ContainerEdits,
    DeviceNode,
    Mount,
    SpecDevice,
    build_claim_spec,
    check_claim_uid,
    claim_spec_uids,
    device_name,
    gpu_device_nodes,
    mig_capability_minors,
    mig_device_nodes,
    minimum_cdi_version,
    qualified_id,
    read_spec,
    remove_spec,
    spec_path,
    write_spec,
)
from tests.paths import CDI_SCHEMA

UID = "7c1d0c4e-2f7e-4a55-9c8e-1f2a3b4c5d6e"
SCHEMA = json.loads(CDI_SCHEMA.read_text())


def validate(spec):
    jsonschema.Draft202012Validator(SCHEMA).validate(spec)


def whole_gpu_spec():
    return build_claim_spec(
        UID, [SpecDevice(device_name(UID, "gpu-0"), ContainerEdits(device_nodes=gpu_device_nodes(0)))]
    )


def test_whole_gpu_spec_content():
    spec = whole_gpu_spec()
    validate(spec)
    assert spec["kind"] == "gpu.tessera.dev/claim"
    assert spec["cdiVersion"] == "0.5.0"  # the device name starts with a digit of the claim uid
    assert spec["devices"] == [{"name": f"{UID}-gpu-0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}, {"path": "/dev/nvidia-uvm-tools"}],
    }


def test_mig_spec_has_parent_node_and_capability_nodes():
    nodes = mig_device_nodes(gpu_minor=1, gpu_instance=2, compute_instance=0)
    spec = build_claim_spec(
        UID, [SpecDevice(device_name(UID, "gpu-1-mig-1g10gb-3"), ContainerEdits(device_nodes=nodes))]
    )
    validate(spec)
    # gpu1/gi2/access = 3 + 1*135 + 2*9 = 156, its ci0 follows it
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1"},
        {"path": "/dev/nvidia-caps/nvidia-cap156"},
        {"path": "/dev/nvidia-caps/nvidia-cap157"},
    ]


def test_simulated_node_specs_carry_device_numbers():
    numbers = SIMULATED_DEVICE_NUMBERS
    nodes = mig_device_nodes(1, 2, 0, None, numbers)
    spec = build_claim_spec(
        UID,
        [SpecDevice(device_name(UID, "gpu-1-mig-1g10gb-3"), ContainerEdits(device_nodes=nodes))],
        numbers=numbers,
    )
    validate(spec)
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
        {"path": "/dev/nvidia-uvm", "type": "c", "major": numbers.nvidia_uvm, "minor": 0},
        {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": numbers.nvidia_uvm, "minor": 1},
    ]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1},
        {"path": "/dev/nvidia-caps/nvidia-cap156", "type": "c", "major": numbers.nvidia_caps, "minor": 156},
        {"path": "/dev/nvidia-caps/nvidia-cap157", "type": "c", "major": numbers.nvidia_caps, "minor": 157},
    ]


def test_device_nodes_are_merged_by_path():
    merged = ContainerEdits(device_nodes=(DeviceNode("/dev/a"),)) + ContainerEdits(
        device_nodes=(DeviceNode("/dev/a", 1, 2), DeviceNode("/dev/b"))
    )
    assert merged.device_nodes == (DeviceNode("/dev/a"), DeviceNode("/dev/b"))


def test_mig_capability_minors_match_the_drivers_published_grid():
    assert mig_capability_minors(0, 0, 0, None) == (3, 4)
    assert mig_capability_minors(3, 3, 3, None) == (435, 439)
    assert mig_capability_minors(31, 14, 7, None) == (4314, 4322)


def test_mig_capability_minors_are_read_from_proc_when_present(tmp_path):
    table = tmp_path / "driver" / "nvidia-caps"
    table.mkdir(parents=True)
    (table / "mig-minors").write_text("config 1\nmonitor 2\ngpu0/gi7/access 77\ngpu0/gi7/ci0/access 78\n")
    assert mig_capability_minors(0, 7, 0, tmp_path) == (77, 78)


def test_mig_capability_minors_missing_from_proc_table_is_an_error(tmp_path):
    table = tmp_path / "driver" / "nvidia-caps"
    table.mkdir(parents=True)
    (table / "mig-minors").write_text("config 1\n")
    with pytest.raises(CdiError, match="has no entry for gpu0/gi1/access"):
        mig_capability_minors(0, 1, 0, tmp_path)


def test_share_spec_mounts_the_mps_pipe_dir_without_the_limit():
    mps = ContainerEdits(
        env=("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",),
        mounts=(Mount("/var/lib/tessera/mps/x/pipe", "/tmp/nvidia-mps", ("rw", "nosuid", "nodev", "bind")),),
    )
    spec = build_claim_spec(
        UID, [SpecDevice(device_name(UID, "gpu-2"), ContainerEdits(device_nodes=gpu_device_nodes(2)))], mps
    )
    validate(spec)
    env = spec["containerEdits"]["env"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in env
    assert not any("PINNED" in e or "LIMIT" in e for e in env)
    assert spec["containerEdits"]["mounts"] == [
        {
            "hostPath": "/var/lib/tessera/mps/x/pipe",
            "containerPath": "/tmp/nvidia-mps",
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
    ]


def test_four_cards_keep_result_order():
    devices = [
        SpecDevice(device_name(UID, f"gpu-{i}"), ContainerEdits(device_nodes=gpu_device_nodes(i)))
        for i in (6, 1, 3, 0)
    ]
    spec = build_claim_spec(UID, devices)
    validate(spec)
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-{i}" for i in (6, 1, 3, 0)]


def test_no_claim_wide_variable_names_the_devices():
    # a container with two claims gets both specs' variables; one named the same in both keeps one value
    spec = whole_gpu_spec()
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert not any(e.startswith("CUDA_VISIBLE_DEVICES=") for d in spec["devices"]
                   for e in d["containerEdits"].get("env", []))  # fmt: skip


def test_a_requests_device_list_is_named_after_its_claim_and_request():
    from driver.cdi import request_devices_env

    assert request_devices_env(UID, "ts-gpu", ["GPU-1", "GPU-2"]) == (
        f"TESSERA_DEVICES_{UID.upper().replace('-', '_')}_TS_GPU=GPU-1,GPU-2"
    )


def test_spec_without_devices_is_refused():
    with pytest.raises(CdiError, match="needs at least one device"):
        build_claim_spec(UID, [])


def test_device_without_edits_is_refused():
    with pytest.raises(CdiError, match="has no container edits"):
        build_claim_spec(UID, [SpecDevice(device_name(UID, "gpu-0"))])


def test_duplicate_device_names_are_refused():
    d = SpecDevice(device_name(UID, "gpu-0"), ContainerEdits(device_nodes=gpu_device_nodes(0)))
    with pytest.raises(CdiError, match="duplicate CDI device names"):
        build_claim_spec(UID, [d, d])


def test_schema_rejects_a_misspelled_key():
    spec = whole_gpu_spec()
    spec["containerEdits"]["devicenodes"] = spec["containerEdits"].pop("deviceNodes")
    with pytest.raises(jsonschema.ValidationError):
        validate(spec)


def test_schema_rejects_a_spec_without_devices():
    spec = whole_gpu_spec()
    spec["devices"] = []
    with pytest.raises(jsonschema.ValidationError):
        validate(spec)


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        ({"kind": "a.b/c", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}, "0.3.0"),
        ({"kind": "a.b/c", "devices": [{"name": "x", "containerEdits": {"mounts": [{"type": "bind"}]}}]}, "0.4.0"),
        ({"kind": "a.b/c", "devices": [{"name": "1x", "containerEdits": {"env": ["A=1"]}}]}, "0.5.0"),
        (
            {
                "kind": "a.b/c",
                "devices": [{"name": "x", "containerEdits": {"deviceNodes": [{"path": "/d", "hostPath": "/h"}]}}],
            },
            "0.5.0",
        ),
        ({"kind": "a.b/c", "annotations": {}, "devices": []}, "0.6.0"),
        ({"kind": "a.b/c.d", "devices": []}, "0.6.0"),
        ({"kind": "a.b/c", "containerEdits": {"additionalGids": [5]}, "devices": []}, "0.7.0"),
    ],
)
def test_minimum_cdi_version_follows_the_fields_used(spec, version):
    assert minimum_cdi_version(spec) == version


# --- names ------------------------------------------------------------------------------------


def test_qualified_id_uses_the_claim_kind():
    assert qualified_id(f"{UID}-gpu-0") == f"{CDI_KIND}={UID}-gpu-0"


def test_device_name_with_suffix():
    assert device_name(UID, "gpu-0", "3f2c8a9e-5d41") == f"{UID}-gpu-0-3f2c8a9e-5d41"


@pytest.mark.parametrize("uid", ["../etc", "a/b", "", "x" * 200, "-lead", "dot.ted", "space d"])
def test_claim_uids_that_are_not_plain_tokens_are_refused(uid):
    with pytest.raises(CdiError, match="is not a plain token"):
        check_claim_uid(uid)


def test_path_traversal_uid_cannot_write_outside_the_cdi_dir(tmp_path):
    cdi = tmp_path / "cdi"
    with pytest.raises(CdiError):
        write_spec(cdi, "../../evil", whole_gpu_spec())
    assert list(tmp_path.rglob("*evil*")) == []


def test_device_name_outside_cdi_grammar_is_refused():
    with pytest.raises(CdiError, match="CDI device name grammar"):
        device_name(UID, "gpu-0/x")


# --- files ------------------------------------------------------------------------------------


def test_write_spec_creates_the_file_readable_by_runtimes(tmp_path):
    cdi = tmp_path / "run" / "cdi"
    path = write_spec(cdi, UID, whole_gpu_spec())
    assert path == cdi / f"gpu.tessera.dev-claim_{UID}.json"
    assert path == spec_path(cdi, UID)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(cdi.stat().st_mode) == 0o755
    assert json.loads(path.read_text()) == whole_gpu_spec()
    assert read_spec(cdi, UID) == whole_gpu_spec()


def test_write_leaves_no_temporary_files(tmp_path):
    write_spec(tmp_path, UID, whole_gpu_spec())
    write_spec(tmp_path, UID, whole_gpu_spec())
    assert [p.name for p in tmp_path.iterdir()] == [f"gpu.tessera.dev-claim_{UID}.json"]


def test_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    write_spec(tmp_path, UID, whole_gpu_spec())
    before = spec_path(tmp_path, UID).read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_spec(tmp_path, UID, {**whole_gpu_spec(), "kind": "changed/kind"})
    assert spec_path(tmp_path, UID).read_bytes() == before
    assert len(list(tmp_path.iterdir())) == 1


def test_remove_spec_is_idempotent(tmp_path):
    write_spec(tmp_path, UID, whole_gpu_spec())
    assert remove_spec(tmp_path, UID) is True
    assert remove_spec(tmp_path, UID) is False
    assert read_spec(tmp_path, UID) is None


def test_read_spec_of_garbage_is_none(tmp_path):
    spec_path(tmp_path, UID).write_text("{not json")
    assert read_spec(tmp_path, UID) is None


def test_claim_spec_uids_lists_only_tessera_claim_specs(tmp_path):
    write_spec(tmp_path, UID, whole_gpu_spec())
    (tmp_path / "k8s.gpu.nvidia.com-claim_abc.json").write_text("{}")
    (tmp_path / f".gpu.tessera.dev-claim_{UID}.json.123.tmp").write_text("{}")
    assert claim_spec_uids(tmp_path) == [UID]
    assert claim_spec_uids(tmp_path / "missing") == []
