"""A ResourceSlice validator that mirrors the rules of the resource.k8s.io/v1 apiserver.

tessera validates every slice it builds before anything is sent, so a slice that a real apiserver would
reject (HTTP 422) is caught as a bug in tessera, with the same field paths the apiserver would report.
`validate_slice` checks one object as the apiserver does on create; `driver.poolvalidation.validate_pool`
adds the rules that only the scheduler checks across the slices of a pool. The name grammars live in
`driver.grammars`, quantities and versions in `driver.quantity` and `driver.semver`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from driver.grammars import (
    DNS_SUBDOMAIN,
    driver_name_problems,
    is_dns_label,
    is_dns_subdomain,
    is_label_value,
    label_key_problems,
    qualified_name_errors,
)
from driver.quantity import Quantity, parse_quantity
from driver.semver import Version

RESOURCE_API_VERSION = "resource.k8s.io/v1"

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_COUNTER_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_POOL_NAME_LENGTH = 253
MAX_TAINTS = 16
MAX_VALID_VALUES = 10
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_SPEC_FIELDS = {"driver", "pool", "nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection", "devices",
                "sharedCounters"}
_DEVICE_FIELDS = {"name", "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector", "allNodes",
                  "taints", "bindsToNode", "bindingConditions", "bindingFailureConditions",
                  "allowMultipleAllocations", "nodeAllocatableResourceMappings"}
_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")
_TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


@dataclass(frozen=True)
class FieldError:
    """One rule violation, located like the apiserver locates it (`spec.devices[3].attributes[uuid]`)."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def read_quantity(value: Any) -> Quantity | None:
    """A quantity field as the apiserver decodes it, or None when it would reject it.

    The apiserver parses a JSON number's text like a quantity string: 1.5 means "1.5".
    """
    try:
        return parse_quantity(repr(value) if isinstance(value, float) else value)
    except ValueError:
        return None


# -- single object ---------------------------------------------------------------------------------------


class _Collector:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))


def _join(base: str, child: str) -> str:
    if not base:
        return child
    return f"{base}{child}" if child.startswith("[") else f"{base}.{child}"


def validate_slice(obj: Mapping[str, Any], path: str = "", *, require_name: bool = False) -> list[FieldError]:
    """Every error the apiserver would report when creating this ResourceSlice (an empty list when valid).

    `require_name` demands `metadata.name` or `metadata.generateName`; tessera's builder leaves naming to
    the publisher, so it is off by default.
    """
    c = _Collector()
    if obj.get("apiVersion", RESOURCE_API_VERSION) != RESOURCE_API_VERSION:
        c.add(_join(path, "apiVersion"), f"must be {RESOURCE_API_VERSION}, got {obj.get('apiVersion')!r}")
    if obj.get("kind", "ResourceSlice") != "ResourceSlice":
        c.add(_join(path, "kind"), f"must be ResourceSlice, got {obj.get('kind')!r}")
    _validate_metadata(c, obj.get("metadata") or {}, _join(path, "metadata"), require_name)
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        c.add(_join(path, "spec"), "required")
    else:
        _validate_spec(c, spec, _join(path, "spec"))
    return c.errors


def _validate_metadata(c: _Collector, meta: Mapping[str, Any], path: str, require_name: bool) -> None:
    name, generate = meta.get("name"), meta.get("generateName")
    if name is not None:
        if not isinstance(name, str) or not is_dns_subdomain(name):
            c.add(_join(path, "name"), f"{name!r} must be a DNS subdomain of at most 253 characters")
    elif generate is not None:
        # Validated as a prefix: a trailing '-' is fine because random characters follow it. The server
        # shortens a long prefix before appending them, so its length is only bounded like a name's.
        prefix = str(generate)
        masked = prefix[:-1] + "a" if prefix.endswith("-") else prefix
        if not is_dns_subdomain(masked):
            c.add(_join(path, "generateName"), f"{generate!r} must be a DNS subdomain prefix of at most 253 characters")
    elif require_name:
        c.add(_join(path, "name"), "name or generateName is required")
    labels = meta.get("labels") or {}
    for key, value in labels.items():
        for problem in label_key_problems(str(key)):
            c.add(_join(path, f"labels[{key}]"), problem)
        if not is_label_value(value):
            c.add(_join(path, f"labels[{key}]"), f"value {value!r} must be at most 63 characters of [A-Za-z0-9-_.]")
    owners = meta.get("ownerReferences") or []
    controllers = 0
    for i, ref in enumerate(owners):
        for field_name in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(field_name):
                c.add(_join(path, f"ownerReferences[{i}].{field_name}"), "required")
        controllers += bool(ref.get("controller"))
    if controllers > 1:
        c.add(_join(path, "ownerReferences"), "only one reference can have controller set to true")


