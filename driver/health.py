"""GPU health events, the policy that turns them into device taints, and the per-GPU condition book.

Free of gRPC and Kubernetes clients: sources (NVML events, the simulated event log) produce
`HealthEvent`s, `GpuConditions` folds them into the current conditions of each GPU, and the node agent
publishes those as `taints` on the GPU's devices (driver.slices) and as health on kubelet's stream.

Event classes and what they mean for a GPU:

- xid: an XID error that is not application-caused -> `gpu.tessera.dev/xid`, value the XID
- ecc-double-bit: an uncorrectable ECC error (XID 48) -> `gpu.tessera.dev/ecc-double-bit`
- gpu-lost: the GPU fell off the bus (XID 79, NVML GPU_IS_LOST) -> `gpu.tessera.dev/gpu-lost`
- nvlink-down: an NVLink that NVML reports inactive -> `gpu.tessera.dev/nvlink-down`, value "link-<n>"

How a condition goes away is the class's rule (`TaintRule`): a `reset` event (an operator says the GPU
was reset) clears the classes that clear on reset; a `recovered` event (NVML sees the GPU healthy
again, or one injected on a simulated node) clears the classes that clear on recovery; and a class
with a quiet period clears once no event of it has come for that long. `gpu-lost` never clears on a
reset alone: only a GPU that NVML reaches again is trusted again.

Everything read from a file goes through the checks here first (`parse_event`, `GpuConditions.load_json`):
a time the API cannot store, a value of the wrong type or an oversized text is refused by field, so a
bad line or a damaged saved file costs that entry only, never the node agent.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeGuard

from driver import DRIVER_NAME
from driver.grammars import is_label_value

# Errors an application causes on its own GPU (illegal address, MMU fault from its own kernel, a
# graphics exception, a preempted or killed context): the card is fine, the next pod runs normally.
DEFAULT_IGNORED_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68)
XID_DOUBLE_BIT_ECC = 48
XID_FALLEN_OFF_BUS = 79

TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")

# The latest instant an RFC 3339 `timeAdded` can carry (9999-12-31T23:59:59Z); later ones crash datetime.
MAX_EVENT_TIME = 253_402_300_799
# A time this large in a hand-written event is almost surely milliseconds (it is past the year 5138).
_MILLISECONDS_HINT = 100_000_000_000
MESSAGE_MAX = 1024  # kubelet keeps no more of a health message
VALUE_MAX = 256  # a taint value is cut to 63 characters; anything much longer is not a reason
MAX_XID = 2**32 - 1  # NVML carries the XID in a 32-bit field
MAX_LINK = 1023
DEFAULT_XID_QUIET_S = 600  # a critical XID that does not come back for 10 minutes was transient
MAX_QUIET_S = 30 * 24 * 3600


class EventClass(enum.Enum):
    XID = "xid"
    ECC_DOUBLE_BIT = "ecc-double-bit"
    GPU_LOST = "gpu-lost"
    NVLINK_DOWN = "nvlink-down"
    RESET = "reset"  # not a condition: clears the conditions that clear on reset
    RECOVERED = "recovered"  # not a condition: the GPU is healthy again; clears what clears on recovery

    @classmethod
    def parse(cls, text: str, path: str) -> EventClass:
        for member in cls:
            if member.value == text:
                return member
        choices = ", ".join(m.value for m in cls)
        raise ValueError(f"{path}: unknown health event {text[:64]!r}; one of {choices}")


CONDITION_CLASSES = tuple(c for c in EventClass if c not in (EventClass.RESET, EventClass.RECOVERED))


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_time(value: object, path: str) -> float:
    """`value` as unix seconds the API can store; ValueError naming `path` (and a likely cause) otherwise."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{path}: must be unix seconds (a number), got {_short(value)}")
    if isinstance(value, float) and not math.isfinite(value):  # a huge int is finite, and too big for a float
        raise ValueError(f"{path}: must be a finite number of unix seconds, got {value!r}")
    if not 0 <= value <= MAX_EVENT_TIME:
        hint = "; it looks like milliseconds: divide by 1000" if value > _MILLISECONDS_HINT else ""
        raise ValueError(f"{path}: unix seconds between 0 and {MAX_EVENT_TIME} (year 9999), got {_short(value)}{hint}")
    return float(value)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _text_field(raw: Mapping[str, Any], key: str, default: str, path: str, limit: int) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str):
        raise ValueError(f"{path}.{key}: must be a string, got {_short(value)}")
    if len(value) > limit:
        raise ValueError(f"{path}.{key}: at most {limit} characters, got {len(value)}")
    return value


