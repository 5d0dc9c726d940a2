"""GPU health events, the policy that turns them into device taints, and the per-GPU condition book.

Free of gRPC and Kubernetes clients: sources (NVML events, the simulated event log) produce
`HealthEvent`s, `GpuConditions` folds them into the current conditions of each GPU, and the node agent
publishes those as `taints` on the GPU's devices (driver.slices) and as health on kubelet's stream.

Event classes and what they mean for a GPU:

- xid: an XID error that is not application-caused -> `gpu.tessera.dev/xid`, value the XID
- ecc-double-bit: an uncorrectable ECC error (XID 48) -> `gpu.tessera.dev/ecc-double-bit`
- gpu-lost: the GPU fell off the bus (XID 79, NVML GPU_IS_LOST) -> `gpu.tessera.dev/gpu-lost`
- nvlink-down: an NVLink that NVML reports inactive -> `gpu.tessera.dev/nvlink-down`, value "link-<n>"

A `reset` event (a GPU reset) clears every condition whose rule says `clearsOnReset`; `gpu-lost` never
clears: a GPU that left the bus is not trusted again until the node agent restarts on a re-discovered card.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from driver import DRIVER_NAME
from driver.grammars import is_label_value

# Errors an application causes on its own GPU (illegal address, MMU fault from its own kernel, a
# graphics exception, a preempted or killed context): the card is fine, the next pod runs normally.
DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68)
XID_DOUBLE_BIT_ECC = 48
XID_FALLEN_OFF_BUS = 79

TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


class EventClass(enum.Enum):
    XID = "xid"
    ECC_DOUBLE_BIT = "ecc-double-bit"
    GPU_LOST = "gpu-lost"
    NVLINK_DOWN = "nvlink-down"
    RESET = "reset"  # not a condition: clears the conditions that clear on reset

    @classmethod
    def parse(cls, text: str, path: str) -> EventClass:
        for member in cls:
            if member.value == text:
                return member
        choices = ", ".join(m.value for m in cls)
        raise ValueError(f"{path}: unknown health event {text!r}; one of {choices}")


CONDITION_CLASSES = tuple(c for c in EventClass if c is not EventClass.RESET)


@dataclass(frozen=True)
class HealthEvent:
    """Something happened to one GPU (by its index on the node)."""

    gpu_index: int
    event: EventClass
    value: str = ""  # the XID, the reason, "link-<n>"; becomes the taint's value
    message: str = ""  # for people: kubelet's health message, logs
    time: float = 0.0  # unix seconds when it was observed


@dataclass(frozen=True)
class TaintRule:
    """What one event class does to the GPU's devices."""

    key: str
    effect: str
    clears_on_reset: bool


def _default_rules() -> dict[EventClass, TaintRule]:
    return {
        EventClass.XID: TaintRule(f"{DRIVER_NAME}/xid", "NoSchedule", True),
        EventClass.ECC_DOUBLE_BIT: TaintRule(f"{DRIVER_NAME}/ecc-double-bit", "NoExecute", True),
        EventClass.GPU_LOST: TaintRule(f"{DRIVER_NAME}/gpu-lost", "NoExecute", False),
        EventClass.NVLINK_DOWN: TaintRule(f"{DRIVER_NAME}/nvlink-down", "NoSchedule", True),
    }


