"""The two CEL environments Kubernetes compiles DRA selectors in, and the feature gates that shape them.

Kubernetes keeps two environments per CEL use (k8s.io/apiserver pkg/cel/environment):
- **new expressions**: a selector being created, or a DeviceClass whose selectors changed. Options
  behind a feature gate exist only while the gate is on.
- **stored expressions**: a selector already stored (the scheduler, and a DeviceClass update that
  leaves its selectors as they were). Every option the binary knows is present, gates or not, so a
  selector admitted once keeps compiling after a gate is turned off.

For DRA (k8s.io/dynamic-resource-allocation/cel, compile.go) two gates matter:
- DRAConsumableCapacity (beta, on in 1.36) declares `device.allowMultipleAllocations`;
- DRAListTypeAttributes (alpha, off in 1.36) declares `<dyn>.includes(<dyn>)` and types attribute
  values `dyn` instead of `any`, so `exists`/`all` over a list attribute compile. The value type is
  set by the gate in both environments; only the declarations depend on the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

EnvKind = Literal["new", "stored"]
CONSUMABLE_CAPACITY = "DRAConsumableCapacity"
LIST_TYPE_ATTRIBUTES = "DRAListTypeAttributes"
# Kubernetes 1.36's defaults (pkg/features/kube_features.go)
DEFAULT_GATES: Mapping[str, bool] = {CONSUMABLE_CAPACITY: True, LIST_TYPE_ATTRIBUTES: False}


@dataclass(frozen=True)
class CelEnvironment:
    """Which environment compiles a selector, and the cluster's DRA feature gates."""

    kind: EnvKind = "stored"
    consumable_capacity: bool = DEFAULT_GATES[CONSUMABLE_CAPACITY]
    list_type_attributes: bool = DEFAULT_GATES[LIST_TYPE_ATTRIBUTES]

    def __post_init__(self) -> None:
        if self.kind not in ("new", "stored"):
            raise ValueError(f'CEL environment kind must be "new" or "stored", not {self.kind!r}')

    @property
    def declares_allow_multiple_allocations(self) -> bool:
        return self.kind == "stored" or self.consumable_capacity

    @property
    def declares_includes(self) -> bool:
        return self.kind == "stored" or self.list_type_attributes

    @property
    def dyn_attributes(self) -> bool:
        """Attribute values are `dyn` (comprehensions over them compile, a dyn result is accepted)."""
        return self.list_type_attributes

    def new_expressions(self) -> CelEnvironment:
        return replace(self, kind="new")

    def stored_expressions(self) -> CelEnvironment:
        return replace(self, kind="stored")

    def gates(self) -> dict[str, bool]:
        return {CONSUMABLE_CAPACITY: self.consumable_capacity, LIST_TYPE_ATTRIBUTES: self.list_type_attributes}

    def describe(self) -> str:
        gates = ", ".join(f"{name}={str(on).lower()}" for name, on in self.gates().items())
        return f"{self.kind} expressions ({gates})"


STORED = CelEnvironment()
NEW = CelEnvironment(kind="new")


def with_feature_gates(text: str, base: CelEnvironment = STORED) -> CelEnvironment:
    """`base` with gates from "Name=true,Other=false" (the apiserver's --feature-gates syntax).

    Only the gates that change the DRA CEL environment are accepted; anything else is a ValueError
    that names the entry and the gates known.
    """
    gates = base.gates()
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, value = (part.strip() for part in entry.partition("="))
        if name not in gates:
            known = ", ".join(sorted(gates))
            raise ValueError(f"feature gate {name!r} does not change the DRA CEL environment; tessera knows {known}")
        if not sep or value.lower() not in ("true", "false"):
            raise ValueError(f"feature gate {entry!r}: write {name}=true or {name}=false")
        gates[name] = value.lower() == "true"
    return replace(base, consumable_capacity=gates[CONSUMABLE_CAPACITY],
                   list_type_attributes=gates[LIST_TYPE_ATTRIBUTES])