def _validate_spec(c: _Collector, spec: Mapping[str, Any], path: str) -> None:
    for key in spec:
        if key not in _SPEC_FIELDS:
            c.add(_join(path, key), "unknown field")
    driver = spec.get("driver")
    if not driver:
        c.add(_join(path, "driver"), "required")
    else:
        for problem in driver_name_problems(str(driver)):
            c.add(_join(path, "driver"), problem)
    _validate_pool_ref(c, spec.get("pool"), _join(path, "pool"))
    _validate_node_selection(c, spec, path)

    devices, counters = spec.get("devices"), spec.get("sharedCounters")
    if devices is not None and counters is not None:
        c.add(path, "only one of `sharedCounters` or `devices` is allowed; put counter sets in their own slice")
    if devices is not None:
        _validate_devices(c, devices, _join(path, "devices"), bool(spec.get("perDeviceNodeSelection")))
    if counters is not None:
        _validate_counter_sets(c, counters, _join(path, "sharedCounters"))


def _validate_pool_ref(c: _Collector, pool: Any, path: str) -> None:
    if not isinstance(pool, Mapping):
        c.add(path, "required")
        return
    name = pool.get("name")
    if not name:
        c.add(_join(path, "name"), "required")
    else:
        if len(name) > MAX_POOL_NAME_LENGTH:
            c.add(_join(path, "name"), f"must be at most {MAX_POOL_NAME_LENGTH} characters")
        for part in str(name).split("/"):
            if not DNS_SUBDOMAIN.match(part):
                c.add(_join(path, "name"),
                      f"segment {part!r} must be a DNS subdomain (pool names are subdomains joined by '/')")
    generation = pool.get("generation")
    if not isinstance(generation, int) or not _is_int(generation) or generation < 0:
        c.add(_join(path, "generation"), f"must be an integer >= 0, got {generation!r}")
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or not _is_int(count) or count <= 0:
        c.add(_join(path, "resourceSliceCount"), f"must be greater than zero, got {count!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX


def _validate_node_selection(c: _Collector, spec: Mapping[str, Any], path: str) -> None:
    chosen = []
    node_name = spec.get("nodeName")
    if node_name is not None:
        if node_name == "":
            c.add(_join(path, "nodeName"), "must be either unset or set to a non-empty string")
        else:
            chosen.append("nodeName")
            if not isinstance(node_name, str) or not is_dns_subdomain(node_name):
                c.add(_join(path, "nodeName"), f"{node_name!r} must be a valid node name (a DNS subdomain)")
    selector = spec.get("nodeSelector")
    if selector is not None:
        chosen.append("nodeSelector")
        terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
        if not isinstance(terms, list) or len(terms) != 1:
            c.add(_join(path, "nodeSelector.nodeSelectorTerms"), "must have exactly one node selector term")
    for flag in ("allNodes", "perDeviceNodeSelection"):
        value = spec.get(flag)
        if value is None:
            continue
        if value is True:
            chosen.append(flag)
        else:
            c.add(_join(path, flag), "must be either unset or set to true")
    if not chosen:
        c.add(path, "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required")
    elif len(chosen) > 1:
        c.add(path, f"exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, "
                    f"but {', '.join(chosen)} are set")


def _validate_devices(c: _Collector, devices: Any, path: str, per_device_nodes: bool) -> None:
    if not isinstance(devices, list):
        c.add(path, "must be a list")
        return
    limited = any(d.get("taints") or d.get("consumesCounters") for d in devices if isinstance(d, Mapping))
    limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if limited else MAX_DEVICES
    if len(devices) > limit:
        why = " when any device has taints or consumesCounters" if limited else ""
        c.add(path, f"must have at most {limit} items{why}, has {len(devices)}: split the devices over more slices")
        return
    seen: set[str] = set()
    for i, device in enumerate(devices):
        dpath = f"{path}[{i}]"
        if not isinstance(device, Mapping):
            c.add(dpath, "must be an object")
            continue
        _validate_device(c, device, dpath, per_device_nodes)
        name = device.get("name")
        if isinstance(name, str):
            if name in seen:
                c.add(_join(dpath, "name"), f"duplicate device name {name!r}")
            seen.add(name)


def _validate_device(c: _Collector, device: Mapping[str, Any], path: str, per_device_nodes: bool) -> None:
    for key in device:
        if key not in _DEVICE_FIELDS:
            c.add(_join(path, key), "unknown field")
    name = device.get("name")
    if not name:
        c.add(_join(path, "name"), "required")
    elif not isinstance(name, str) or not is_dns_label(name):
        c.add(_join(path, "name"), f"{name!r} must be a DNS label (at most 63 of [a-z0-9-], alphanumeric at both ends)")

    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        c.add(path, f"the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}, "
                    f"has {total}")
    for key, value in attributes.items():
        apath = _join(path, f"attributes[{key}]")
        for problem in qualified_name_errors(str(key)):
            c.add(apath, problem)
        _validate_attribute_value(c, value, apath)

    shareable = device.get("allowMultipleAllocations")
    if shareable is not None and not isinstance(shareable, bool):
        c.add(_join(path, "allowMultipleAllocations"), "must be a boolean")
    for key, value in capacity.items():
        cpath = _join(path, f"capacity[{key}]")
        for problem in qualified_name_errors(str(key)):
            c.add(cpath, problem)
        _validate_capacity(c, value, cpath, shareable is True)

    _validate_consumptions(c, device.get("consumesCounters"), _join(path, "consumesCounters"))
    _validate_taints(c, device.get("taints"), _join(path, "taints"))

    _validate_device_node_selection(c, device, path, per_device_nodes)


def _validate_device_node_selection(c: _Collector, device: Mapping[str, Any], path: str,
                                    per_device_nodes: bool) -> None:
    own_selection = [k for k in ("nodeName", "nodeSelector", "allNodes") if device.get(k) is not None]
    if per_device_nodes:
        if len(own_selection) != 1:
            c.add(path, "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
                        "`perDeviceNodeSelection` is set to true in the ResourceSlice spec")
    elif own_selection:
        c.add(path, "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is "
                    "set to true in the ResourceSlice spec")


def _validate_attribute_value(c: _Collector, value: Any, path: str) -> None:
    if not isinstance(value, Mapping):
        c.add(path, "must be an object with exactly one of int, bool, string, version")
        return
    kinds = [k for k in value if k in _ATTRIBUTE_KINDS and value[k] is not None]
    for key in value:
        if key not in _ATTRIBUTE_KINDS:
            c.add(_join(path, key), "unknown field (tessera publishes only int, bool, string and version values)")
    if len(kinds) != 1:
        c.add(path, f"exactly one value must be specified, found {len(kinds)}: {sorted(kinds)}")
        return
    kind = kinds[0]
    raw = value[kind]
    vpath = _join(path, kind)
    if kind == "int" and not _is_int(raw):
        c.add(vpath, f"must be a 64-bit integer, got {raw!r}")
    elif kind == "bool" and not isinstance(raw, bool):
        c.add(vpath, f"must be a boolean, got {raw!r}")
    elif kind in {"string", "version"}:
        if not isinstance(raw, str):
            c.add(vpath, f"must be a string, got {raw!r}")
            return
        if len(raw.encode()) > MAX_ATTRIBUTE_VALUE_LENGTH:
            c.add(vpath, f"must be at most {MAX_ATTRIBUTE_VALUE_LENGTH} bytes, has {len(raw.encode())}")
        # Stricter than the apiserver's regex only for numbers past uint64, which the scheduler's semver()
        # could not parse: such a device could never be selected by version.
        if kind == "version" and not Version.is_valid(raw):
            c.add(vpath, f"{raw!r} must be a string compatible with semver.org spec 2.0.0 "
                         "(MAJOR.MINOR.PATCH, no leading zeros, no 'v'), e.g. 12.4.0")


def _validate_capacity(c: _Collector, capacity: Any, path: str, shareable: bool) -> None:
    if not isinstance(capacity, Mapping):
        c.add(path, "must be an object with a value")
        return
    # A missing value is a zero quantity to the apiserver (the Go field is not a pointer).
    value = read_quantity(capacity.get("value", 0))
    if value is None:
        c.add(_join(path, "value"), f"{capacity.get('value')!r} is not a quantity, e.g. 80Gi or 132")
    policy = capacity.get("requestPolicy")
    if policy is None:
        return
    ppath = _join(path, "requestPolicy")
    if not shareable:
        c.add(ppath, "forbidden: allowMultipleAllocations must be true")
        return
    if value is not None:
        _validate_request_policy(c, policy, ppath, value)


def _quantity_field(c: _Collector, raw: Any, path: str) -> Quantity | None:
    q = read_quantity(raw)
    if q is None:
        c.add(path, f"{raw!r} is not a quantity")
    return q


def _validate_request_policy(c: _Collector, policy: Mapping[str, Any], path: str, capacity: Quantity) -> None:
    values, rng = policy.get("validValues"), policy.get("validRange")
    default = None
    if policy.get("default") is not None:
        default = _quantity_field(c, policy["default"], _join(path, "default"))
    if values and rng is not None:
        c.add(path, 'exactly one policy can be specified, cannot specify "validValues" and "validRange" '
                    "at the same time")
        return
    if not values and rng is None:
        return
    if policy.get("default") is None:
        c.add(_join(path, "default"), f"required when {'validValues' if values else 'validRange'} is defined")
    elif values:
        _validate_valid_values(c, values, _join(path, "validValues"), capacity, default)
    elif rng is not None:
        _validate_range(c, rng, _join(path, "validRange"), capacity, default)


def _validate_valid_values(c: _Collector, values: list[Any], path: str, capacity: Quantity,
                           default: Quantity | None) -> None:
    if len(values) > MAX_VALID_VALUES:
        c.add(path, f"must have at most {MAX_VALID_VALUES} items")
        return
    parsed = [_quantity_field(c, v, f"{path}[{i}]") for i, v in enumerate(values)]
    seen: set[Quantity] = set()
    for i, q in enumerate(parsed):
        if q is None:
            continue
        previous = parsed[i - 1] if i else None
        if previous is not None and previous > q:
            c.add(f"{path}[{i}]", "values must be sorted in ascending order")
        if q > capacity:
            c.add(f"{path}[{i}]", "option is larger than capacity value")
        if q in seen:
            c.add(f"{path}[{i}]", "duplicate value")
        seen.add(q)
    if default is not None and default not in seen:
        c.add(path, "default value is not valid according to the requestPolicy")


def _validate_range(c: _Collector, rng: Mapping[str, Any], path: str, capacity: Quantity,
                    default: Quantity | None) -> None:
    if rng.get("min") is None:
        c.add(_join(path, "min"), "required when validRange is defined")
        return
    lo = _quantity_field(c, rng["min"], _join(path, "min"))
    hi = _quantity_field(c, rng["max"], _join(path, "max")) if rng.get("max") is not None else None
    step = _quantity_field(c, rng["step"], _join(path, "step")) if rng.get("step") is not None else None
    if lo is None:
        return
    if lo > capacity:
        c.add(_join(path, "min"), "min is larger than capacity value")
    if default is not None and default < lo:
        c.add(_join(path, "min"), "default is less than min")
    if hi is not None:
        if lo > hi:
            c.add(_join(path, "max"), "min is larger than max")
        if hi > capacity:
            c.add(_join(path, "max"), "max is larger than capacity value")
        if default is not None and default > hi:
            c.add(_join(path, "max"), "default is more than max")
    if step is not None:
        _validate_step(c, _join(path, "step"), step, lo=lo, hi=hi, capacity=capacity, default=default)


def _validate_step(c: _Collector, path: str, step: Quantity, *, lo: Quantity, hi: Quantity | None,
                   capacity: Quantity, default: Quantity | None) -> None:
    if step.sign() <= 0:
        c.add(path, "must be greater than zero")
        return
    if lo.add(step) > capacity:
        c.add(path, "one step is larger than capacity value")
    # 1.36 does this check on integer values: Quantity.Value(), which rounds fractions up.
    whole_step, whole_min = step.value(), lo.value()
    for label, q in (("default", default), ("max", hi)):
        if q is not None and (q.value() - whole_min) % whole_step != 0:
            c.add(path, f"{label} is not min plus a multiple of step")


def _validate_counter_map(c: _Collector, counters: Any, path: str, limit: int) -> None:
    if not isinstance(counters, Mapping) or not counters:
        c.add(path, "required")
        return
    if len(counters) > limit:
        c.add(path, f"must have at most {limit} items, has {len(counters)}")
        return
    for key, counter in counters.items():
        kpath = f"{path}[{key}]"
        if not is_dns_label(str(key)):
            c.add(kpath, f"counter name {key!r} must be a DNS label ([a-z0-9-], no '_'), e.g. memory-slice-0")
        raw = counter.get("value") if isinstance(counter, Mapping) else None
        if raw is None:
            c.add(_join(kpath, "value"), "required")
        elif read_quantity(raw) is None:
            c.add(_join(kpath, "value"), f"{raw!r} is not a quantity")


def _validate_consumptions(c: _Collector, consumptions: Any, path: str) -> None:
    if consumptions is None:
        return
    if not isinstance(consumptions, list):
        c.add(path, "must be a list")
        return
    if len(consumptions) > MAX_COUNTER_CONSUMPTIONS_PER_DEVICE:
        c.add(path, f"must have at most {MAX_COUNTER_CONSUMPTIONS_PER_DEVICE} items, has {len(consumptions)}")
        return
    seen: set[str] = set()
    for i, consumption in enumerate(consumptions):
        cpath = f"{path}[{i}]"
        set_name = consumption.get("counterSet") if isinstance(consumption, Mapping) else None
        if not set_name:
            c.add(_join(cpath, "counterSet"), "required")
        else:
            if not is_dns_label(str(set_name)):
                c.add(_join(cpath, "counterSet"), f"{set_name!r} must be a DNS label")
            if set_name in seen:
                c.add(cpath, f"duplicate counterSet {set_name!r}")
            seen.add(str(set_name))
        counters = consumption.get("counters") if isinstance(consumption, Mapping) else None
        _validate_counter_map(c, counters, _join(cpath, "counters"), MAX_COUNTERS_PER_CONSUMPTION)


def _validate_counter_sets(c: _Collector, sets: Any, path: str) -> None:
    if not isinstance(sets, list):
        c.add(path, "must be a list")
        return
    if len(sets) > MAX_COUNTER_SETS:
        c.add(path, f"must have at most {MAX_COUNTER_SETS} items, has {len(sets)}: split them over more slices")
        return
    seen: set[str] = set()
    for i, counter_set in enumerate(sets):
        spath = f"{path}[{i}]"
        name = counter_set.get("name") if isinstance(counter_set, Mapping) else None
        if not name:
            c.add(_join(spath, "name"), "required")
        else:
            if not is_dns_label(str(name)):
                c.add(_join(spath, "name"), f"{name!r} must be a DNS label")
            if name in seen:
                c.add(_join(spath, "name"), f"duplicate counter set name {name!r}")
            seen.add(str(name))
        counters = counter_set.get("counters") if isinstance(counter_set, Mapping) else None
        _validate_counter_map(c, counters, _join(spath, "counters"), MAX_COUNTERS_PER_SET)


def _validate_taints(c: _Collector, taints: Any, path: str) -> None:
    if taints is None:
        return
    if not isinstance(taints, list):
        c.add(path, "must be a list")
        return
    if len(taints) > MAX_TAINTS:
        c.add(path, f"must have at most {MAX_TAINTS} items, has {len(taints)}")
        return
    for i, taint in enumerate(taints):
        tpath = f"{path}[{i}]"
        key = taint.get("key") if isinstance(taint, Mapping) else None
        if not key:
            c.add(_join(tpath, "key"), "required")
        else:
            for problem in label_key_problems(str(key)):
                c.add(_join(tpath, "key"), problem)
        value = taint.get("value", "") if isinstance(taint, Mapping) else ""
        if not is_label_value(value):
            c.add(_join(tpath, "value"), f"{value!r} must be a label value")
        effect = taint.get("effect") if isinstance(taint, Mapping) else None
        if effect not in _TAINT_EFFECTS:
            c.add(_join(tpath, "effect"), f"{effect!r} must be one of {', '.join(_TAINT_EFFECTS)}")
