"""`tessera inject-health-event`: append one GPU health event to a simulated node's event log.

The node agent of a simulated node tails `<state-dir>/health-events.jsonl` and acts on each event as it
would on the same event from NVML: taints on the GPU's devices, Unhealthy on kubelet's health stream.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from driver.health import CONDITION_CLASSES, EventClass

EVENTS = [c.value for c in CONDITION_CLASSES] + [EventClass.RESET.value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=Path("/var/lib/tessera"),
                        help="the node agent's --state-dir (default: %(default)s)")
    parser.add_argument("--gpu", type=int, required=True, help="the GPU's index on the node (gpu-<index>)")
    parser.add_argument("--event", choices=EVENTS, required=True,
                        help="what happened; reset simulates a GPU reset (clears what the policy clears on reset)")
    parser.add_argument("--xid", type=int, help="the XID number (with --event xid)")
    parser.add_argument("--link", type=int, help="the NVLink number (with --event nvlink-down)")
    parser.add_argument("--message", default="", help="text for kubelet's health message and the logs")


def run(args: argparse.Namespace) -> int:
    import structlog

    from kubeletplugin.healthmonitor import EVENT_LOG_FILE, append_event

    log = structlog.get_logger(__name__)
    event: dict[str, object] = {"gpu": args.gpu, "event": args.event, "time": time.time()}
    if args.event == EventClass.XID.value:
        if args.xid is None:
            log.error("--event xid needs --xid <number>")
            return 2
        event["xid"] = args.xid
    if args.event == EventClass.NVLINK_DOWN.value:
        if args.link is None:
            log.error("--event nvlink-down needs --link <number>")
            return 2
        event["link"] = args.link
    if args.message:
        event["message"] = args.message
    path = args.state_dir / EVENT_LOG_FILE
    try:
        append_event(path, event)
    except OSError as exc:
        log.error("cannot append to the health event log", path=str(path), error=str(exc))
        return 1
    log.info("health event appended", path=str(path), **{k: v for k, v in event.items() if k != "event"},
             event_class=args.event)
    return 0
