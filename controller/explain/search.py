"""Can these claims be allocated together on this node? The scheduler's search, step by step.

A port of the 1.36 structured allocator's search (k8s.io/dynamic-resource-allocation,
structured/internal/incubating/allocator_incubating.go: allocateOne, allocateDevice, constraint.go)
for the devices of one node: claims in order, requests in order, a firstAvailable request tries its
subrequests in order, each device slot walks the devices in first-fit order (the next slot of the same
request starts after the device the previous one took), and every pick is checked against devices
in use, shared counters, taints, the claim's constraints and capacity, then undone when a later slot
cannot be filled. Quirks are kept: a distinctAttribute constraint remembers one value per request
name, so it compares a new device only with the last one picked for the same request.

The first solution found is the one the scheduler would take on this node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple, Protocol

from controller.checks.claimspec import Constraint
from controller.cluster.booking import DeviceKey
from controller.cluster.capacityfit import capacity_fits, consumption
from controller.cluster.inventory import InventoryDevice
from controller.cluster.taints import untolerated_taint
from controller.explain.requests import RequestSpec
from controller.explain.state import AllocatedState, Amount, CounterKey, device_key, whole

MAX_RESULTS = 32  # AllocationResultsMaxSize
DEADLINE_EVERY = 64  # steps between looks at the clock: a step is about 0.1 ms, a look costs about as much
_ZERO = Fraction(0)
_Fit = tuple[dict[str, Amount] | None, dict[str, Amount]]


class Deadline(Protocol):
    def passed(self) -> bool: ...


class SearchLimit(Exception):
    """The search took more steps than allowed, or its deadline passed (`cut_short`)."""

    def __init__(self, *, cut_short: bool = False) -> None:
        super().__init__("deadline passed" if cut_short else "step budget used up")
        self.cut_short = cut_short


class ConstraintError(Exception):
    """allocationMode All picked a device a constraint refuses: the allocator reports an error."""


@dataclass(frozen=True)
class Alternative:
    """A request (or subrequest) with the devices of this node its selectors accept, in first-fit order."""

    spec: RequestSpec
    devices: tuple[InventoryDevice, ...]


@dataclass(frozen=True)
class ClaimInput:
    ref: str
    groups: tuple[tuple[Alternative, ...], ...]  # per request: its alternatives
    constraints: tuple[Constraint, ...] = ()


@dataclass(frozen=True)
class Pick:
    request: str
    device: InventoryDevice
    consumed: Mapping[str, Fraction] = field(default_factory=dict)  # empty for a whole, exclusive device


@dataclass(frozen=True)
class SearchResult:
    found: bool
    picks: tuple[tuple[Pick, ...], ...] = ()  # per claim; empty when the answer was reused from a like node
    limited: bool = False  # gave up before it knew: the step budget ran out, or the deadline passed
    error: str = ""
    steps: int = 0
    cut_short: bool = False  # the overall deadline stopped it (or it never ran)


def attribute_value(device: InventoryDevice, name: str) -> Mapping[str, Any] | None:
    """lookupAttribute: the fully qualified name, or the bare name when the domain is the device's driver."""
    domain, _, short = name.partition("/")
    if not short:
        return None
    return device.attribute(domain, short)


def typed_value(value: Mapping[str, Any]) -> tuple[str, Any] | None:
    for kind in ("string", "int", "bool", "version"):
        if value.get(kind) is not None:
            return kind, value[kind]
    return None


class _Match:
    def __init__(self, c: Constraint) -> None:
        self.c = c
        self.value: tuple[str, Any] | None = None
        self.n = 0

    def add(self, base: str, sub: str, device: InventoryDevice) -> bool:
        if not self.c.applies(f"{base}/{sub}" if sub else base):
            return True
        raw = attribute_value(device, self.c.attribute)
        typed = typed_value(raw) if raw is not None else None
        if typed is None:
            return False
        if self.n and typed != self.value:
            return False
        if not self.n:
            self.value = typed
        self.n += 1
        return True

    def remove(self, base: str, sub: str, device: InventoryDevice) -> None:
        if self.c.applies(f"{base}/{sub}" if sub else base):
            self.n -= 1


