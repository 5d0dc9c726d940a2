"""`tessera inventory`: this node's GPUs and the exact ResourceSlices tessera would publish for them."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import Any, TextIO


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--simulate", metavar="PROFILE",
                        help="built-in profile name or path to a profile YAML (default: dgx-h100-8)")
    source.add_argument("--nvml", action="store_true", help="discover the GPUs of this machine through NVML")
    parser.add_argument("--node", metavar="NAME", default=None,
                        help="node (and pool) name to publish under (default: this host's name, lower case)")
    parser.add_argument("--mig-strategy", choices=["none", "static", "dynamic"], default="static",
                        help="how MIG is published (default: static)")
    parser.add_argument("--health-events", metavar="FILE", type=Path, default=None,
                        help="a node agent's health event log (<state-dir>/health-events.jsonl): show the taints "
                        "those events put on the devices (docs/health.md)")
    parser.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table",
                        help="table: devices at a glance; json: a v1 List of the slices; yaml: one document per slice")


def default_node_name() -> str:
    """The node name kubelet would pick by default: the host name in lower case."""
    return socket.gethostname().lower()


def named_slices(slices: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    """The slices with the names the publisher gives them, ready for `kubectl apply -f`."""
    from driver.names import slice_name

    named = []
    for index, original in enumerate(slices):
        obj = dict(original)
        obj["metadata"] = {"name": slice_name(node, index), **obj.get("metadata", {})}
        named.append(obj)
    return named


def _mig_state(gpu: Any) -> str:
    if not gpu.mig_capable:
        return "-"
    state = "enabled" if gpu.mig_enabled else "disabled"
    if gpu.mig_pending != gpu.mig_enabled:
        state += " (pending " + ("enable" if gpu.mig_pending else "disable") + ")"
    return state


def render_table(inventory: Any, slices: list[dict[str, Any]], out: TextIO) -> None:
    """A human view: one row per GPU with the devices published for it, then the slices."""
    from driver.quantity import format_bytes

    devices_by_gpu: dict[int, list[str]] = {}
    device_total = 0
    counter_sets = 0
    for obj in slices:
        counter_sets += len(obj["spec"].get("sharedCounters") or [])
        for device in obj["spec"].get("devices") or []:
            device_total += 1
            index = int(device["name"].split("-")[1])
            devices_by_gpu.setdefault(index, []).append(device["name"])

    out.write(f"node {inventory.node_name}  source {inventory.source}  driver {inventory.driver_version}  "
              f"CUDA {inventory.cuda_driver_version}\n\n")
    header = ("GPU", "PRODUCT", "MEMORY", "NVLINK ISLAND", "MIG", "DEVICES")
    rows = []
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        names = devices_by_gpu.get(gpu.index, [])
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
        memory = format_bytes(gpu.memory_bytes, approximate=True)
        rows.append((str(gpu.index), gpu.product_name, memory, gpu.nvlink_island,
                     _mig_state(gpu), shown or "(not published)"))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")
    tainted = [(d["name"], t)
               for obj in slices for d in obj["spec"].get("devices") or [] for t in d.get("taints") or []]
    if tainted:
        out.write("\nHEALTH TAINTS\n")
        for name, t in tainted:
            out.write(f"{name}  {t['key']}={t['value']}:{t['effect']}  since {t.get('timeAdded', '-')}\n")
    out.write(f"\n{len(slices)} ResourceSlice(s), {device_total} device(s), {counter_sets} counter set(s) in pool "
              f"{inventory.node_name}; -o yaml prints them\n")


def health_taints(path: Path, gpu_indexes: list[int]) -> dict[int, list[dict[str, str]]]:
    """The taints a node agent would publish after the events in its log; ValueError names the bad line."""
    import time

    from driver.health import GpuConditions, parse_event

    book = GpuConditions()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the health event log: {exc.strerror or exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            raw = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"{where}: not valid JSON: {exc}") from exc
        event = parse_event(raw, where, gpu_indexes=gpu_indexes, default_time=time.time(), policy=book.policy)
        if event is not None:
            book.apply(event)
    book.expire(time.time())  # what the agent publishes now: transient XIDs past their quiet period are gone
    return book.taints_by_gpu()


def run(args: argparse.Namespace) -> int:
    from driver.discovery import load_inventory
    from driver.errors import DiscoveryError
    from driver.slices import SliceBuildError, build_slices

    node = args.node or default_node_name()
    try:
        inventory = load_inventory(node, simulate=args.simulate, nvml=args.nvml)
        taints = (health_taints(args.health_events, [g.index for g in inventory.gpus])
                  if args.health_events else None)
        slices = named_slices(build_slices(inventory, mig_strategy=args.mig_strategy, taints=taints), node)
    except (DiscoveryError, SliceBuildError, ValueError) as exc:
        sys.stderr.write(f"tessera inventory: {exc}\n")
        return 1

    if args.output == "json":
        document = {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": slices}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    elif args.output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump_all(slices, sort_keys=False, explicit_start=True))
    else:
        render_table(inventory, slices, sys.stdout)
    return 0
