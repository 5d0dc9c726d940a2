"""The device nodes and device names in a claim's CDI spec.

MIG capability minors come from the driver's table under --proc-root when there is one; a simulated
node writes the device numbers into the spec; a device allocated twice in a claim gets two CDI names.
"""

from __future__ import annotations

from pathlib import Path

from tests.builders.claims import UID, inventory, result
from tests.builders.state import make_state, prepare, spec_of, visible_of


def _proc_root(tmp_path: Path) -> Path:
    table = tmp_path / "proc" / "driver" / "nvidia-caps" / "mig-minors"
    table.parent.mkdir(parents=True)
    table.write_text(
        "gpu0/gi1/access 800\ngpu0/gi1/ci0/access 801\n"  # the instance tessera creates on gpu-0
        "gpu1/gi1/access 900\ngpu1/gi1/ci0/access 901\n"  # the static 3g.40gb on gpu-1
    )
    return tmp_path / "proc"


def test_mig_nodes_take_their_minors_from_the_proc_table_and_carry_the_numbers(tmp_path: Path) -> None:
    state = make_state(tmp_path, "mixed", proc_root=_proc_root(tmp_path))
    got = prepare(state, [result("gpu-1-mig-3g40gb-0", "static"), result("gpu-0-mig-1g10gb-0", "dynamic")])
    assert not got.error
    spec = spec_of(state)

    def node(path: str, major: int, minor: int) -> dict[str, object]:
        return {"path": path, "type": "c", "major": major, "minor": minor}

    assert [d["containerEdits"]["deviceNodes"] for d in spec["devices"]] == [
        [node("/dev/nvidia1", 195, 1), node("/dev/nvidia-caps/nvidia-cap900", 511, 900),
         node("/dev/nvidia-caps/nvidia-cap901", 511, 901)],
        [node("/dev/nvidia0", 195, 0), node("/dev/nvidia-caps/nvidia-cap800", 511, 800),
         node("/dev/nvidia-caps/nvidia-cap801", 511, 801)],
    ]  # fmt: skip
    assert spec["containerEdits"]["deviceNodes"] == [
        node("/dev/nvidiactl", 195, 255),
        node("/dev/nvidia-uvm", 510, 0),
        node("/dev/nvidia-uvm-tools", 510, 1),
    ]


def test_a_whole_gpu_allocated_twice_gets_a_cdi_name_per_result(tmp_path: Path) -> None:
    """No share id tells the two apart, so the result index does."""
    state = make_state(tmp_path)
    got = prepare(state, [result("gpu-2", "a"), result("gpu-2", "b", adminAccess=True)])
    assert not got.error
    assert [d.cdi_device_ids for d in got.devices] == [
        (f"gpu.tessera.dev/claim={UID}-gpu-2-0",),
        (f"gpu.tessera.dev/claim={UID}-gpu-2-1",),
    ]
    assert [d["name"] for d in spec_of(state)["devices"]] == [f"{UID}-gpu-2-0", f"{UID}-gpu-2-1"]
    assert visible_of(spec_of(state)) == inventory().gpu_by_index(2).uuid
