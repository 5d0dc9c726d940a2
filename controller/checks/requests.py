"""The requests of a ResourceClaimSpec as the checks and the multi-card rewrite walk them: every name a
constraint or config may use, and every body (`exactly`, or a `firstAvailable` subrequest) with its path."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def request_names(spec: Obj) -> list[str]:
    """Every name a constraint or config may use: `req`, and `req/sub` for firstAvailable entries."""
    names: list[str] = []
    devices = spec.get("devices")
    for request in as_list(devices.get("requests") if isinstance(devices, dict) else None):
        if not isinstance(request, dict):
            continue
        name = str(request.get("name", ""))
        names.append(name)
        names.extend(f"{name}/{s.get('name')}" for s in as_list(request.get("firstAvailable")) if isinstance(s, dict))
    return names


def request_bodies(request: Obj, path: str) -> list[tuple[str, Obj, str]]:
    """(reference, body, field path) of the request at `path`: its `exactly` as "req", then each
    `firstAvailable` subrequest as "req/sub". The bodies are the request's own dicts, not copies."""
    name = str(request.get("name", ""))
    bodies: list[tuple[str, Obj, str]] = []
    if isinstance(request.get("exactly"), dict):
        bodies.append((name, request["exactly"], f"{path}.exactly"))
    bodies.extend(
        (f"{name}/{sub.get('name', '')}", sub, f"{path}.firstAvailable[{j}]")
        for j, sub in enumerate(as_list(request.get("firstAvailable")))
        if isinstance(sub, dict)
    )
    return bodies


def as_list(value: Any) -> list[Any]:
    """A list field as a list; any other shape is reported where it is checked and read as empty here."""
    return value if isinstance(value, list) else []