@dataclass(frozen=True)
class HealthEvent:
    """Something happened to one GPU (by its index on the node)."""

    gpu_index: int
    event: EventClass
    value: str = ""  # the XID, the reason, "link-<n>"; becomes the taint's value. recovered: the class, or ""
    message: str = ""  # for people: kubelet's health message, logs
    time: float = 0.0  # unix seconds when it was observed

    def __post_init__(self) -> None:
        # Every source's events pass here, so no condition can hold a time the publisher cannot write.
        check_time(self.time, "time")


@dataclass(frozen=True)
class TaintRule:
    """What one event class does to the GPU's devices, and what takes it away again."""

    key: str
    effect: str
    clears_on_reset: bool
    clears_on_recovery: bool = True  # a `recovered` report (NVML sees the GPU healthy again) clears it
    clear_after: float = 0.0  # seconds without a new event of the class that clear it; 0: no quiet period


def _default_rules() -> dict[EventClass, TaintRule]:
    return {
        EventClass.XID: TaintRule(f"{DRIVER_NAME}/xid", "NoSchedule", True, True, DEFAULT_XID_QUIET_S),
        EventClass.ECC_DOUBLE_BIT: TaintRule(f"{DRIVER_NAME}/ecc-double-bit", "NoExecute", True, True),
        EventClass.GPU_LOST: TaintRule(f"{DRIVER_NAME}/gpu-lost", "NoExecute", False, True),
        EventClass.NVLINK_DOWN: TaintRule(f"{DRIVER_NAME}/nvlink-down", "NoSchedule", True, True),
    }


RULE_FIELDS = ("effect", "clearsOnReset", "clearsOnRecovery", "clearAfterSeconds")


