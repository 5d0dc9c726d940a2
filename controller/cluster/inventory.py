"""The cluster's tessera devices as the checks see them: a snapshot built from ResourceSlices.

Pools follow the scheduler's rule (GatherPools in k8s.io/dynamic-resource-allocation,
structured/internal/incubating/pools_incubating.go): within a pool only the slices of the highest
`pool.generation` count, so devices of a pool that is being republished are not seen twice. A pool
whose slice count does not match `resourceSliceCount` yet is still used (and listed in
`incomplete_pools`): a warning "matches no device" during a republish would be noise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from controller.cluster.schema import split_qualified
from driver import DRIVER_NAME
from driver.attributes import STANDARD_DOMAIN
from driver.quantity import quantity_bytes_or_none

if TYPE_CHECKING:
    from driver.cel import DeviceView

Obj = dict[str, Any]


T = TypeVar("T")


class cached_property(Generic[T]):
    """functools.cached_property without its lock: Python 3.11's takes one lock shared by every instance on
    each first read, and reading a device's type and product once for each of 92,800 devices cost `tessera
    status` 0.4 s. Two threads reading one device for the first time at once both compute the same value."""

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func = func
        self.name = func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached_property[T]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> T | cached_property[T]:
        if instance is None:
            return self
        # a non-data descriptor: once the value is in the instance's __dict__, Python reads it from there
        value: T = self.func(instance)
        instance.__dict__[self.name] = value
        return value


@dataclass(frozen=True, eq=False)
class InventoryDevice:
    """One published device. `spec` is the device dict from the slice, untouched."""

    node: str
    pool: str
    driver: str
    spec: Mapping[str, Any] = field(repr=False)

    @property
    def name(self) -> str:
        return str(self.spec.get("name", ""))

    @property
    def ref(self) -> str:
        """How a user finds the device: `<node>/<device>`."""
        return f"{self.node}/{self.name}"

    def attribute(self, domain: str, name: str) -> Mapping[str, Any] | None:
        """The attribute's value dict ({"string": ...} etc.) under its qualified or bare key."""
        attrs = self.spec.get("attributes") or {}
        value = attrs.get(f"{domain}/{name}")
        if value is None and domain == self.driver:
            value = attrs.get(name)
        # `type(...) is dict` first: a JSON object always is one, and the ABC check costs ten times as much
        return value if type(value) is dict or isinstance(value, Mapping) else None

    def attribute_map(self, domain: str) -> tuple[tuple[str, str], ...]:
        """Every attribute of one domain, frozen, for keys over dynamic reads."""
        out = []
        for key, value in (self.spec.get("attributes") or {}).items():
            d, n = split_qualified(key, self.driver)
            if domain in ("*", d):
                out.append((f"{d}/{n}", repr(sorted(value.items()) if isinstance(value, Mapping) else value)))
        return tuple(sorted(out))

    def capacity(self, key: str) -> Mapping[str, Any] | None:
        """The capacity entry under its exact published key (the scheduler matches keys literally)."""
        value = (self.spec.get("capacity") or {}).get(key)
        return value if isinstance(value, Mapping) else None

    def capacity_value(self, domain: str, name: str) -> str | None:
        caps = self.spec.get("capacity") or {}
        entry = caps.get(f"{domain}/{name}")
        if entry is None and domain == self.driver:
            entry = caps.get(name)
        return str(entry.get("value")) if isinstance(entry, Mapping) else None

    def capacity_map(self, domain: str) -> tuple[tuple[str, str], ...]:
        out = []
        for key, entry in (self.spec.get("capacity") or {}).items():
            d, n = split_qualified(key, self.driver)
            if domain in ("*", d) and isinstance(entry, Mapping):
                out.append((f"{d}/{n}", str(entry.get("value"))))
        return tuple(sorted(out))

    @cached_property
    def key_names(self) -> tuple[frozenset[str], frozenset[str]]:
        """The attribute and capacity keys the device has: what presence tests, `size()` and iteration
        over keys can observe."""
        return _key_set(self.spec.get("attributes")), _key_set(self.spec.get("capacity"))

    @cached_property
    def kind_key(self) -> tuple[Any, ...]:
        """Everything about the device except the attributes that only identify it (PER_DEVICE_ATTRIBUTES):
        devices of one kind look the same to any selector that reads none of those."""
        attrs = []
        for key, value in (self.spec.get("attributes") or {}).items():
            if split_qualified(key, self.driver) not in PER_DEVICE_ATTRIBUTES:
                attrs.append((key, tuple(sorted(value.items())) if isinstance(value, Mapping) else repr(value)))
        caps = tuple(sorted((k, repr(v)) for k, v in (self.spec.get("capacity") or {}).items()))
        key = (self.driver, self.allow_multiple, self.key_names, tuple(sorted(attrs)), caps)
        # one instance per kind, like the key sets: 93,000 devices keep a reference, not a copy each
        if len(_KIND_KEYS) > 100_000:
            _KIND_KEYS.clear()
        return _KIND_KEYS.setdefault(key, key)

    @cached_property
    def device_type(self) -> str:
        value = self.attribute(DRIVER_NAME, "type")
        return str(value.get("string", "")) if value else ""

    @property
    def allow_multiple(self) -> bool:
        return bool(self.spec.get("allowMultipleAllocations", False))

    @property
    def consumes_counters(self) -> bool:
        return bool(self.spec.get("consumesCounters"))

    @cached_property
    def memory(self) -> int | None:
        value = self.capacity_value(self.driver, "memory")
        return quantity_bytes_or_none(str(value)) if value is not None else None

    @cached_property
    def product_name(self) -> str:
        value = self.attribute(DRIVER_NAME, "productName")
        return str(value.get("string", "")) if value else ""

    def describe(self) -> str:
        """`node-a/gpu-0 (gpu, NVIDIA H100 80GB HBM3)` — what a user needs to recognise the device."""
        facts = ", ".join(x for x in (self.device_type, self.product_name) if x)
        return f"{self.ref} ({facts})" if facts else self.ref

    @cached_property
    def view(self) -> DeviceView:
        """The CEL input for this device, built once."""
        from driver.cel import device_view

        return device_view(self.driver, dict(self.spec))


# Key sets shared by every device with the same keys: a fleet has a handful of device kinds, so 100,000
# devices need a few dozen sets instead of 200,000 (building each one was most of a first review's time).
_KEY_SETS: dict[tuple[str, ...], frozenset[str]] = {}
_KIND_KEYS: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _key_set(keys: Mapping[str, Any] | None) -> frozenset[str]:
    names = tuple(keys or ())
    found = _KEY_SETS.get(names)
    if found is None:
        found = _KEY_SETS.setdefault(names, frozenset(str(k) for k in names))
    return found


# What tells one GPU (or MIG placement) from its twins on other nodes; a kind of device is everything else.
PER_DEVICE_ATTRIBUTES = frozenset({
    (DRIVER_NAME, "uuid"), (DRIVER_NAME, "parentUUID"), (DRIVER_NAME, "nvlinkIsland"),
    (STANDARD_DOMAIN, "pciBusID"), (STANDARD_DOMAIN, "pcieRoot"),
})

_LARGEST_MEMORY = ("largest_memory",)  # its key in DeviceIndex.shape_cache, apart from shape signatures


@dataclass(frozen=True)
class DeviceIndex:
    """Every device of the watched slices, in the scheduler's first-fit order."""

    devices: tuple[InventoryDevice, ...] = ()
    incomplete_pools: tuple[str, ...] = ()
    version: int = 0  # bumped by the cache on every change; lets callers memoise per snapshot
    # groupings of `devices` by what a set of selectors can see (controller.cluster.devicegroups); lives and dies
    # with this snapshot
    shape_cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_slices(cls, slices: Iterable[Obj], *, driver: str | None = DRIVER_NAME, version: int = 0,
                    previous: DeviceIndex | None = None) -> DeviceIndex:
        """Group slices per pool, keep the newest generation, collect the devices.

        `driver=None` keeps every driver's slices (e.g. a file with mixed slices). Devices of `previous` whose
        device dict is the very object in `slices` (an unchanged slice, as the informer keeps it) are reused
        with what they cached (memory, key sets, CEL view): a new snapshot after one node republished does
        not redo the other 92,000 devices of a 1,000-node cluster.
        """
        known = {id(d.spec): d for d in previous.devices} if previous is not None else {}
        devices: list[InventoryDevice] = []
        incomplete: list[str] = []
        for pool in current_pools(slices, driver=driver):
            if not pool.complete:
                incomplete.append(pool.name)
            for s in pool.slices:
                spec = s["spec"]
                for dev in spec.get("devices") or ():
                    if isinstance(dev, Mapping):
                        node = str(dev.get("nodeName") or spec.get("nodeName") or pool.name)
                        same = known.get(id(dev))
                        if same is not None and same.spec is dev and (same.node, same.pool) == (node, pool.name):
                            devices.append(same)
                        else:
                            devices.append(InventoryDevice(node, pool.name, pool.driver, dev))
        return cls(tuple(devices), tuple(incomplete), version)

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({d.node for d in self.devices}))

    def largest_memory(self) -> tuple[int, InventoryDevice] | None:
        """The device with the most `memory` capacity: no share larger than this can ever be placed."""
        # a walk over every device: once per snapshot, not per review (~20 ms at 100,000 GPUs)
        if _LARGEST_MEMORY in self.shape_cache:
            cached: tuple[int, InventoryDevice] | None = self.shape_cache[_LARGEST_MEMORY]
            return cached
        best: tuple[int, InventoryDevice] | None = None
        for dev in self.devices:
            mem = dev.memory
            if mem is not None and (best is None or mem > best[0]):
                best = (mem, dev)
        self.shape_cache[_LARGEST_MEMORY] = best
        return best

    def of_type(self, device_type: str) -> tuple[InventoryDevice, ...]:
        return tuple(d for d in self.devices if d.device_type == device_type)


@dataclass(frozen=True)
class Pool:
    """The slices of one (driver, pool) that count: those of the newest generation, by name."""

    driver: str
    name: str
    slices: tuple[Obj, ...]
    complete: bool  # as many slices as `resourceSliceCount` says


def current_pools(slices: Iterable[Obj], *, driver: str | None = DRIVER_NAME) -> list[Pool]:
    """Group slices per pool and keep the newest generation, pools sorted by (driver, name) as the
    scheduler walks them. `driver=None` keeps every driver's slices."""
    pools: dict[tuple[str, str], list[Obj]] = {}
    for item in slices:
        spec = item.get("spec") if isinstance(item, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        slice_driver = str(spec.get("driver", ""))
        if driver is not None and slice_driver != driver:
            continue
        pool = spec.get("pool") or {}
        pools.setdefault((slice_driver, str(pool.get("name", ""))), []).append(item)
    out = []
    for (slice_driver, pool_name), items in sorted(pools.items()):
        newest = max(_generation(s) for s in items)
        current = sorted((s for s in items if _generation(s) == newest), key=_slice_name)
        want = (current[0]["spec"].get("pool") or {}).get("resourceSliceCount")
        complete = not (isinstance(want, int) and want != len(current))
        out.append(Pool(slice_driver, pool_name, tuple(current), complete))
    return out


def _generation(item: Obj) -> int:
    gen = ((item.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return gen if isinstance(gen, int) else 0


def _slice_name(item: Obj) -> str:
    return str((item.get("metadata") or {}).get("name", ""))
