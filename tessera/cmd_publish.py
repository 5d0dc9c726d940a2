"""`tessera publish`: run the ResourceSlice publisher alone, without the kubelet plugin around it."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import TYPE_CHECKING

from driver.shutdown import stop_on_signals, wait_for_stop

if TYPE_CHECKING:
    from kubeletplugin.publisher import Publisher


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE", default=None,
                        help="kubeconfig to use (default: in-cluster config, then ~/.kube/config)")
    parser.add_argument("--node-name", required=True, metavar="NAME", help="node whose pool is published")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--simulate", metavar="PROFILE",
                        help="built-in profile name or path to a profile YAML (default: dgx-h100-8)")
    source.add_argument("--nvml", action="store_true", help="discover the GPUs of this machine through NVML")
    parser.add_argument("--mig-strategy", choices=["none", "static", "dynamic"], default="static")
    parser.add_argument("--once", action="store_true",
                        help="publish once and exit (exit status 1 when the apiserver refused)")
    parser.add_argument("--cleanup", action="store_true",
                        help="delete this node's slices on exit; with --once, only delete them")
    parser.add_argument("--resync-interval", type=float, default=300.0, metavar="SECONDS",
                        help="full resync period, a safety net behind the watch (default: 300)")


def run(args: argparse.Namespace) -> int:
    import structlog

    from driver.discovery import load_inventory
    from driver.errors import DiscoveryError
    from driver.kubeapi import RealKubeAPI
    from driver.slices import SliceBuildError, build_slices
    from kubeletplugin.publisher import Publisher

    log = structlog.get_logger("tessera.publish")
    try:
        inventory = load_inventory(args.node_name, simulate=args.simulate, nvml=args.nvml)
        slices = build_slices(inventory, mig_strategy=args.mig_strategy)
    except (DiscoveryError, SliceBuildError) as exc:
        sys.stderr.write(f"tessera publish: {exc}\n")
        return 1

    api = RealKubeAPI(args.kubeconfig)
    publisher = Publisher(api, args.node_name, slices, resync_interval=args.resync_interval)

    if args.once:
        if args.cleanup:
            return _delete_all(publisher)
        if not publisher.sync_once():
            sys.stderr.write(f"tessera publish: {publisher.last_error}\n")
            return 1
        log.info("published", node=args.node_name, generation=publisher.generation, slices=len(slices))
        return 0

    stop = threading.Event()
    stop_on_signals(stop)
    publisher.start()
    wait_for_stop(stop)
    publisher.stop(cleanup=False)
    return _delete_all(publisher) if args.cleanup else 0


def _delete_all(publisher: Publisher) -> int:
    from driver.kubeapi import ApiError

    try:
        publisher.delete_all()
    except ApiError as exc:
        sys.stderr.write(f"tessera publish: cannot delete slices: {exc}\n")
        return 1
    return 0
