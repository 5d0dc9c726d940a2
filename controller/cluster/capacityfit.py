"""Whether a request's `capacity.requests` fit on a device, by the scheduler's rules.

This follows the 1.36 allocator's CmpRequestOverCapacity (k8s.io/dynamic-resource-allocation,
structured/internal/incubating/consumable_capacity.go; KEP-5075):

- every requested key must be a capacity of the device, spelled exactly as published;
- every capacity of the device is consumed: a requested amount is rounded up to the request policy
  (validRange min and step, or the next of validValues), an amount not requested is the policy's
  default, or the whole value when there is no policy (a whole-GPU request takes all its memory);
- the consumed amount must be allowed by the policy and, added to what is already in use on the
  device, must stay within its value.

The webhook asks with nothing in use (can this device ever hold the request?); `tessera explain`
asks with what the cluster's allocated claims hold (does it fit now?). Both call `capacity_miss`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from driver.quantity import Quantity, format_bytes

if TYPE_CHECKING:
    from controller.cluster.inventory import InventoryDevice

MissKind = Literal["missing", "policy", "size", "in-use"]
GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class CapacityNeed:
    """`capacity.requests[key]` of a request, as written and in base units."""

    key: str
    amount: int
    text: str


@dataclass(frozen=True)
class CapacityMiss:
    """Why a device cannot give a request its capacity: the key, what kind of miss, and a sentence."""

    key: str
    kind: MissKind
    reason: str
    free: Fraction | None = None  # the device's value minus what is in use (None: key missing)


def quantity(text: Any) -> Fraction | None:
    """A Kubernetes quantity as an exact number, None when it does not parse."""
    return _parse(str(text))


@lru_cache(maxsize=4096)
def _parse(text: str) -> Fraction | None:
    # a cluster's slices repeat a handful of amounts thousands of times

    try:
        return Quantity.parse(text).fraction()
    except ValueError:
        return None


def _round_up(asked: Fraction, policy: Mapping[str, Any]) -> Fraction:
    """calculateConsumedCapacity for a requested amount: rounded up to what the policy hands out."""
    valid_range = policy.get("validRange")
    if isinstance(valid_range, Mapping) and valid_range.get("min") is not None:
        low = quantity(valid_range["min"])
        if low is None:
            return asked
        if asked < low:
            return low
        step = quantity(valid_range["step"]) if valid_range.get("step") is not None else None
        if not step:
            return asked
        # the allocator rounds with integer values (Quantity.Value())
        added = _ceil(asked) - _ceil(low)
        n = added // _ceil(step) + (1 if added % _ceil(step) else 0)
        return Fraction(_ceil(low) + _ceil(step) * n)
    values = policy.get("validValues")
    if isinstance(values, list) and values:
        for text in values:
            value = quantity(text)
            if value is not None and asked <= value:
                return value
    return asked


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


def _violation(consumed: Fraction, policy: Mapping[str, Any]) -> str | None:
    """violatesPolicy: which rule the consumed amount breaks, None when it is allowed."""
    default = quantity(policy["default"]) if policy.get("default") is not None else None
    if default is not None and consumed == default:
        return None
    valid_range = policy.get("validRange")
    if isinstance(valid_range, Mapping):
        top = quantity(valid_range["max"]) if valid_range.get("max") is not None else None
        if top is not None and consumed > top:
            return "max"
        step = quantity(valid_range["step"]) if valid_range.get("step") is not None else None
        low = quantity(valid_range.get("min", "0")) or Fraction(0)
        if step and (_ceil(consumed) - _ceil(low)) % _ceil(step):
            return "step"
        return None
    values = policy.get("validValues")
    if isinstance(values, list) and values and all(quantity(v) != consumed for v in values):
        return "values"
    return None


def consumption(device: InventoryDevice, needs: Iterable[CapacityNeed]) -> dict[str, Fraction]:
    """What the request would consume of each capacity of the device (GetConsumedCapacityFromRequest).

    Keys the device does not have are left out; capacity_miss reports them.
    """
    asked = {n.key: quantity(n.text) for n in needs}
    out: dict[str, Fraction] = {}
    for key, entry in (device.spec.get("capacity") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        value = quantity(entry.get("value")) or Fraction(0)
        policy = entry.get("requestPolicy") if isinstance(entry.get("requestPolicy"), Mapping) else None
        amount = asked.get(str(key))
        if amount is None:
            default = quantity(policy["default"]) if policy and policy.get("default") is not None else None
            out[str(key)] = default if default is not None else value
        else:
            out[str(key)] = _round_up(amount, policy) if policy else amount
    return out


@dataclass(frozen=True)
class _Miss:
    key: str
    kind: MissKind
    amount: Fraction = Fraction(0)  # what the request would consume
    used: Fraction = Fraction(0)
    value: Fraction = Fraction(0)
    rule: str = ""  # the policy rule broken, for kind "policy"


def _first_miss(device: InventoryDevice, needs: tuple[CapacityNeed, ...],
                in_use: Mapping[str, Fraction]) -> _Miss | None:
    for need in needs:
        if device.capacity(need.key) is None:
            return _Miss(need.key, "missing")
    asked = [n.key for n in needs]
    consumed = consumption(device, needs)
    # requested keys first, so the sentence is about what the user asked for
    for key in [k for k in asked if k in consumed] + sorted(k for k in consumed if k not in asked):
        entry = device.capacity(key) or {}
        value = quantity(entry.get("value")) or Fraction(0)
        amount, used = consumed[key], in_use.get(key, Fraction(0))
        policy = entry.get("requestPolicy") if isinstance(entry.get("requestPolicy"), Mapping) else None
        rule = _violation(amount, policy) if policy else None
        if rule is not None:
            return _Miss(key, "policy", amount, used, value, rule)
        if amount + used > value:
            return _Miss(key, "in-use" if used or key not in asked else "size", amount, used, value)
    return None


def capacity_fits(device: InventoryDevice, needs: Iterable[CapacityNeed],
                  in_use: Mapping[str, Fraction] | None = None) -> bool:
    """capacity_miss(...) is None, without writing the sentence (the search asks this at every step)."""
    return _first_miss(device, tuple(needs), in_use or {}) is None


def capacity_miss(
    device: InventoryDevice, needs: Iterable[CapacityNeed], in_use: Mapping[str, Fraction] | None = None
) -> CapacityMiss | None:
    """Why the request's capacity does not fit on the device with `in_use` already consumed; None if it fits."""
    needs = tuple(needs)
    miss = _first_miss(device, needs, in_use or {})
    if miss is None:
        return None
    key = miss.key
    if miss.kind == "missing":
        return CapacityMiss(key, "missing", f"it has no capacity {key!r}")
    texts = {n.key: n.text for n in needs}
    entry = device.capacity(key) or {}
    value_text = str(entry.get("value"))
    free = miss.value - miss.used
    if miss.kind == "policy":
        policy = entry.get("requestPolicy")
        return CapacityMiss(key, "policy", _policy_reason(key, texts.get(key) or format_bytes(miss.amount), miss.rule,
                                                          policy if isinstance(policy, Mapping) else {}), free)
    if key not in texts:
        # not requested: a whole-device request, which takes the whole value
        reason = (f"a request without capacity.requests.{key} takes all {value_text} of {key}, and "
                  f"{format_bytes(miss.used)} of it is in use")
        return CapacityMiss(key, "in-use", reason, free)
    asked = texts[key]
    if miss.amount != quantity(asked):
        asked += f" (rounded up to {format_bytes(miss.amount)} by its request policy)"
    if miss.used:
        reason = (f"it has {value_text} of {key} with {format_bytes(miss.used)} in use ({format_bytes(free)} free), "
                  f"the request asks {asked}")
        return CapacityMiss(key, "in-use", reason, free)
    return CapacityMiss(key, "size", f"it has {value_text} of {key}, the request asks {asked}", free)


def _policy_reason(key: str, asked: str, rule: str, policy: Mapping[str, Any]) -> str:
    if rule == "max":
        top = (policy.get("validRange") or {}).get("max")
        return f"it gives at most {top} of {key} per request, the request asks {asked}"
    if rule == "values":
        values = policy.get("validValues") or []
        return f"its largest {key} share is {values[-1]}, the request asks {asked}"
    step = (policy.get("validRange") or {}).get("step")
    return f"its {key} is handed out in steps of {step}, the request asks {asked}"
