"""What the cluster's allocated ResourceClaims hold, booked the way kube-scheduler books it
(controller.cluster.booking: adminAccess results hold nothing, a result with a shareID holds its
consumedCapacity, any other result the whole device). A device that is allocated in either way
consumes its shared counters (MIG memory slices), once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from controller.cluster.booking import Booking, DeviceKey, bookings
from controller.cluster.capacityfit import quantity
from controller.cluster.inventory import DeviceIndex, InventoryDevice, current_pools
from controller.cluster.objects import object_ref
from driver import DRIVER_NAME

Obj = dict[str, Any]
CounterKey = tuple[str, str, str]  # pool, counter set, counter
# A counter amount, exact. Whole amounts (bytes, memory slices: all of them in practice) are kept as int:
# at 1,000 nodes status walks 90,000 MIG placements, and Fraction arithmetic was most of its time.
Amount = int | Fraction


def whole(value: Fraction) -> Amount:
    """The exact amount, as an int when it is whole."""
    return value.numerator if value.denominator == 1 else value


def exact(value: Any) -> Amount:
    """A quantity's value as an exact amount (0 when it does not parse), an int when it is whole."""
    return _exact_text(value) if type(value) is str else _exact(value)


@lru_cache(maxsize=4096)
def _exact_text(text: str) -> Amount:
    # a fleet's counters hold a handful of distinct values ("1", "10Gi"), read 400,000 times at 1,000 nodes;
    # quantity() caches the parse, this also the int conversion (a third of the time left)
    return _exact(text)


def _exact(value: Any) -> Amount:
    q = quantity(value)
    return 0 if q is None else whole(q)


def device_key(device: InventoryDevice) -> DeviceKey:
    return (device.driver, device.pool, str(device.spec.get("name", "")))


def reserved_pods(claim: Obj) -> tuple[str, ...]:
    """`namespace/name` of the pods in the claim's status.reservedFor."""
    namespace = (claim.get("metadata") or {}).get("namespace", "")
    return tuple(
        f"{namespace}/{r.get('name')}"
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if isinstance(r, Mapping) and r.get("resource", "pods") == "pods"
    )


@dataclass(frozen=True)
class Holder:
    """A claim's booking of (part of) a device, with the pods that reserve the claim."""

    claim: str  # namespace/name
    pods: tuple[str, ...]
    booking: Booking

    @property
    def request(self) -> str:
        return self.booking.request

    @property
    def share_id(self) -> str:
        return self.booking.share_id

    @property
    def consumed(self) -> Mapping[str, Fraction]:
        return self.booking.consumed

    def describe(self) -> str:
        """`claim ns/c (pod ns/p)`, or `(not reserved by any pod)`."""
        pods = ", ".join(f"pod {p}" for p in self.pods) if self.pods else "not reserved by any pod"
        return f"claim {self.claim} ({pods})"


@dataclass(frozen=True)
class CounterShort:
    """A shared counter that has too little left for a device: who holds it."""

    counter_set: str
    counter: str
    available: Amount
    needed: Amount
    held_by: tuple[tuple[InventoryDevice, Holder], ...] = ()


