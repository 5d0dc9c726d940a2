"""What the checks know about the cluster when they run: the attribute schema, the live devices (if
any), the DeviceClasses, and sample devices for the static guard check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.checks.findings import DRIVER
from controller.cluster.inventory import DeviceIndex
from controller.cluster.matching import Evaluator
from controller.cluster.schema import AttributeSchema

Obj = dict[str, Any]


@dataclass
class CheckContext:
    """Inputs of one check run. `inventory` None means "no inventory known": matching is skipped rather
    than warning that everything matches nothing. `classes_complete` says whether `classes` is the
    cluster's full set (a class missing from it does not exist) or only what the user gave."""

    schema: AttributeSchema
    prototypes: DeviceIndex
    inventory: DeviceIndex | None = None
    classes: Mapping[str, Obj] = field(default_factory=dict)
    classes_complete: bool = False
    evaluator: Evaluator = field(default_factory=Evaluator)


def is_our_class_name(name: str) -> bool:
    """tessera's own classes are named `gpu.tessera.dev` or `<something>.gpu.tessera.dev`."""
    return name == DRIVER or name.endswith("." + DRIVER)


def class_targets_tessera(obj: Obj) -> bool:
    """A class is ours to check when its name is one of ours, a selector names our driver or domain,
    or it carries a config for our driver."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    if is_our_class_name(name):
        return True
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return False
    selectors, configs = spec.get("selectors"), spec.get("config")
    for selector in selectors if isinstance(selectors, list) else ():
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if isinstance(expression, str) and DRIVER in expression:
            return True
    for config in configs if isinstance(configs, list) else ():
        opaque = config.get("opaque") if isinstance(config, dict) else None
        if isinstance(opaque, dict) and opaque.get("driver") == DRIVER:
            return True
    return False
