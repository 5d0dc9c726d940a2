"""Which devices a class or request matches, evaluated once per distinct device shape
(controller.cluster.devicegroups), the way the scheduler filters (k8s.io/dynamic-resource-allocation,
structured/internal/incubating/allocator_incubating.go): class selectors, then request
selectors, stopping at the first one that is false or fails, then the capacity request. When nothing
matches, the nearest miss is the device failing the fewest top-level `&&` parts.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controller.cluster.capacityfit import CapacityNeed, capacity_miss
from controller.cluster.celtext import split_conjuncts
from controller.cluster.devicegroups import Shape, dedup_safe, read_keys, shape_key, shapes
from controller.cluster.inventory import DeviceIndex, InventoryDevice

if TYPE_CHECKING:
    from driver.cel import CompiledSelector

Outcome = bool | str  # True/False, or the text of a runtime error


@dataclass(frozen=True)
class Condition:
    """One selector expression and where it comes from."""

    owner: str  # e.g. 'DeviceClass "gpu.tessera.dev" selector 0'
    path: str  # field path of the expression in the object being checked
    expression: str
    selector: CompiledSelector = field(repr=False)


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


class EvaluationSkipped(Exception):
    """cel-cpp's iteration budget stopped a selector on some device: its outcome is unknown to tessera.

    The checks that need it (guard, runtime failures, matching) skip that selector and say so."""

    def __init__(self, condition: Condition, message: str) -> None:
        super().__init__(message)
        self.condition = condition
        self.message = message


class ReviewDeadlineExceeded(Exception):
    """The review's deadline passed before its evaluations were done; no further selector is run."""

    def __init__(self, evaluations: int) -> None:
        super().__init__(f"deadline passed after {evaluations} selector evaluations")
        self.evaluations = evaluations


class Evaluator:
    """Memoised selector outcomes per (expression, device shape). One per admission request or check run.

    `deadline` (time.monotonic()) is checked before every evaluation: past it, ReviewDeadlineExceeded.
    An evaluation cel-cpp stops at its iteration budget raises EvaluationSkipped, or, with
    `budget_as_outcome` (the explain CLI, which shows outcomes rather than judging them), becomes an
    outcome text saying it was not evaluated.
    """

    def __init__(self, deadline: float | None = None, *, budget_as_outcome: bool = False) -> None:
        self._memo: dict[tuple[str, Any], Outcome] = {}
        self._skipped: dict[tuple[str, Any], str] = {}
        self.evaluations = 0
        self.deadline = deadline
        self.budget_as_outcome = budget_as_outcome

    def outcome(self, condition: Condition, device: InventoryDevice) -> Outcome:
        from driver.cel import CelBudgetExceeded, CelRuntimeError, DeviceViewError

        if dedup_safe(condition.expression):
            key: tuple[str, Any] = (condition.expression, shape_key(device, read_keys(condition.selector)))
        else:
            key = (condition.expression, id(device.spec))
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        if key in self._skipped:
            raise EvaluationSkipped(condition, self._skipped[key])
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise ReviewDeadlineExceeded(self.evaluations)
        self.evaluations += 1
        try:
            result: Outcome = bool(condition.selector.evaluate(device.view))
        except (CelRuntimeError, DeviceViewError) as exc:
            result = str(exc) or type(exc).__name__
        except CelBudgetExceeded as exc:
            if not self.budget_as_outcome:
                self._skipped[key] = exc.message
                raise EvaluationSkipped(condition, exc.message) from None
            result = f"not evaluated by tessera: {exc.message}"
        self._memo[key] = result
        return result


def capacity_shortfall(device: InventoryDevice, need: CapacityNeed) -> str | None:
    """Why the device can never give `need` (None when it can), by the scheduler's rules
    (controller.cluster.capacityfit)."""
    miss = capacity_miss(device, (need,))
    return miss.reason if miss else None


def match(requirement: Requirement, index: DeviceIndex, evaluator: Evaluator) -> MatchResult:
    """Count the devices per node that satisfy the requirement; name the nearest miss when none does."""
    per_node: Counter[str] = Counter()
    failures: dict[int, RuntimeFailure] = {}
    groups = _shapes(requirement, index)
    for shape in groups:
        if _passes(requirement, shape.device, evaluator, failures):
            per_node.update(shape.per_node)
    miss = None
    if not per_node and index.devices:
        miss = nearest_miss(requirement, groups, evaluator)
    ordered = tuple(failures[i] for i in sorted(failures))
    return MatchResult(dict(per_node), len(index.devices), ordered, miss)


def _shapes(requirement: Requirement, index: DeviceIndex) -> tuple[Shape, ...]:
    expressions = [(c.expression, c.selector) for c in requirement.conditions]
    return shapes(index, expressions, capacity_keys=[n.key for n in requirement.capacity])


def _passes(
    requirement: Requirement, device: InventoryDevice, evaluator: Evaluator, failures: dict[int, RuntimeFailure]
) -> bool:
    stop = first_failure(requirement.conditions, device, evaluator)
    if stop is not None:
        i, out = stop
        if isinstance(out, str) and i not in failures:
            failures[i] = RuntimeFailure(requirement.conditions[i], device, out)
        return False
    return capacity_miss(device, requirement.capacity) is None


def first_failure(
    conditions: tuple[Condition, ...], device: InventoryDevice, evaluator: Evaluator
) -> tuple[int, Outcome] | None:
    """The first condition the device does not pass, with its outcome (False or a runtime error), in the
    scheduler's order: it stops at the first selector that is false or fails. None when all pass."""
    for i, condition in enumerate(conditions):
        out = evaluator.outcome(condition, device)
        if out is not True:
            return i, out
    return None


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


def nearest_miss(requirement: Requirement, groups: Iterable[Shape], evaluator: Evaluator) -> NearestMiss | None:
    """The first device (in first-fit order) that fails the fewest parts of the requirement.

    Each part of an expression reads a subset of what the whole reads, so the shapes of the whole
    requirement are fine-grained enough for its parts.
    """
    parts = [p for c in requirement.conditions for p in conjunct_conditions(c)]
    best: NearestMiss | None = None
    for shape in groups:
        device = shape.device
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
