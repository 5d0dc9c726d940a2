"""The rules the scheduler applies across all slices of one pool, on top of each slice's apiserver rules.

A pool that breaks them is silently unusable (the scheduler skips it or never allocates from it), which is
worse than an error: unique device and counter-set names across slices, resolvable counter references, one
driver, pool name and generation, and a slice count that matches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from driver.quantity import Quantity
from driver.validation import FieldError, read_quantity, validate_slice


def validate_pool(slices: Iterable[Mapping[str, Any]], *, require_name: bool = False) -> list[FieldError]:
    """Per-slice apiserver rules plus the pool-level rules the scheduler applies to all slices of one pool.

    Paths are prefixed with the slice's position (`[2].spec.devices[0].name`).
    """
    items = list(slices)
    errors: list[FieldError] = []
    for i, obj in enumerate(items):
        errors.extend(validate_slice(obj, f"[{i}]", require_name=require_name))
    if not items:
        return [FieldError("", "a pool needs at least one slice, even one without devices")]

    specs: list[Mapping[str, Any]] = [_mapping(obj.get("spec")) for obj in items]
    errors.extend(_consistency_errors(specs))
    counter_sets, name_errors = _pool_names(specs)
    errors.extend(name_errors)
    for i, spec in enumerate(specs):
        for j, device in enumerate(spec.get("devices") or []):
            for k, consumption in enumerate(device.get("consumesCounters") or []):
                where = f"[{i}].spec.devices[{j}].consumesCounters[{k}]"
                errors.extend(_check_reference(consumption, counter_sets, where))
    return errors


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _consistency_errors(specs: list[Mapping[str, Any]]) -> list[FieldError]:
    """Every slice names the first slice's driver, pool and generation, and counts all the pool's slices."""
    errors = []
    pools: list[Mapping[str, Any]] = [_mapping(s.get("pool")) for s in specs]
    first_driver, first_pool = specs[0].get("driver"), pools[0].get("name")
    for i, (spec, pool) in enumerate(zip(specs, pools, strict=True)):
        if spec.get("driver") != first_driver:
            errors.append(FieldError(f"[{i}].spec.driver", f"differs from the pool's driver {first_driver!r}"))
        if pool.get("name") != first_pool:
            errors.append(FieldError(f"[{i}].spec.pool.name", f"differs from the pool name {first_pool!r}"))
        if pool.get("generation") != pools[0].get("generation"):
            errors.append(FieldError(
                f"[{i}].spec.pool.generation",
                f"{pool.get('generation')!r} differs from {pools[0].get('generation')!r}: the scheduler only uses "
                "the slices of the highest generation, so the pool would be incomplete",
            ))
        if pool.get("resourceSliceCount") != len(specs):
            errors.append(FieldError(
                f"[{i}].spec.pool.resourceSliceCount",
                f"is {pool.get('resourceSliceCount')!r} but the pool has {len(specs)} slices: the pool would be "
                "treated as incomplete and none of its devices allocated",
            ))
    return errors


_CounterSets = dict[str, dict[str, Quantity | None]]


def _pool_names(specs: list[Mapping[str, Any]]) -> tuple[_CounterSets, list[FieldError]]:
    """The pool's counter sets by name, and an error for each counter set or device name used twice."""
    errors = []
    counter_sets: _CounterSets = {}
    device_names: dict[str, str] = {}
    for i, spec in enumerate(specs):
        for j, counter_set in enumerate(spec.get("sharedCounters") or []):
            name = counter_set.get("name")
            where = f"[{i}].spec.sharedCounters[{j}].name"
            if name in counter_sets:
                errors.append(FieldError(where, f"counter set {name!r} is defined twice in the pool"))
                continue
            counter_sets[name] = {
                k: read_quantity((v or {}).get("value")) for k, v in (counter_set.get("counters") or {}).items()
            }
        for j, device in enumerate(spec.get("devices") or []):
            name = device.get("name")
            where = f"[{i}].spec.devices[{j}].name"
            if name in device_names:
                errors.append(FieldError(where, f"device {name!r} already published at {device_names[name]}"))
            else:
                device_names[name] = where
    return counter_sets, errors


def _check_reference(consumption: Mapping[str, Any], counter_sets: _CounterSets, path: str) -> list[FieldError]:
    set_name = str(consumption.get("counterSet"))
    if set_name not in counter_sets:
        return [FieldError(f"{path}.counterSet",
                           f"no counter set {set_name!r} in the pool: the pool would be invalid")]
    errors = []
    available = counter_sets[set_name]
    for counter, amount in (consumption.get("counters") or {}).items():
        cpath = f"{path}.counters[{counter}]"
        if counter not in available:
            errors.append(FieldError(cpath, f"counter set {set_name!r} has no counter {counter!r}"))
            continue
        want, have = read_quantity((amount or {}).get("value")), available[counter]
        if want is not None and have is not None and want > have:
            errors.append(FieldError(
                cpath, f"consumes more than counter set {set_name!r} holds: the device could never be allocated"
            ))
    return errors