@dataclass(frozen=True)
class HealthPolicy:
    """Which XIDs count, and the taint each event class puts on a GPU's devices."""

    ignored_xids: frozenset[int] = frozenset(DEFAULT_IGNORED_XIDS)
    rules: Mapping[EventClass, TaintRule] = field(default_factory=_default_rules)

    @classmethod
    def from_mapping(cls, raw: Any, path: str = "health") -> HealthPolicy:
        """The chart's `health` values: {ignoredXids: [..], taints: {<class>: {effect, clearsOnReset}}}.

        Raises ValueError naming the field and what it accepts.
        """
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError(f"{path}: must be a mapping with ignoredXids and taints")
        unknown = set(raw) - {"ignoredXids", "taints"}
        if unknown:
            raise ValueError(f"{path}: unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                             "known: ignoredXids, taints")
        ignored = frozenset(DEFAULT_IGNORED_XIDS)
        if "ignoredXids" in raw:
            xids = raw["ignoredXids"]
            if not isinstance(xids, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                     for x in xids):
                raise ValueError(f"{path}.ignoredXids: must be a list of positive XID numbers, got {xids!r}")
            ignored = frozenset(xids)
        rules = dict(_default_rules())
        taints = raw.get("taints") or {}
        if not isinstance(taints, Mapping):
            raise ValueError(f"{path}.taints: must map an event class to {{effect, clearsOnReset}}")
        for name, entry in taints.items():
            tpath = f"{path}.taints.{name}"
            cls_ = EventClass.parse(str(name), tpath)
            if cls_ is EventClass.RESET:
                raise ValueError(f"{tpath}: a reset clears taints, it has none of its own")
            if not isinstance(entry, Mapping) or set(entry) - {"effect", "clearsOnReset"}:
                raise ValueError(f"{tpath}: must be a mapping with only effect and clearsOnReset")
            rule = rules[cls_]
            effect = entry.get("effect", rule.effect)
            if effect not in TAINT_EFFECTS:
                raise ValueError(f"{tpath}.effect: must be one of {', '.join(TAINT_EFFECTS)}, got {effect!r}")
            clears = entry.get("clearsOnReset", rule.clears_on_reset)
            if not isinstance(clears, bool):
                raise ValueError(f"{tpath}.clearsOnReset: must be true or false, got {clears!r}")
            if cls_ is EventClass.GPU_LOST and clears:
                raise ValueError(f"{tpath}.clearsOnReset: a GPU that fell off the bus is never cleared by a "
                                 "reset; restart the node agent once the card is back")
            rules[cls_] = replace(rule, effect=str(effect), clears_on_reset=clears)
        return cls(ignored_xids=ignored, rules=rules)

    def classify_xid(self, gpu_index: int, xid: int, *, time: float, message: str = "") -> HealthEvent | None:
        """The event an XID stands for, or None for an application-caused one on the ignore list."""
        if xid in self.ignored_xids:
            return None
        if xid == XID_FALLEN_OFF_BUS:
            return HealthEvent(gpu_index, EventClass.GPU_LOST, "fallen-off-bus",
                               message or "GPU has fallen off the bus (XID 79)", time)
        if xid == XID_DOUBLE_BIT_ECC:
            return HealthEvent(gpu_index, EventClass.ECC_DOUBLE_BIT, "double-bit",
                               message or "double-bit ECC error (XID 48)", time)
        return HealthEvent(gpu_index, EventClass.XID, str(xid), message or f"critical XID {xid}", time)


@dataclass(frozen=True)
class Condition:
    """A condition a GPU is in, since `since`."""

    event: EventClass
    value: str
    message: str
    since: float


def taint_time(since: float) -> str:
    """`timeAdded` as the apiserver stores it (RFC 3339, whole seconds), so stored and sent compare equal."""
    return datetime.fromtimestamp(int(since), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def taint_value(value: str) -> str:
    """`value` cut into a label value (the API rejects anything else)."""
    cleaned = re.sub(r"[^-A-Za-z0-9_.]", "-", value)[:63].strip("-_.")
    return cleaned if is_label_value(cleaned) else ""


class GpuConditions:
    """The current conditions of each GPU, folded from events under one policy. Not thread-safe."""

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        self.policy = policy or HealthPolicy()
        self._by_gpu: dict[int, dict[EventClass, Condition]] = {}

    def apply(self, event: HealthEvent) -> bool:
        """Fold one event in; True when any GPU's conditions changed."""
        current = self._by_gpu.setdefault(event.gpu_index, {})
        if event.event is EventClass.RESET:
            keep = {c: cond for c, cond in current.items() if not self.policy.rules[c].clears_on_reset}
            changed = keep != current
            self._by_gpu[event.gpu_index] = keep
            return changed
        old = current.get(event.event)
        if old is not None and old.value == event.value:
            return False  # the same condition again keeps its first time (timeAdded stays stable)
        current[event.event] = Condition(event.event, event.value, event.message, event.time)
        return True

    def conditions(self, gpu_index: int) -> list[Condition]:
        return sorted(self._by_gpu.get(gpu_index, {}).values(), key=lambda c: c.event.value)

    def affected(self) -> list[int]:
        """Indexes of the GPUs that have at least one condition."""
        return sorted(i for i, conds in self._by_gpu.items() if conds)

    def taints(self, gpu_index: int) -> list[dict[str, str]]:
        """The taints every device of this GPU carries, in a stable order."""
        out: list[dict[str, str]] = []
        for cond in self.conditions(gpu_index):
            rule = self.policy.rules[cond.event]
            out.append({"key": rule.key, "value": taint_value(cond.value), "effect": rule.effect,
                        "timeAdded": taint_time(cond.since)})
        return out

    def taints_by_gpu(self) -> dict[int, list[dict[str, str]]]:
        return {i: self.taints(i) for i in self.affected()}

    def message(self, gpu_index: int) -> str:
        """kubelet's health message for this GPU's devices; empty while the GPU is healthy."""
        conds = self.conditions(gpu_index)
        if not conds:
            return ""
        return "tessera: " + "; ".join(f"{c.event.value}: {c.message or c.value}" for c in conds)

    def to_json(self) -> dict[str, Any]:
        """The conditions as a JSON object, for a node agent that must keep them across restarts."""
        return {str(i): [{"event": c.event.value, "value": c.value, "message": c.message, "since": c.since}
                         for c in self.conditions(i)] for i in self.affected()}

    def load_json(self, raw: Any, path: str) -> None:
        """Replace the conditions with `to_json()` output; ValueError naming the field when it is not that."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"{path}: must be an object mapping GPU index to conditions")
        book: dict[int, dict[EventClass, Condition]] = {}
        for key, conds in raw.items():
            if not str(key).isdigit() or not isinstance(conds, list):
                raise ValueError(f"{path}.{key}: must be a GPU index mapping to a list of conditions")
            for j, c in enumerate(conds):
                where = f"{path}.{key}[{j}]"
                if not isinstance(c, Mapping):
                    raise ValueError(f"{where}: must be an object")
                event = EventClass.parse(str(c.get("event", "")), f"{where}.event")
                if event is EventClass.RESET:
                    raise ValueError(f"{where}.event: reset is not a condition")
                since = c.get("since")
                if not isinstance(since, int | float) or isinstance(since, bool):
                    raise ValueError(f"{where}.since: must be unix seconds")
                book.setdefault(int(key), {})[event] = Condition(event, str(c.get("value", "")),
                                                                 str(c.get("message", "")), float(since))
        self._by_gpu = book

    def counts(self) -> dict[EventClass, int]:
        """How many GPUs are in each condition (metrics)."""
        out: dict[EventClass, int] = dict.fromkeys(CONDITION_CLASSES, 0)
        for conds in self._by_gpu.values():
            for c in conds:
                out[c] += 1
        return out


def parse_event(raw: Any, path: str, *, gpu_indexes: Iterable[int], default_time: float,
                policy: HealthPolicy) -> HealthEvent | None:
    """One injected event, {"gpu": 0, "event": "xid", "xid": 79, "message": ".."}; None when the XID is ignored.

    Raises ValueError naming the field. `gpu` is the GPU's index on the node.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: must be an object like {{\"gpu\": 0, \"event\": \"gpu-lost\"}}")
    gpu = raw.get("gpu")
    known = sorted(gpu_indexes)
    if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu not in known:
        raise ValueError(f"{path}.gpu: must be the index of a GPU on this node ({known}), got {gpu!r}")
    event = EventClass.parse(str(raw.get("event", "")), f"{path}.event")
    when = raw.get("time", default_time)
    if not isinstance(when, int | float) or isinstance(when, bool):
        raise ValueError(f"{path}.time: must be unix seconds, got {when!r}")
    message = raw.get("message", "")
    if not isinstance(message, str):
        raise ValueError(f"{path}.message: must be a string")
    if event is EventClass.XID:
        xid = raw.get("xid")
        if not isinstance(xid, int) or isinstance(xid, bool) or xid <= 0:
            raise ValueError(f"{path}.xid: an xid event needs the XID number, got {xid!r}")
        return policy.classify_xid(gpu, xid, time=float(when), message=message)
    if event is EventClass.NVLINK_DOWN:
        link = raw.get("link")
        if not isinstance(link, int) or isinstance(link, bool) or link < 0:
            raise ValueError(f"{path}.link: an nvlink-down event needs the link number, got {link!r}")
        return HealthEvent(gpu, event, f"link-{link}", message or f"NVLink {link} is down", float(when))
    defaults = {
        EventClass.ECC_DOUBLE_BIT: ("double-bit", "double-bit ECC error"),
        EventClass.GPU_LOST: ("fallen-off-bus", "GPU has fallen off the bus"),
        EventClass.RESET: ("", "GPU reset"),
    }
    value, text = defaults[event]
    reason = raw.get("reason", value)
    if not isinstance(reason, str):
        raise ValueError(f"{path}.reason: must be a string")
    return HealthEvent(gpu, event, reason, message or text, float(when))
