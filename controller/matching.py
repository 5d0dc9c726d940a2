"""Which devices a class or request matches, evaluated once per distinct device shape.

A selector can only see what it reads. Two devices that agree on the driver, on
`allowMultipleAllocations` and on every attribute/capacity the expression reads (its
`CompiledSelector.reads`) give the same result, so outcomes are memoised under that key: a cluster of
10,000 identical GPUs costs one evaluation per expression, not 10,000. A read with a dynamic key
(name "*") widens the key to the whole domain.

Selectors are evaluated the way the scheduler does (dra-api.md §6.2): class selectors, then request
selectors, stopping at the first one that is false or fails, then the capacity request.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from controller.conjuncts import skip_string, split_conjuncts
from controller.inventory import DeviceIndex, InventoryDevice, memory_bytes

if TYPE_CHECKING:
    from driver.cel import AttributeRead, CompiledSelector

Outcome = bool | str  # True/False, or the text of a runtime error


@dataclass(frozen=True)
class Condition:
    """One selector expression and where it comes from."""

    owner: str  # e.g. 'DeviceClass "gpu.tessera.dev" selector 0'
    path: str  # field path of the expression in the object being checked
    expression: str
    selector: CompiledSelector = field(repr=False)


@dataclass(frozen=True)
class CapacityNeed:
    """`capacity.requests[key]` of a request, as written and in base units."""

    key: str
    amount: int
    text: str


@dataclass(frozen=True)
class Requirement:
    """Everything a device must satisfy for one request (or one class on its own)."""

    conditions: tuple[Condition, ...]
    capacity: tuple[CapacityNeed, ...] = ()


@dataclass(frozen=True)
class RuntimeFailure:
    condition: Condition
    device: InventoryDevice
    message: str


@dataclass(frozen=True)
class NearestMiss:
    """The device that fails the fewest parts of a requirement, and what it fails."""

    device: InventoryDevice
    failed: tuple[str, ...]

    def describe(self) -> str:
        more = f" (and {len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
        return f"nearest miss: {self.device.describe()} fails {self.failed[0]}{more}"


@dataclass(frozen=True)
class MatchResult:
    per_node: Mapping[str, int]
    checked: int  # devices looked at
    failures: tuple[RuntimeFailure, ...] = ()
    nearest_miss: NearestMiss | None = None

    @property
    def total(self) -> int:
        return sum(self.per_node.values())

    def best_node(self) -> tuple[str, int] | None:
        if not self.per_node:
            return None
        node = max(sorted(self.per_node), key=lambda n: self.per_node[n])
        return node, self.per_node[node]

    def summary(self) -> str:
        """`12 devices on 2 nodes (node-a: 8, node-b: 4)`."""
        if not self.per_node:
            return f"0 of {self.checked} devices"
        nodes = ", ".join(f"{n}: {c}" for n, c in sorted(self.per_node.items()))
        plural = "s" if len(self.per_node) != 1 else ""
        return f"{self.total} of {self.checked} devices on {len(self.per_node)} node{plural} ({nodes})"


def shape_key(device: InventoryDevice, reads: Iterable[AttributeRead]) -> tuple[Any, ...]:
    """Everything an expression with these reads can observe about the device: the driver,
    allowMultipleAllocations, which keys exist (presence tests, `size()`, iterating keys) and the value
    of every key it reads."""
    parts: list[Any] = [device.driver, device.allow_multiple, device.key_names]
    for r in reads:
        if r.domain == "*" or r.name == "*":
            whole = device.attribute_map(r.domain) if r.kind == "attribute" else device.capacity_map(r.domain)
            parts.append((r.kind, r.domain, "*", whole))
        elif r.kind == "attribute":
            value = device.attribute(r.domain, r.name)
            parts.append((r.domain, r.name, tuple(sorted(value.items())) if value is not None else None))
        else:
            parts.append(("capacity", r.domain, r.name, device.capacity_value(r.domain, r.name)))
    return tuple(parts)


_MAPS = re.compile(r"\bdevice\s*\.\s*(?:attributes|capacity)\b")
_LITERAL_INDEX = re.compile(r"\s*\[\s*(?:\"\"|'')\s*\]")
# after `device.attributes["d"]`: a field, an optional field, or any index (a non-literal key is a "*" read)
_SAFE_AFTER_DOMAIN = re.compile(r"\s*(?:\.\s*\??\s*[A-Za-z_]\w*|\[)")
_IN_BEFORE = re.compile(r"(?:\bin|\bsize\s*\()\s*$")
_BIND_BEFORE = re.compile(r"\bcel\s*\.\s*bind\s*\(\s*[A-Za-z_]\w*\s*,\s*$")


@lru_cache(maxsize=1024)
def dedup_safe(expression: str) -> bool:
    """Whether the expression only uses the device maps in ways the read analysis accounts for.

    Safe: `device.attributes["d"].x`, `["d"]["x"]`, `.?x`, a macro over `["d"]` (its value reads are
    reported with name "*"), `"x" in device.attributes["d"]`, `size(...)`, and binding `["d"]` with
    cel.bind. Anything else (e.g. putting the map into a list literal) could read values the analysis
    does not list, so such an expression is evaluated per device instead of per shape.
    """
    text = _blank_strings(expression)
    for m in _MAPS.finditer(text):
        before = text[: m.start()]
        rest = text[m.end():]
        index = _LITERAL_INDEX.match(rest)
        if index is None:
            if not _IN_BEFORE.search(before):
                return False
            continue
        after = rest[index.end():]
        if _SAFE_AFTER_DOMAIN.match(after) or _IN_BEFORE.search(before):
            continue
        if _BIND_BEFORE.search(before) and after.lstrip().startswith(","):
            continue
        return False
    return True


def _blank_strings(text: str) -> str:
    """The expression with every string literal emptied, so its contents cannot look like code."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        raw = ch in "rRbB" and i + 1 < len(text) and text[i + 1] in "\"'"
        if ch in "\"'" or raw:
            q = i + 1 if raw else i
            end = skip_string(text, q, raw=ch in "rR")
            out.append('""')
            i = end
            continue
        out.append(ch)
        i += 1
    return "".join(out)