class _Distinct:
    def __init__(self, c: Constraint) -> None:
        self.c = c
        self.values: dict[str, tuple[str, Any]] = {}  # per request name, as the allocator keeps them
        self.n = 0

    def add(self, base: str, sub: str, device: InventoryDevice) -> bool:
        if not self.c.applies(f"{base}/{sub}" if sub else base):
            return True
        raw = attribute_value(device, self.c.attribute)
        typed = typed_value(raw) if raw is not None else None
        if typed is None:
            return False
        if self.n and typed in self.values.values():
            return False
        self.values[base] = typed
        self.n += 1
        return True

    def remove(self, base: str, sub: str, device: InventoryDevice) -> None:
        if self.c.applies(f"{base}/{sub}" if sub else base):
            self.values.pop(base, None)
            self.n -= 1


def _remover(constraint: _Match | _Distinct, spec: RequestSpec, device: InventoryDevice) -> Callable[[], None]:
    return lambda: constraint.remove(spec.base, spec.sub, device)


class Slot(NamedTuple):
    """deviceIndices: which device of which (sub)request of which claim is being filled."""

    claim: int
    request: int
    sub: int = 0
    device: int = 0


class _Search:
    def __init__(self, claims: Sequence[ClaimInput], state: AllocatedState, budget: int, incomplete: bool,
                 deadline: Deadline | None = None) -> None:
        self.claims = claims
        self.state = state
        self.budget = budget
        self.incomplete = incomplete
        self.deadline = deadline
        self.calls = 0
        self.allocating: dict[DeviceKey, set[int]] = {}
        self.capacity: dict[DeviceKey, dict[str, Amount]] = {}
        self.counters: dict[CounterKey, Amount] = {}
        self.constraints = [[_Match(c) if c.kind == "matchAttribute" else _Distinct(c) for c in claim.constraints]
                            for claim in claims]
        self.results: list[list[Pick]] = [[] for _ in claims]
        self._fits: dict[tuple[int, DeviceKey], _Fit] = {}
        # allocationMode All: every selectable device with room, fixed before the search (validateDeviceRequest)
        self.all_devices: dict[tuple[int, int, int], list[InventoryDevice]] = {}
        for ci, claim in enumerate(claims):
            for ri, alternatives in enumerate(claim.groups):
                for si, alt in enumerate(alternatives):
                    if alt.spec.mode != "All":
                        continue
                    if incomplete:
                        raise ConstraintError(f"request {alt.spec.ref} asks for all devices, but a resource pool "
                                              "of this node is being updated")
                    self.all_devices[(ci, ri, si)] = [d for d in alt.devices if self.capacity_fits(alt.spec, d)]

    # -- the allocator's checks -----------------------------------------------------------------
    def in_use(self, key: DeviceKey) -> bool:
        return key in self.state.dedicated or bool(self.allocating.get(key))

    def capacity_fits(self, spec: RequestSpec, device: InventoryDevice) -> bool:
        """CmpRequestOverCapacity with what other claims and this search already hold on the device. What the
        request would consume and what other claims leave free are the same at every step, so they are worked
        out once per request and device; only what this search has taken of the device is added at each step."""
        key = device_key(device)
        fit = self._fits.get((id(spec), key))
        if fit is None:
            fit = self._fits[(id(spec), key)] = self._fit(spec, device, key)
        need, free = fit
        if need is None:
            return False
        taken = self.capacity.get(key)
        if not taken:
            return all(amount <= free[k] for k, amount in need.items())
        return all(amount + taken.get(k, 0) <= free[k] for k, amount in need.items())

    def _fit(self, spec: RequestSpec, device: InventoryDevice, key: DeviceKey) -> _Fit:
        """What the request consumes of the device and what other claims leave of it; (None, {}) when the
        request alone does not fit (a key missing, a request policy broken). Whole numbers are kept as int:
        the search adds them up at every step, and int is much faster than Fraction."""
        if not capacity_fits(device, spec.needs):
            return None, {}
        held = self.state.shared.get(key, {})
        need = {k: whole(v) for k, v in consumption(device, spec.needs).items()}
        free = {k: whole(self.state.capacity_value(device, k) - held.get(k, _ZERO)) for k in need}
        return need, free

    def allocate_device(self, ci: int, spec: RequestSpec, device: InventoryDevice,
                        must: bool) -> Callable[[], None] | None:
        """allocateDevice: take `device` for request `spec` of claim `ci`; the undo, or None when it cannot be
        taken (ConstraintError when `must` and a constraint refuses it)."""
        key = device_key(device)
        if not self._available(ci, spec, key, device.allow_multiple):
            return None
        undo: list[Callable[[], None]] = []

        def rollback() -> None:
            for step in reversed(undo):
                step()

        taken = (self._take_counters(device, key, undo) and untolerated_taint(device, spec.tolerations) is None
                 and self._meet_constraints(ci, spec, device, must, undo))
        if taken and not device.allow_multiple:
            self.allocating.setdefault(key, set()).add(ci)
            undo.append(lambda: self.allocating[key].discard(ci))
        if not taken or not self.capacity_fits(spec, device):
            rollback()
            return None
        consumed = self._take_capacity(spec, device, key, undo) if device.allow_multiple else {}
        self.results[ci].append(Pick(spec.ref, device, {k: Fraction(v) for k, v in consumed.items()}))
        undo.append(lambda: self._drop_last(ci))
        return rollback

    def _available(self, ci: int, spec: RequestSpec, key: DeviceKey, multi: bool) -> bool:
        """Not in use; an admin-access request only avoids a device its own claim already takes."""
        if spec.admin_access:
            return multi or ci not in self.allocating.get(key, set())
        return not self.in_use(key)

    def _take_counters(self, device: InventoryDevice, key: DeviceKey, undo: list[Callable[[], None]]) -> bool:
        """The device's shared counters, unless a share of this card already holds them."""
        own = self.state.consumed_counters(device)
        if not own or (device.allow_multiple and (key in self.state.shared or key in self.capacity)):
            return True
        if self.state.counter_shortfalls(device, self.counters):
            return False
        self._add_counters(own, 1)
        undo.append(lambda: self._add_counters(own, -1))
        return True

    def _meet_constraints(self, ci: int, spec: RequestSpec, device: InventoryDevice, must: bool,
                          undo: list[Callable[[], None]]) -> bool:
        for constraint in self.constraints[ci]:
            if not constraint.add(spec.base, spec.sub, device):
                if must:
                    for step in reversed(undo):
                        step()
                    undo.clear()
                    raise ConstraintError(f"cannot add device {device.ref} because a claim constraint would not "
                                          f"be satisfied ({constraint.c.describe()})")
                return False
            undo.append(_remover(constraint, spec, device))
        return True

    def _take_capacity(self, spec: RequestSpec, device: InventoryDevice, key: DeviceKey,
                       undo: list[Callable[[], None]]) -> dict[str, Amount]:
        """The share's consumed capacity, added to what this search has taken of the card."""
        fit = self._fits.get((id(spec), key)) or self._fit(spec, device, key)  # capacity_fits saw it first
        consumed = fit[0] or {}
        existed = key in self.capacity
        entry = self.capacity.setdefault(key, {})
        for k, v in consumed.items():
            entry[k] = entry.get(k, 0) + v

        def release() -> None:
            for k, v in consumed.items():
                entry[k] -= v
            if not existed:
                self.capacity.pop(key, None)

        undo.append(release)
        return consumed

    def _add_counters(self, own: Mapping[CounterKey, Amount], sign: int) -> None:
        for key, value in own.items():
            self.counters[key] = self.counters.get(key, 0) + sign * value

    def _drop_last(self, ci: int) -> None:
        self.results[ci].pop()

    # -- allocateOne ------------------------------------------------------------------------------
    def allocate_one(self, at: Slot, in_sub: bool, start: int) -> bool:
        """Fill the slot `at` and, recursively, every slot after it; False when no way is left."""
        self.calls += 1
        if self.calls > self.budget:
            raise SearchLimit
        if self.deadline is not None and self.calls % DEADLINE_EVERY == 0 and self.deadline.passed():
            raise SearchLimit(cut_short=True)
        if at.claim >= len(self.claims):
            return True
        claim = self.claims[at.claim]
        if at.request >= len(claim.groups):
            return self.allocate_one(Slot(at.claim + 1, 0), False, 0)
        alternatives = claim.groups[at.request]
        if not alternatives:
            return self.allocate_one(Slot(at.claim, at.request + 1), False, 0)
        if not in_sub and alternatives[0].spec.sub:
            # firstAvailable: the first subrequest that can be allocated (with everything after it) wins
            return any(self.allocate_one(Slot(at.claim, at.request, sub), True, 0)
                       for sub in range(len(alternatives)))
        alt = alternatives[at.sub]
        all_mode = alt.spec.mode == "All"
        devices = self.all_devices[(at.claim, at.request, at.sub)] if all_mode else list(alt.devices)
        if all_mode and not devices:
            return False
        needed = len(devices) if all_mode else alt.spec.count
        if at.device >= needed:
            return self.allocate_one(Slot(at.claim, at.request + 1), False, 0)
        if len(self.results[at.claim]) + needed - at.device > MAX_RESULTS:
            return False
        if all_mode:
            return self._take(at, alt.spec, devices[at.device], in_sub)
        return self._first_fit(at, alt.spec, devices, in_sub, start)

    def _take(self, at: Slot, spec: RequestSpec, device: InventoryDevice, in_sub: bool) -> bool:
        """allocationMode All: this very device, or no solution."""
        undo = self.allocate_device(at.claim, spec, device, must=True)
        if undo is None:
            return False
        if self.allocate_one(at._replace(device=at.device + 1), in_sub, 0):
            return True
        undo()
        return False

    def _first_fit(self, at: Slot, spec: RequestSpec, devices: Sequence[InventoryDevice], in_sub: bool,
                   start: int) -> bool:
        """ExactCount: each device from `start` on that can be taken, then the next slot after it."""
        for position in range(start, len(devices)):
            device = devices[position]
            if not spec.admin_access and self.in_use(device_key(device)):
                continue
            if not self.capacity_fits(spec, device):
                continue
            undo = self.allocate_device(at.claim, spec, device, must=False)
            if undo is None:
                continue
            if self.allocate_one(at._replace(device=at.device + 1), in_sub, position + 1):
                return True
            undo()
        return False


def _too_few(claims: Sequence[ClaimInput]) -> bool:
    """A request none of whose alternatives has as many devices on the node as it asks for can never be
    filled; the allocator would find that out by trying every subset, this says it at once."""
    return any(alternatives and all(a.spec.mode != "All" and a.spec.count > len(a.devices) for a in alternatives)
               for claim in claims for alternatives in claim.groups)


def search(claims: Sequence[ClaimInput], state: AllocatedState, *, budget: int = 50_000,
           incomplete_pool: bool = False, deadline: Deadline | None = None) -> SearchResult:
    """The scheduler's first solution for `claims` on one node (their devices already limited to it), within
    `budget` steps and before `deadline`."""
    if _too_few(claims) and not incomplete_pool:
        return SearchResult(False)
    run = None
    try:
        run = _Search(claims, state, budget, incomplete_pool, deadline)
        found = run.allocate_one(Slot(0, 0), False, 0)
    except SearchLimit as stop:
        return SearchResult(False, limited=True, steps=run.calls if run else 0, cut_short=stop.cut_short)
    except ConstraintError as exc:
        return SearchResult(False, error=str(exc), steps=run.calls if run else 0)
    return SearchResult(found, tuple(tuple(r) for r in run.results) if found else (), steps=run.calls)