@dataclass(frozen=True)
class HealthPolicy:
    """Which XIDs count, and the taint each event class puts on a GPU's devices."""

    ignored_xids: frozenset[int] = frozenset(DEFAULT_IGNORED_XIDS)
    rules: Mapping[EventClass, TaintRule] = field(default_factory=_default_rules)

    @classmethod
    def from_mapping(cls, raw: Any, path: str = "health") -> HealthPolicy:
        """The chart's `health` values: {ignoredXids: [..], taints: {<class>: {effect, clearsOnReset,
        clearsOnRecovery, clearAfterSeconds}}}.

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
            if not isinstance(xids, list) or not all(_is_int(x) and x > 0 for x in xids):
                raise ValueError(f"{path}.ignoredXids: must be a list of positive XID numbers, got {xids!r}")
            ignored = frozenset(xids)
        rules = dict(_default_rules())
        taints = raw.get("taints") or {}
        if not isinstance(taints, Mapping):
            raise ValueError(f"{path}.taints: must map an event class to {{{', '.join(RULE_FIELDS)}}}")
        for name, entry in taints.items():
            tpath = f"{path}.taints.{name}"
            cls_ = EventClass.parse(str(name), tpath)
            if cls_ in (EventClass.RESET, EventClass.RECOVERED):
                raise ValueError(f"{tpath}: a {cls_.value} clears taints, it has none of its own")
            if not isinstance(entry, Mapping) or set(entry) - set(RULE_FIELDS):
                raise ValueError(f"{tpath}: must be a mapping with only {', '.join(RULE_FIELDS)}")
            rules[cls_] = _rule_from(cls_, rules[cls_], entry, tpath)
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


def _rule_from(cls_: EventClass, rule: TaintRule, entry: Mapping[str, Any], tpath: str) -> TaintRule:
    effect = entry.get("effect", rule.effect)
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"{tpath}.effect: must be one of {', '.join(TAINT_EFFECTS)}, got {effect!r}")
    flags = {}
    for key, default in (("clearsOnReset", rule.clears_on_reset), ("clearsOnRecovery", rule.clears_on_recovery)):
        flags[key] = entry.get(key, default)
        if not isinstance(flags[key], bool):
            raise ValueError(f"{tpath}.{key}: must be true or false, got {flags[key]!r}")
    quiet = entry.get("clearAfterSeconds", rule.clear_after)
    whole = _is_int(quiet) or (isinstance(quiet, float) and quiet.is_integer())
    if not whole or not 0 <= quiet <= MAX_QUIET_S:
        raise ValueError(f"{tpath}.clearAfterSeconds: must be whole seconds from 0 (no quiet period) to "
                         f"{MAX_QUIET_S} (30 days), got {quiet!r}")
    if cls_ is EventClass.GPU_LOST:
        if flags["clearsOnReset"]:
            raise ValueError(f"{tpath}.clearsOnReset: a GPU that fell off the bus is not cleared by a reset "
                             "report alone; it clears on recovery, once NVML reaches the GPU again")
        if quiet:
            raise ValueError(f"{tpath}.clearAfterSeconds: a lost GPU sends no more events, so a quiet period "
                             "would clear it while the card is still gone; use clearsOnRecovery")
    return replace(rule, effect=str(effect), clears_on_reset=flags["clearsOnReset"],
                   clears_on_recovery=flags["clearsOnRecovery"], clear_after=float(quiet))


@dataclass(frozen=True)
class Condition:
    """A condition a GPU is in, since `since`; `last_seen` is its latest event (quiet periods count from it)."""

    event: EventClass
    value: str
    message: str
    since: float
    last_seen: float = 0.0

    def __post_init__(self) -> None:
        check_time(self.since, "since")
        if not self.last_seen:
            object.__setattr__(self, "last_seen", self.since)


def taint_time(since: float) -> str:
    """`timeAdded` as the apiserver stores it (RFC 3339, whole seconds), so stored and sent compare equal."""
    return datetime.fromtimestamp(int(since), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def taint_value(value: str) -> str:
    """`value` cut into a label value (the API rejects anything else)."""
    cleaned = re.sub(r"[^-A-Za-z0-9_.]", "-", value)[:63].strip("-_.")
    return cleaned if is_label_value(cleaned) else ""


_GPU_KEY = re.compile(r"[0-9]{1,6}\Z")


class GpuConditions:
    """The current conditions of each GPU, folded from events under one policy. Not thread-safe."""

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        self.policy = policy or HealthPolicy()
        self._by_gpu: dict[int, dict[EventClass, Condition]] = {}

    def apply(self, event: HealthEvent) -> bool:
        """Fold one event in; True when any GPU's conditions changed (what is published, not `last_seen`)."""
        current = self._by_gpu.setdefault(event.gpu_index, {})
        if event.event is EventClass.RESET:
            return self._drop(event.gpu_index, lambda c: self.policy.rules[c].clears_on_reset)
        if event.event is EventClass.RECOVERED:
            return self._drop(event.gpu_index, lambda c: self.policy.rules[c].clears_on_recovery
                              and event.value in ("", c.value))
        old = current.get(event.event)
        if old is not None and old.value == event.value:
            # the same condition again keeps its first time (timeAdded stays stable); its quiet period restarts
            if event.time > old.last_seen:
                current[event.event] = replace(old, last_seen=event.time)
            return False
        current[event.event] = Condition(event.event, event.value, event.message, event.time, event.time)
        return True

    def _drop(self, gpu_index: int, clears: Callable[[EventClass], bool]) -> bool:
        current = self._by_gpu.get(gpu_index, {})
        keep = {c: cond for c, cond in current.items() if not clears(c)}
        self._by_gpu[gpu_index] = keep
        return keep != current

    def expire(self, now: float, *, hold: Callable[[int], bool] | None = None) -> list[tuple[int, Condition]]:
        """Drop the conditions whose quiet period has passed at `now`, except on GPUs `hold` keeps; the dropped."""
        gone: list[tuple[int, Condition]] = []
        for index, conds in self._by_gpu.items():
            for cls_, cond in list(conds.items()):
                quiet = self.policy.rules[cls_].clear_after
                if quiet and now - cond.last_seen >= quiet and not (hold is not None and hold(index)):
                    del conds[cls_]
                    gone.append((index, cond))
        return gone

    def active(self, gpu_index: int) -> dict[EventClass, str]:
        """The classes this GPU is in now, with their values (what a source checks for recovery)."""
        return {c: cond.value for c, cond in self._by_gpu.get(gpu_index, {}).items()}

    def merge(self, other: GpuConditions) -> bool:
        """Add the conditions `other` holds and this book lacks; True when any was added."""
        added = False
        for index in other.affected():
            current = self._by_gpu.setdefault(index, {})
            for cond in other.conditions(index):
                if cond.event not in current:
                    current[cond.event] = cond
                    added = True
        return added

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
        return {str(i): [{"event": c.event.value, "value": c.value, "message": c.message, "since": c.since,
                          "lastSeen": c.last_seen}
                         for c in self.conditions(i)] for i in self.affected()}

    def load_json(self, raw: Any, path: str) -> list[str]:
        """Replace the conditions with the valid entries of `to_json()` output; the problems of the others.

        Each problem names the entry's path (`<path>.<gpu>[<n>].since: ...`). ValueError when `raw` is not
        an object at all.
        """
        if not isinstance(raw, Mapping):
            raise ValueError(f"{path}: must be an object mapping GPU index to conditions, got {type(raw).__name__}")
        book: dict[int, dict[EventClass, Condition]] = {}
        problems: list[str] = []
        for key, conds in raw.items():
            if not isinstance(key, str) or not _GPU_KEY.match(key) or not isinstance(conds, list):
                problems.append(f"{path}.{_short(key)}: must be a GPU index mapping to a list of conditions")
                continue
            for j, c in enumerate(conds):
                where = f"{path}.{key}[{j}]"
                try:
                    cond = _condition_from(c, where)
                except ValueError as exc:
                    problems.append(str(exc))
                    continue
                book.setdefault(int(key), {})[cond.event] = cond
        self._by_gpu = book
        return problems

    def counts(self) -> dict[EventClass, int]:
        """How many GPUs are in each condition (metrics)."""
        out: dict[EventClass, int] = dict.fromkeys(CONDITION_CLASSES, 0)
        for conds in self._by_gpu.values():
            for c in conds:
                out[c] += 1
        return out


