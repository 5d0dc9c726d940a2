"""What the checks know about the cluster when they run: the attribute schema, the live devices (if
any), the DeviceClasses, and sample devices for the static guard check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.checks.ownership import class_targets_tessera, is_our_class_name
from controller.cluster.inventory import DeviceIndex
from controller.cluster.matching import Evaluator
from controller.cluster.schema import AttributeSchema
from driver.cel.environment import NEW, CelEnvironment

Obj = dict[str, Any]


@dataclass
class CheckContext:
    """Inputs of one check run. `inventory` None means "no inventory known": matching is skipped rather
    than warning that everything matches nothing. `classes_complete` says whether `classes` is the
    cluster's full set (a class missing from it does not exist) or only what the user gave.
    `cel_environment` compiles the selectors being checked: new expressions (with the cluster's DRA
    feature gates) unless they are already stored, as the apiserver decides."""

    schema: AttributeSchema
    samples: DeviceIndex
    inventory: DeviceIndex | None = None
    classes: Mapping[str, Obj] = field(default_factory=dict)
    classes_complete: bool = False
    evaluator: Evaluator = field(default_factory=Evaluator)
    cel_environment: CelEnvironment = NEW

    def targets_tessera(self, class_name: str) -> bool:
        """Whether requests for `class_name` are tessera's to check: one of its class names, or a class
        among `classes` that targets tessera."""
        cls = self.classes.get(class_name)
        return is_our_class_name(class_name) or (cls is not None and class_targets_tessera(dict(cls)))
