"""Every search one `tessera explain` runs, under one deadline, and each distinct one only once.

The scheduler's search (search.py) is exponential in the worst case: a claim that makes it backtrack can
use up its step budget on every node. Two things keep explain's answer quick however large the cluster:

- **One search per node shape.** Nodes alike for the claims being placed (the same devices in the same
  first-fit order, with the same capacity, taints, counters and allocations, and constraint attributes
  equal in the same pattern) give the same answer, so a search is keyed by that shape and run once. A
  fleet of identical, idle nodes costs one search, not one per node; a search attribution repeats (the
  claim alone, then with the pod's other claims) is not run twice either.
- **An overall deadline.** Once it passes, a running search stops and later ones are not started; the
  explanation then says that it was cut short and how much was left unsearched. Searching the nodes may
  use the first two thirds of it, so that the searches that say why (attribution.py) still get a turn.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.cluster.booking import DeviceKey
from controller.cluster.inventory import InventoryDevice
from controller.explain.search import ClaimInput, SearchResult, attribute_value, search, typed_value
from controller.explain.state import AllocatedState, device_key

BUDGET_S = 3.0  # the default search deadline: with reading the cluster, explain answers within about 5 s
FOR_ATTRIBUTION = 1 / 3  # of the budget, kept from the node searches for the searches that say why
STEPS_PER_SEARCH = 20_000  # one search; the scheduler itself stops after DRASchedulerFilterTimeout (10 s)


@dataclass
class SearchStats:
    """What the searches of one explain cost, and whether the deadline cut them short."""

    budget_s: float = BUDGET_S
    runs: int = 0  # searches run
    reused: int = 0  # answered by an earlier search of a node with the same shape
    steps: int = 0
    stopped: int = 0  # searches the deadline stopped while running
    skipped: int = 0  # searches not started because the deadline had passed
    skipped_nodes: set[str] = field(default_factory=set)

    @property
    def cut_short(self) -> bool:
        return bool(self.stopped or self.skipped)

    def note(self) -> str:
        """What the deadline left undone, for the explanation ("" when nothing)."""
        if not self.cut_short:
            return ""
        nodes = sorted(self.skipped_nodes)
        shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
        where = f" (nodes not searched in full: {shown})" if nodes else ""
        return (f"the search budget of {self.budget_s:g} s ran out: {self.stopped + self.skipped} of "
                f"{self.runs + self.reused + self.skipped} searches were stopped or not started{where}; the "
                "answer covers what was searched, --search-budget gives it more time")


class Searches:
    """Runs the searches of one explain against one snapshot (`state`)."""

    def __init__(self, state: AllocatedState, incomplete_nodes: set[str], *, budget_s: float = BUDGET_S,
                 steps: int = STEPS_PER_SEARCH, clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.incomplete_nodes = incomplete_nodes
        self.steps = steps
        self._clock = clock
        self._deadline = clock() + budget_s
        self._done: dict[Hashable, SearchResult] = {}
        self.stats = SearchStats(budget_s)

    def run(self, claims: Sequence[ClaimInput], node: str, *, placing: bool = True) -> SearchResult:
        """search(claims) on `node`, or the answer for a node of the same shape, or a cut-short answer.
        `placing` searches (does it fit on this node?) stop early enough to leave attribution its share."""
        until = _Until(self._clock, self._deadline - (self.stats.budget_s * FOR_ATTRIBUTION if placing else 0.0))
        if until.passed():
            self.stats.skipped += 1
            self.stats.skipped_nodes.add(node)
            return SearchResult(False, limited=True, cut_short=True)
        incomplete = node in self.incomplete_nodes
        key = node_shape(claims, self.state, incomplete)
        done = self._done.get(key)
        if done is not None:
            self.stats.reused += 1
            return SearchResult(done.found, (), done.limited)
        result = search(claims, self.state, budget=self.steps, incomplete_pool=incomplete, deadline=until)
        self.stats.runs += 1
        self.stats.steps += result.steps
        if result.cut_short:
            self.stats.stopped += 1
            self.stats.skipped_nodes.add(node)
        elif not result.error:  # an error names this node's device: not an answer for another node
            self._done[key] = result
        return result


    def attribute(self, claims: Sequence[ClaimInput], node: str) -> SearchResult:
        """A search that says why (a claim without a constraint): it may use the whole budget."""
        return self.run(claims, node, placing=False)


@dataclass(frozen=True)
class _Until:
    """A deadline for one search (search.Deadline)."""

    clock: Callable[[], float]
    at: float

    def passed(self) -> bool:
        return self.clock() >= self.at


def node_shape(claims: Sequence[ClaimInput], state: AllocatedState, incomplete: bool) -> Hashable:
    """What the search's answer for `claims` on one node depends on, with the node's own names left out.

    Devices are numbered in the order the search meets them and pools in the order their devices come;
    the values of constraint attributes (a uuid is different on every node) become the number of their
    first appearance, since a constraint only compares them for equality. Everything else the search
    reads is kept as it is."""
    attributes = sorted({c.attribute for claim in claims for c in claim.constraints})
    numbered: dict[DeviceKey, int] = {}
    pools: dict[str, int] = {}
    values: dict[str, dict[tuple[str, Any], int]] = {a: {} for a in attributes}
    devices: list[Hashable] = []

    def number(device: InventoryDevice) -> int:
        key = device_key(device)
        if key not in numbered:
            numbered[key] = len(numbered)
            devices.append(_device_shape(device, state, pools, attributes, values))
        return numbered[key]

    requests: list[Hashable] = []
    for claim in claims:
        requests.append(("claim", claim.constraints))
        for group in claim.groups:
            requests.append(("request", len(group)))
            for alt in group:
                spec = alt.spec
                requests.append((spec.ref, spec.mode, spec.count, spec.admin_access, spec.needs,
                                 _json(spec.tolerations), tuple(number(d) for d in alt.devices)))
    counters = tuple(sorted((pools[pool], name[1], name[2], amount)
                            for pool in pools for name, amount in state.counters_available(pool).items()))
    return (incomplete, tuple(requests), tuple(devices), counters)


def _device_shape(device: InventoryDevice, state: AllocatedState, pools: dict[str, int], attributes: list[str],
                  values: dict[str, dict[tuple[str, Any], int]]) -> Hashable:
    pool = pools.setdefault(device.pool, len(pools))
    compared = []
    for name in attributes:
        raw = attribute_value(device, name)
        typed = typed_value(raw) if raw is not None else None
        seen = values[name]
        compared.append(None if typed is None else seen.setdefault((typed[0], str(typed[1])), len(seen)))
    counters = tuple(sorted((key[1], key[2], amount) for key, amount in state.consumed_counters(device).items()))
    return (pool, device.allow_multiple, _json(device.spec.get("capacity")), _json(device.spec.get("taints")),
            counters, tuple(compared), state.is_dedicated(device), tuple(sorted(state.in_use(device).items())))


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
