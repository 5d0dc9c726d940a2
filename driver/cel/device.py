"""The CEL input for one ResourceSlice device, built the way the scheduler builds it (DeviceMatches).

Attribute and capacity names are split at the first `/`; a bare name belongs to the driver's
domain. Capacities go through the apiserver's canonical string and back, because that is the
form the scheduler reads, and Go's representation (which `isInteger()` exposes) depends on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from driver.cel.errors import DeviceViewError
from driver.quantity import Quantity, canonical_roundtrip
from driver.semver import Version

AttributeValue = int | bool | str | Version | list[int] | list[bool] | list[str] | list[Version]


@dataclass(frozen=True, eq=False)
class DeviceView:
    """One device as CEL sees it. Engines cache their converted form in `_cache` (keyed by engine)."""

    driver: str
    attributes: Mapping[str, Mapping[str, AttributeValue]]
    capacity: Mapping[str, Mapping[str, Quantity]]
    allow_multiple_allocations: bool = False
    # Why the scheduler could not evaluate anything on this device ("" when it can); see device_view.
    error: str = ""
    _cache: dict[str, object] = field(default_factory=dict, repr=False, compare=False)


def split_name(driver: str, qualified: str) -> tuple[str, str]:
    domain, sep, name = qualified.partition("/")
    return (domain, name) if sep else (driver, qualified)


def _attribute_value(path: str, raw: Any) -> AttributeValue:
    if not isinstance(raw, Mapping) or len(raw) != 1:
        raise DeviceViewError(path, "must set exactly one of int, bool, string, version (or a list form)")
    (kind, value), = raw.items()
    scalar = {"int": int, "bool": bool, "string": str, "version": str}
    lists = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}
    if kind in scalar:
        return _scalar(f"{path}.{kind}", kind, value)
    if kind in lists:
        if not isinstance(value, list) or not value:
            raise DeviceViewError(f"{path}.{kind}", "must be a non-empty list")
        return [_scalar(f"{path}.{kind}[{i}]", lists[kind], v) for i, v in enumerate(value)]  # type: ignore[return-value]
    raise DeviceViewError(path, f"unknown attribute value type {kind!r} (use int, bool, string or version)")


def _scalar(path: str, kind: str, value: Any) -> int | bool | str | Version:
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise DeviceViewError(path, f"must be an integer, not {type(value).__name__}")
        if not -(1 << 63) <= value < (1 << 63):
            raise DeviceViewError(path, "must fit in int64")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise DeviceViewError(path, f"must be a boolean, not {type(value).__name__}")
        return value
    if not isinstance(value, str):
        raise DeviceViewError(path, f"must be a string, not {type(value).__name__}")
    if kind == "version":
        try:
            return Version.parse(value)
        except ValueError as e:
            raise DeviceViewError(path, f"invalid semantic version {value!r}: {e}") from e
    return value


def device_view(driver: str, device: Mapping[str, Any], *, list_type_attributes: bool = False) -> DeviceView:
    """Build the CEL input from a resource.k8s.io/v1 device dict (name, attributes, capacity, ...).

    List-valued attributes (ints/bools/strings/versions) exist only with the DRAListTypeAttributes
    feature gate. Without it (the default, as in Kubernetes 1.36) the scheduler cannot convert such
    a device and every selector fails on it; the view records that as `error`.
    """
    attributes: dict[str, dict[str, AttributeValue]] = {}
    error = ""
    for key, raw in (device.get("attributes") or {}).items():
        domain, name = split_name(driver, str(key))
        value = _attribute_value(f"attributes[{key!r}]", raw)
        if isinstance(value, list) and not list_type_attributes and not error:
            error = f"attribute {domain}/{name}: unsupported attribute value"
        attributes.setdefault(domain, {})[name] = value
    capacity: dict[str, dict[str, Quantity]] = {}
    for key, raw in (device.get("capacity") or {}).items():
        path = f"capacity[{key!r}].value"
        text = raw.get("value") if isinstance(raw, Mapping) else None
        if not isinstance(text, str | int):
            raise DeviceViewError(path, "must be a quantity string such as \"80Gi\"")
        try:
            quantity = canonical_roundtrip(str(text))
        except ValueError as e:
            raise DeviceViewError(path, f"invalid quantity {text!r}: {e}") from e
        domain, name = split_name(driver, str(key))
        capacity.setdefault(domain, {})[name] = quantity
    allow = device.get("allowMultipleAllocations")
    if allow is not None and not isinstance(allow, bool):
        raise DeviceViewError("allowMultipleAllocations", "must be a boolean")
    return DeviceView(driver, attributes, capacity, bool(allow), error)