def _condition_from(c: Any, where: str) -> Condition:
    if not isinstance(c, Mapping):
        raise ValueError(f"{where}: must be an object")
    event_text = c.get("event", "")
    event = EventClass.parse(event_text if isinstance(event_text, str) else repr(event_text), f"{where}.event")
    if event not in CONDITION_CLASSES:
        raise ValueError(f"{where}.event: {event.value} is not a condition")
    since = check_time(c.get("since"), f"{where}.since")
    last_seen = check_time(c.get("lastSeen", since), f"{where}.lastSeen")
    return Condition(event, _text_field(c, "value", "", where, VALUE_MAX),
                     _text_field(c, "message", "", where, MESSAGE_MAX), since, max(since, last_seen))


def parse_event(raw: Any, path: str, *, gpu_indexes: Iterable[int], default_time: float,
                policy: HealthPolicy) -> HealthEvent | None:
    """One injected event, {"gpu": 0, "event": "xid", "xid": 79, "message": ".."}; None when the XID is ignored.

    Raises ValueError naming the field. `gpu` is the GPU's index on the node. A `recovered` event may name
    the `condition` that recovered; without it every condition that clears on recovery goes.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: must be an object like {{\"gpu\": 0, \"event\": \"gpu-lost\"}}, "
                         f"got {type(raw).__name__}")
    gpu = raw.get("gpu")
    known = sorted(gpu_indexes)
    if not _is_int(gpu) or gpu not in known:
        raise ValueError(f"{path}.gpu: must be the index of a GPU on this node ({known}), got {_short(gpu)}")
    event_text = raw.get("event", "")
    if not isinstance(event_text, str):
        raise ValueError(f"{path}.event: must be a string, got {_short(event_text)}")
    event = EventClass.parse(event_text, f"{path}.event")
    when = check_time(raw.get("time", default_time), f"{path}.time")
    message = _text_field(raw, "message", "", path, MESSAGE_MAX)
    if event is EventClass.XID:
        xid = raw.get("xid")
        if not _is_int(xid) or not 0 < xid <= MAX_XID:
            raise ValueError(f"{path}.xid: an xid event needs the XID number (1 to {MAX_XID}), got {_short(xid)}")
        return policy.classify_xid(gpu, xid, time=when, message=message)
    if event is EventClass.NVLINK_DOWN:
        link = raw.get("link")
        if not _is_int(link) or not 0 <= link <= MAX_LINK:
            raise ValueError(f"{path}.link: an nvlink-down event needs the link number (0 to {MAX_LINK}), "
                             f"got {_short(link)}")
        return HealthEvent(gpu, event, f"link-{link}", message or f"NVLink {link} is down", when)
    if event is EventClass.RECOVERED:
        condition = _text_field(raw, "condition", "", path, 64)
        if condition and condition not in {c.value for c in CONDITION_CLASSES}:
            raise ValueError(f"{path}.condition: one of {', '.join(c.value for c in CONDITION_CLASSES)} "
                             f"(or none: every condition that clears on recovery), got {condition!r}")
        return HealthEvent(gpu, event, condition, message or "GPU healthy again", when)
    defaults = {
        EventClass.ECC_DOUBLE_BIT: ("double-bit", "double-bit ECC error"),
        EventClass.GPU_LOST: ("fallen-off-bus", "GPU has fallen off the bus"),
        EventClass.RESET: ("", "GPU reset"),
    }
    value, text = defaults[event]
    reason = _text_field(raw, "reason", value, path, VALUE_MAX)
    return HealthEvent(gpu, event, reason, message or text, when)
