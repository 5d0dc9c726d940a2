"""What a node agent holds on disk, as a value two moments can be compared by.

The fuzz tests check that a refused request changed nothing: every file of the CDI and state
directories, with the checkpoint's claims decoded (the file also records the boot and format), and a
checkpoint or record file that holds nothing counted as no file: a refused request may leave one
behind, and what it holds is what matters. Lock files hold no state and are left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RECORDS = ("fake-mps.json", "mig-instances.json", "fake-timeslice.json")


def snapshot(*dirs: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in dirs:
        if not d.exists():
            continue
        for p in sorted(d.rglob("*")):
            if not p.is_file() or p.name.endswith(".lock"):
                continue
            if p.name == "checkpoint.json" or p.name in RECORDS:
                doc = json.loads(p.read_bytes())
                content = doc.get("claims") if p.name == "checkpoint.json" and isinstance(doc, dict) else doc
                if content:
                    out[str(p)] = content
            else:
                out[str(p)] = p.read_bytes()
    return out
