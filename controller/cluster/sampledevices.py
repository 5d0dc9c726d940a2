"""Sample devices of every shape tessera publishes, for checks that need devices when the cluster's
inventory does not show them (an empty cluster, `tessera check` without slices, a device type that no
node has yet).

They are the ResourceSlices tessera would publish for each built-in simulated profile, under both
MIG strategies, plus one device per type whose values are all zero, so every device type is present
even if no profile has it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from controller.cluster.inventory import DeviceIndex
from controller.cluster.schema import AttributeSchema, published_schema
from driver import DRIVER_NAME

_ZERO: dict[str, Any] = {"int": 0, "bool": False, "string": "", "version": "0.0.0"}


def synthetic_device(schema: AttributeSchema, device_type: str) -> dict[str, Any]:
    """A device of `device_type` carrying exactly the schema's attributes, with zero values."""
    attributes: dict[str, Any] = {}
    for domain, name in sorted(schema.by_type[device_type]):
        key = name if domain == DRIVER_NAME else f"{domain}/{name}"
        kind = schema.kinds[(domain, name)]
        attributes[key] = {kind: device_type if (domain, name) == (DRIVER_NAME, "type") else _ZERO[kind]}
    return {
        "name": f"sample-{device_type}",
        "attributes": attributes,
        "capacity": {name: {"value": "0"} for name in schema.capacities},
    }


@cache
def sample_index() -> DeviceIndex:
    from driver.simulated import builtin_profiles, simulated_inventory
    from driver.slices import build_slices

    schema = published_schema()
    slices: list[dict[str, Any]] = []
    for profile in builtin_profiles():
        for strategy in ("static", "dynamic"):
            inventory = simulated_inventory(f"sample-{profile}-{strategy}", profile)
            slices.extend(build_slices(inventory, mig_strategy=strategy))
    slices.append(
        {
            "spec": {
                "driver": DRIVER_NAME,
                "pool": {"name": "sample-synthetic", "generation": 0, "resourceSliceCount": 1},
                "nodeName": "sample-synthetic",
                "devices": [synthetic_device(schema, t) for t in schema.device_types],
            }
        }
    )
    return DeviceIndex.from_slices(slices)
