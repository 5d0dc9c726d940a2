"""`tessera inject-health-event`: append one GPU health event to a node's event log.

The node agent tails `<state-dir>/health-events.jsonl` and acts on each event as it would on the same
event from NVML: taints on the GPU's devices, Unhealthy on kubelet's health stream; `reset` and
`recovered` take conditions away again. The command checks what the agent would refuse before writing:
a GPU index the agent does not have (it records its GPUs in the state dir), an XID or link number that
cannot be one, a log others could write.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from driver.health import CONDITION_CLASSES, MAX_LINK, MAX_XID, MESSAGE_MAX, EventClass

EVENTS = [c.value for c in CONDITION_CLASSES] + [EventClass.RESET.value, EventClass.RECOVERED.value]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, default=Path("/var/lib/tessera"),
                        help="the node agent's --state-dir (default: %(default)s)")
    parser.add_argument("--gpu", type=int, required=True, help="the GPU's index on the node (gpu-<index>)")
    parser.add_argument("--event", choices=EVENTS, required=True,
                        help="what happened; reset simulates a GPU reset (clears what the policy clears on reset), "
                             "recovered says the GPU is healthy again (clears what the policy clears on recovery)")
    parser.add_argument("--xid", type=int, help="the XID number (with --event xid)")
    parser.add_argument("--link", type=int, help="the NVLink number (with --event nvlink-down)")
    parser.add_argument("--condition", choices=[c.value for c in CONDITION_CLASSES],
                        help="with --event recovered: the condition that recovered (default: every one that "
                             "clears on recovery)")
    parser.add_argument("--message", default="", help="text for kubelet's health message and the logs")


def _event(args: argparse.Namespace, gpus: list[int]) -> dict[str, object] | str:
    """The event line to append, or what is wrong with the flags."""
    if args.gpu not in gpus:
        return f"--gpu {args.gpu}: the node agent has no such GPU; its GPUs are {gpus}"
    event: dict[str, object] = {"gpu": args.gpu, "event": args.event, "time": time.time()}
    problem = _kind_fields(args, event)
    if problem:
        return problem
    if len(args.message) > MESSAGE_MAX:
        return f"--message: at most {MESSAGE_MAX} characters (kubelet keeps no more), got {len(args.message)}"
    if args.message:
        event["message"] = args.message
    return event


def _kind_fields(args: argparse.Namespace, event: dict[str, object]) -> str:
    """Add --xid, --link or --condition to `event` where its kind takes them; what is wrong, or ""."""
    for flag, kind in (("xid", EventClass.XID), ("link", EventClass.NVLINK_DOWN),
                       ("condition", EventClass.RECOVERED)):
        if getattr(args, flag) is not None and args.event != kind.value:
            return f"--{flag} goes only with --event {kind.value}"
    if args.event == EventClass.XID.value:
        if args.xid is None:
            return "--event xid needs --xid <number>"
        if not 0 < args.xid <= MAX_XID:
            return f"--xid {args.xid}: an XID is a number from 1 to {MAX_XID}"
        event["xid"] = args.xid
    if args.event == EventClass.NVLINK_DOWN.value:
        if args.link is None:
            return "--event nvlink-down needs --link <number>"
        if not 0 <= args.link <= MAX_LINK:
            return f"--link {args.link}: an NVLink number is from 0 to {MAX_LINK}"
        event["link"] = args.link
    if args.condition is not None:
        event["condition"] = args.condition
    return ""


def run(args: argparse.Namespace) -> int:
    import structlog

    from kubeletplugin.healthlog import EVENT_LOG_FILE, append_event, read_gpu_indexes

    log = structlog.get_logger(__name__)
    try:
        gpus = read_gpu_indexes(args.state_dir)
    except ValueError as exc:
        log.error("cannot tell which GPUs the node has", error=str(exc))
        return 1
    event = _event(args, gpus)
    if isinstance(event, str):
        log.error("nothing appended", error=event)
        return 2
    path = args.state_dir / EVENT_LOG_FILE
    try:
        append_event(path, event)
    except OSError as exc:
        log.error("cannot append to the health event log", path=str(path), error=str(exc))
        return 1
    log.info("health event appended", path=str(path), **{k: v for k, v in event.items() if k != "event"},
             event_class=args.event)
    return 0
