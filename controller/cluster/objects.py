"""Kubernetes objects as the apiserver sends them (JSON dicts): how tessera names them.

The informer keys its cache with `object_ref`, `tessera explain` names claims and pods with it, and the
admission webhook and `tessera check` name the object they judge with `display_name`, which falls back
to `generateName` (a claim created from a template has no name yet when it is reviewed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def object_ref(obj: Mapping[str, Any]) -> str:
    """`namespace/name`, or `name` for a cluster-scoped object."""
    meta = _meta(obj)
    name = str(meta.get("name", ""))
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


def display_name(obj: Mapping[str, Any]) -> str:
    """`object_ref`, with `generateName` standing in for a name not given yet, and `<no name>` when neither is."""
    meta = _meta(obj)
    name = str(meta.get("name") or meta.get("generateName") or "<no name>")
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


def by_name(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Cluster-scoped objects (DeviceClasses) keyed by metadata.name."""
    return {str(_meta(o).get("name", "")): o for o in objects}