class AllocatedState:
    """Who holds what, from the claims' status.allocation; shared counters from the pools' slices."""

    def __init__(self, index: DeviceIndex, slices: Iterable[Obj], claims: Iterable[Obj], *,
                 driver: str = DRIVER_NAME) -> None:
        self.index = index
        self.by_key: dict[DeviceKey, InventoryDevice] = {device_key(d): d for d in index.devices}
        self.holders: dict[DeviceKey, list[Holder]] = {}
        self.dedicated: set[DeviceKey] = set()
        self.shared: dict[DeviceKey, dict[str, Fraction]] = {}
        for claim in claims:
            self._book(claim, driver)
        self.counter_totals: dict[CounterKey, Amount] = {}
        self.pool_counters: dict[str, list[CounterKey]] = {}
        for pool in current_pools(slices, driver=driver):
            for s in pool.slices:
                for counter_set in s["spec"].get("sharedCounters") or ():
                    if not isinstance(counter_set, Mapping):
                        continue
                    for name, counter in (counter_set.get("counters") or {}).items():
                        key = (pool.name, str(counter_set.get("name")), str(name))
                        self.counter_totals[key] = exact((counter or {}).get("value"))
                        self.pool_counters.setdefault(pool.name, []).append(key)
        self.counter_used: dict[CounterKey, Amount] = {}
        self.counter_holders: dict[CounterKey, list[InventoryDevice]] = {}
        self._available: dict[str, dict[CounterKey, Amount]] = {}
        self._consumed: dict[DeviceKey, dict[CounterKey, Amount]] = {}
        self._values: dict[tuple[DeviceKey, str], Fraction] = {}
        self._overdrawn: dict[str, list[CounterKey]] = {}
        self._available_by_set: dict[str, dict[str, dict[str, Amount]]] = {}  # pool -> set -> counter -> left
        for key in set(self.dedicated) | set(self.shared):
            device = self.by_key.get(key)
            if device is None:
                continue
            for ckey, amount in consumed_counters(device).items():
                self.counter_used[ckey] = self.counter_used.get(ckey, 0) + amount
                self.counter_holders.setdefault(ckey, []).append(device)

    def _book(self, claim: Obj, driver: str) -> None:
        ref, pods = object_ref(claim), reserved_pods(claim)
        for booking in bookings(claim, driver):
            key = booking.key
            self.holders.setdefault(key, []).append(Holder(ref, pods, booking))
            if booking.share_id:
                used = self.shared.setdefault(key, {})
                for k, v in booking.consumed.items():
                    used[k] = used.get(k, Fraction(0)) + v
            else:
                self.dedicated.add(key)

    def holders_of(self, device: InventoryDevice) -> list[Holder]:
        return self.holders.get(device_key(device), [])

    def is_allocated(self, device: InventoryDevice) -> bool:
        key = device_key(device)
        return key in self.dedicated or key in self.shared

    def is_dedicated(self, device: InventoryDevice) -> bool:
        """Held whole by a result without a shareID (the allocator's AllocatedDevices)."""
        return device_key(device) in self.dedicated

    def in_use(self, device: InventoryDevice) -> dict[str, Fraction]:
        """Capacity consumed by the shares on the device (the allocator's AggregatedCapacity)."""
        return dict(self.shared.get(device_key(device), {}))

    def capacity_value(self, device: InventoryDevice, key: str) -> Fraction:
        """The value of the device's capacity `key` (0 when it has none), parsed once per snapshot."""
        cached = self._values.get((device_key(device), key))
        if cached is None:
            cached = self._values[(device_key(device), key)] = \
                quantity((device.capacity(key) or {}).get("value")) or Fraction(0)
        return cached

    def used_memory(self, device: InventoryDevice) -> Fraction:
        """Memory held on the device: what its holders' bookings hold (all of it when one holds it whole)."""
        total = Fraction(device.memory or 0)
        return min(total, sum((h.booking.memory(device.memory) for h in self.holders_of(device)), Fraction(0)))

    def counters_available(self, pool: str) -> dict[CounterKey, Amount]:
        """What allocated devices leave of each counter of the pool (computed once per pool)."""
        cached = self._available.get(pool)
        if cached is None:
            cached = self._available[pool] = {k: self.counter_totals[k] - self.counter_used.get(k, 0)
                                              for k in self.pool_counters.get(pool, [])}
            self._overdrawn[pool] = [k for k, v in cached.items() if v < 0]
            by_set = self._available_by_set[pool] = {}
            for (_, counter_set, counter), amount in cached.items():
                by_set.setdefault(counter_set, {})[counter] = amount
        return cached

    def consumed_counters(self, device: InventoryDevice) -> dict[CounterKey, Amount]:
        """consumed_counters, once per device of this snapshot."""
        key = device_key(device)
        cached = self._consumed.get(key)
        if cached is None:
            cached = self._consumed[key] = _consumed_counters(device)
        return cached

    def fits_counters(self, device: InventoryDevice) -> bool:
        """Whether `counter_shortfalls(device)` is empty, found without building it: status asks this of every
        free MIG placement (86,400 at 1,000 DGX nodes), and parsing each one's counters into a dict was most
        of its time. A device that lists one counter set is read straight from its JSON; anything else takes
        the full check."""
        consumes = device.spec.get("consumesCounters")
        if not consumes:
            return True
        if len(consumes) != 1 or type(consumes[0]) is not dict:
            return not self.counter_shortfalls(device)
        pool = device.pool
        self.counters_available(pool)
        if self._overdrawn[pool]:
            return False  # an overdrawn counter of the pool fails every device that consumes counters
        in_set = self._available_by_set[pool].get(str(consumes[0].get("counterSet")))
        if in_set is None:
            return True  # none of its counters is the pool's: counter_shortfalls skips them too
        for name, counter in (consumes[0].get("counters") or {}).items():
            have = in_set.get(str(name))
            if have is not None and exact((counter or {}).get("value")) > have:
                return False
        return True

    def counter_shortfalls(self, device: InventoryDevice,
                           allocating: Mapping[CounterKey, Amount] | None = None) -> list[CounterShort]:
        """checkAvailableCounters: adding the device's counters to those being allocated, does any counter of
        its pool go above what is left? Empty when the device fits (or consumes no counters)."""
        own = self.consumed_counters(device)
        if not own:
            return []
        allocating = allocating or {}
        available_in_pool = self.counters_available(device.pool)
        # every counter of the pool is checked; one neither this device nor the claim uses fails only when the
        # allocated devices already overdraw it
        keys = dict.fromkeys([*own, *(k for k in allocating if k[0] == device.pool), *self._overdrawn[device.pool]])
        shorts = []
        for key in keys:
            if key not in available_in_pool:
                continue
            available = available_in_pool[key]
            needed = allocating.get(key, 0) + own.get(key, 0)
            if available < needed:
                held = tuple((d, h) for d in self.counter_holders.get(key, []) for h in self.holders_of(d))
                shorts.append(CounterShort(key[1], key[2], available, needed, held))
        return shorts


def consumed_counters(device: InventoryDevice) -> dict[CounterKey, Amount]:
    """The counters the device consumes, keyed by (pool, counter set, counter)."""
    return _consumed_counters(device)


def _consumed_counters(device: InventoryDevice) -> dict[CounterKey, Amount]:
    out: dict[CounterKey, Amount] = {}
    for entry in device.spec.get("consumesCounters") or ():
        if type(entry) is not dict and not isinstance(entry, Mapping):
            continue
        counter_set = str(entry.get("counterSet"))
        for name, counter in (entry.get("counters") or {}).items():
            key = (device.pool, counter_set, str(name))
            amount = exact((counter or {}).get("value"))
            out[key] = out[key] + amount if key in out else amount
    return out
