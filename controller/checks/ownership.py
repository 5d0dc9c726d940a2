"""Which DeviceClasses are tessera's: by name, by a selector naming its driver, or by a config for it.
The checks judge only these; `tessera explain` uses the same rule."""

from __future__ import annotations

from typing import Any

from driver import DRIVER_NAME

Obj = dict[str, Any]


def is_our_class_name(name: str) -> bool:
    """tessera's own classes are named `gpu.tessera.dev` or `<something>.gpu.tessera.dev`."""
    return name == DRIVER_NAME or name.endswith("." + DRIVER_NAME)


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
        if isinstance(expression, str) and DRIVER_NAME in expression:
            return True
    for config in configs if isinstance(configs, list) else ():
        opaque = config.get("opaque") if isinstance(config, dict) else None
        if isinstance(opaque, dict) and opaque.get("driver") == DRIVER_NAME:
            return True
    return False