class Evaluator:
    """Memoised selector outcomes per (expression, device shape). One per admission request or check run."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, tuple[Any, ...]], Outcome] = {}
        self.evaluations = 0

    def outcome(self, condition: Condition, device: InventoryDevice) -> Outcome:
        from driver.cel import CelRuntimeError, DeviceViewError

        if dedup_safe(condition.expression):
            key = (condition.expression, shape_key(device, condition.selector.reads))
        else:
            key = (condition.expression, (id(device.spec),))
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        self.evaluations += 1
        try:
            result: Outcome = bool(condition.selector.evaluate(device.view))
        except (CelRuntimeError, DeviceViewError) as exc:
            result = str(exc) or type(exc).__name__
        self._memo[key] = result
        return result


def capacity_shortfall(device: InventoryDevice, need: CapacityNeed) -> str | None:
    """Why the device cannot give `need` (None when it can), following the scheduler's rules (§4.1)."""
    entry = device.capacity(need.key)
    if entry is None:
        return f"it has no capacity {need.key!r}"
    value = memory_bytes(str(entry.get("value")))
    if value is None or value < need.amount:
        return f"it has {entry.get('value')} of {need.key}, the request asks {need.text}"
    policy = entry.get("requestPolicy") if device.allow_multiple else None
    if isinstance(policy, Mapping):
        valid_range = policy.get("validRange")
        if isinstance(valid_range, Mapping) and valid_range.get("max") is not None:
            top = memory_bytes(str(valid_range["max"]))
            if top is not None and need.amount > top:
                return f"it gives at most {valid_range['max']} of {need.key} per request, the request asks {need.text}"
        values = policy.get("validValues")
        if isinstance(values, list) and values:
            sizes = [memory_bytes(str(v)) for v in values]
            if not any(s is not None and s >= need.amount for s in sizes):
                return f"its largest {need.key} share is {values[-1]}, the request asks {need.text}"
    return None


def match(requirement: Requirement, index: DeviceIndex, evaluator: Evaluator) -> MatchResult:
    """Count the devices per node that satisfy the requirement; name the nearest miss when none does."""
    per_node: Counter[str] = Counter()
    failures: dict[int, RuntimeFailure] = {}
    for device in index.devices:
        if _passes(requirement, device, evaluator, failures):
            per_node[device.node] += 1
    miss = None
    if not per_node and index.devices:
        miss = nearest_miss(requirement, index, evaluator)
    ordered = tuple(failures[i] for i in sorted(failures))
    return MatchResult(dict(per_node), len(index.devices), ordered, miss)


def _passes(
    requirement: Requirement, device: InventoryDevice, evaluator: Evaluator, failures: dict[int, RuntimeFailure]
) -> bool:
    for i, condition in enumerate(requirement.conditions):
        out = evaluator.outcome(condition, device)
        if out is True:
            continue
        if isinstance(out, str) and i not in failures:
            failures[i] = RuntimeFailure(condition, device, out)
        return False
    return all(capacity_shortfall(device, need) is None for need in requirement.capacity)


def conjunct_conditions(condition: Condition) -> tuple[Condition, ...]:
    """The condition's top-level `&&` parts as conditions of their own (itself when it does not split)."""
    from driver.cel import CelCompileError, compile_selector

    pieces = split_conjuncts(condition.expression)
    if len(pieces) < 2:
        return (condition,)
    out = []
    for piece in pieces:
        try:
            out.append(Condition(condition.owner, condition.path, piece, compile_selector(piece)))
        except CelCompileError:
            return (condition,)
    return tuple(out)


def nearest_miss(requirement: Requirement, index: DeviceIndex, evaluator: Evaluator) -> NearestMiss | None:
    """The first device (in first-fit order) that fails the fewest parts of the requirement."""
    parts = [p for c in requirement.conditions for p in conjunct_conditions(c)]
    best: NearestMiss | None = None
    for device in index.devices:
        failed: list[str] = []
        for part in parts:
            out = evaluator.outcome(part, device)
            if out is True:
                continue
            detail = f" (runtime error: {out})" if isinstance(out, str) else ""
            failed.append(f"`{part.expression}` of {part.owner}{detail}")
            if best is not None and len(failed) >= len(best.failed):
                break
        for need in requirement.capacity:
            reason = capacity_shortfall(device, need)
            if reason:
                failed.append(f"capacity.requests.{need.key}: {reason}")
        if failed and (best is None or len(failed) < len(best.failed)):
            best = NearestMiss(device, tuple(failed))
            if len(failed) == 1:
                break
    return best
