"""Device shapes: devices that no selector of a given set can tell apart, grouped once.

A selector can only see what it reads. Two devices that agree on the driver, on
`allowMultipleAllocations`, on which attribute/capacity keys exist (presence tests, `size()`,
iterating keys) and on the value of every key the expressions read (their `CompiledSelector.reads`)
give the same result, so one of them stands for all. A read with a dynamic key (name "*") widens the
key to the whole domain. The grouping of an index under one set of reads is cached on the index, so
the next review against the same inventory walks shapes, not devices: a cluster of 10,000 identical
GPUs costs one evaluation per expression and, after the first review, no per-device work at all.

An expression that uses the device maps in a way the read analysis cannot follow (e.g. putting
`device.attributes["d"]` into a list literal) is not deduplicated: every device is its own shape.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from controller.cluster.celtext import skip_string
from controller.cluster.inventory import PER_DEVICE_ATTRIBUTES, DeviceIndex, InventoryDevice

if TYPE_CHECKING:
    from driver.cel import CompiledSelector

ReadKey = tuple[str, str, str]  # (kind, domain, name); name "*" for a dynamic key
MAX_CACHED_GROUPINGS = 256


def read_keys(selector: CompiledSelector) -> tuple[ReadKey, ...]:
    return tuple(sorted({(r.kind, r.domain, r.name) for r in selector.reads}))


def shape_key(device: InventoryDevice, reads: Iterable[ReadKey], capacity_keys: Iterable[str] = ()) -> tuple[Any, ...]:
    """Everything expressions with these reads (and a capacity request for these keys) can observe."""
    parts: list[Any] = [device.driver, device.allow_multiple, device.key_names]
    for kind, domain, name in reads:
        if domain == "*" or name == "*":
            whole = device.attribute_map(domain) if kind == "attribute" else device.capacity_map(domain)
            parts.append((kind, domain, "*", whole))
        elif kind == "attribute":
            value = device.attribute(domain, name)
            parts.append((domain, name, tuple(sorted(value.items())) if value is not None else None))
        else:
            parts.append(("capacity", domain, name, device.capacity_value(domain, name)))
    for key in capacity_keys:
        parts.append(("request", key, repr(device.capacity(key))))
    return tuple(parts)


@dataclass(frozen=True)
class Shape:
    """Devices that look the same to a set of selectors: the first of them (in first-fit order) stands
    for all, `per_node` counts them."""

    device: InventoryDevice
    per_node: Mapping[str, int]


def shapes(
    index: DeviceIndex,
    expressions: Sequence[tuple[str, CompiledSelector]],
    *,
    capacity_keys: Sequence[str] = (),
    extra_reads: Sequence[ReadKey] = (),
) -> tuple[Shape, ...]:
    """Group the index's devices by what `expressions` (and a capacity request for `capacity_keys`) can see."""
    per_device = any(not dedup_safe(text) or (not selector.reads and _mentions_maps(text))
                     for text, selector in expressions)
    reads = tuple(sorted({k for _, selector in expressions for k in read_keys(selector)} | set(extra_reads)))
    return group(index, (per_device, reads, tuple(sorted(set(capacity_keys)))))


Signature = tuple[bool, tuple[ReadKey, ...], tuple[str, ...]]  # (per device, reads, capacity keys)


def group(index: DeviceIndex, signature: Signature) -> tuple[Shape, ...]:
    """The index's devices grouped by what a signature's reads can see, cached on the index."""
    cached = index.shape_cache.get(signature)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    per_device, reads, capacity_keys = signature
    groups: dict[Any, tuple[InventoryDevice, Counter[str]]] = {}
    known_kinds = index.shape_cache.get(_KINDS)
    if known_kinds is not None and not per_device and _kinds_suffice(reads):
        # a few hundred kinds stand for 100,000 devices; they come in first-fit order of their first device
        for device, nodes in known_kinds:
            kind_entry = groups.setdefault(shape_key(device, reads, capacity_keys), (device, Counter()))
            kind_entry[1].update(nodes)
    else:
        for i, device in enumerate(index.devices):
            key = i if per_device else shape_key(device, reads, capacity_keys)
            entry = groups.get(key)
            if entry is None:
                entry = groups[key] = (device, Counter())
            entry[1][device.node] += 1
    result = tuple(Shape(device, dict(nodes)) for device, nodes in groups.values())
    if len(index.shape_cache) >= MAX_CACHED_GROUPINGS:
        index.shape_cache.clear()
    index.shape_cache[signature] = result
    return result


_KINDS = ("kinds",)  # its key in DeviceIndex.shape_cache, apart from signatures


def prepare_kinds(index: DeviceIndex) -> None:
    """Group the index's devices by kind (InventoryDevice.kind_key), once, so later groupings by any reads
    that see no per-device attribute walk kinds instead of devices. The controller's warmer calls it."""
    if _KINDS in index.shape_cache:
        return
    kinds: dict[Any, tuple[InventoryDevice, Counter[str]]] = {}
    for device in index.devices:
        entry = kinds.get(device.kind_key)
        if entry is None:
            entry = kinds[device.kind_key] = (device, Counter())
        entry[1][device.node] += 1
    index.shape_cache[_KINDS] = tuple((device, dict(nodes)) for device, nodes in kinds.values())


def _kinds_suffice(reads: Iterable[ReadKey]) -> bool:
    # a dynamic key or a per-device attribute can tell twins apart: then only the devices themselves will do
    return all(name != "*" and domain != "*" and (kind != "attribute" or (domain, name) not in PER_DEVICE_ATTRIBUTES)
               for kind, domain, name in reads)


def signatures(index: DeviceIndex) -> list[Signature]:
    """The groupings reviews asked of this snapshot: what to prepare on the next one before a review needs it."""
    return [k for k in list(index.shape_cache) if isinstance(k, tuple) and len(k) == 3 and isinstance(k[0], bool)]


def _mentions_maps(expression: str) -> bool:
    # No reads listed, yet the maps are mentioned: they are used in a way the analysis could not name.
    return bool(_MAPS.search(_blank_strings(expression)))


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
        raw = ch in "rRbB" and i + 1 < len(text) and text[i + 1] in "\"'" and not (i and (text[i - 1].isalnum()
                                                                                         or text[i - 1] == "_"))
        if ch in "\"'" or raw:
            q = i + 1 if raw else i
            out.append('""')
            i = skip_string(text, q, raw=ch in "rR")
            continue
        out.append(ch)
        i += 1
    return "".join(out)
