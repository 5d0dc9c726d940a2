"""`tessera kubelet-plugin`: the node agent kubelet talks to (registration + DRA gRPC, slices, health, metrics)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-name", required=True, help="this node's name (the pool name of its ResourceSlices)")
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument(
        "--simulate",
        metavar="PROFILE",
        help="simulated GPUs: a built-in profile name or a profile YAML path (default: dgx-h100-8)",
    )
    backend.add_argument("--nvml", action="store_true", help="discover the node's real GPUs through NVML")
    parser.add_argument(
        "--simulate-from-node-label", default="", metavar="KEY",
        help="simulated GPUs whose profile is the value of this label on the node (--simulate: for nodes without it)",
    )
    parser.add_argument(
        "--mig-strategy-from-node-label", default="", metavar="KEY",
        help="where the node has this label, its value (none, static, dynamic) overrides --mig-strategy",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, then ~/.kube/config)")
    parser.add_argument(
        "--kubelet-dir", type=Path, default=Path("/var/lib/kubelet"),
        help="kubelet's root directory; sockets go under plugins_registry/ and plugins/ (default: %(default)s)",
    )
    parser.add_argument(
        "--cdi-dir", type=Path, default=Path("/var/run/cdi"),
        help="where per-claim CDI specs are written (default: %(default)s)",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=Path("/var/lib/tessera"),
        help="checkpoint and MPS directories (default: %(default)s)",
    )
    parser.add_argument(
        "--cdi-driver-root", type=Path, default=None,
        help="the host's NVIDIA driver root as this process sees it, mounted into containers through CDI",
    )
    parser.add_argument(
        "--cdi-host-driver-root", default=None, metavar="DIR",
        help="the same driver root as the host sees it, written into CDI specs "
        "(default: --cdi-driver-root; set it when the host's / is mounted elsewhere, e.g. /driver-root)",
    )
    parser.add_argument(
        "--mig-strategy", choices=["none", "static", "dynamic"], default="static",
        help="publish existing MIG instances (static), creatable ones (dynamic) or none (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-addr", default=":9400", metavar="HOST:PORT",
        help="serve /metrics and /healthz here (default: %(default)s)",
    )
    parser.add_argument(
        "--instance-id", default="", metavar="ID",
        help="unique per plugin process (in a DaemonSet: the pod UID); names this process's registration and DRA "
        "sockets so that an upgrade can start the new pod before the old one stops (default: fixed socket names)",
    )
    parser.add_argument(
        "--health-policy", default="", metavar="JSON",
        help="GPU health policy as JSON: {\"ignoredXids\": [13, ...], \"taints\": {\"<event class>\": "
        "{\"effect\": \"NoExecute\", \"clearsOnReset\": true}}} (docs/health.md; default: the built-in policy)",
    )
    parser.add_argument(
        "--cleanup-on-exit", action="store_true",
        help="delete this node's ResourceSlices on SIGTERM (uninstall); by default they stay for the next start",
    )


def run(args: argparse.Namespace) -> int:
    import structlog

    from driver.health import HealthPolicy
    from kubeletplugin.plugin import PluginConfig, PluginConfigError, run_plugin

    try:
        try:
            policy = HealthPolicy.from_mapping(json.loads(args.health_policy) if args.health_policy else None,
                                               "--health-policy")
        except ValueError as exc:  # JSONDecodeError included
            raise PluginConfigError(f"--health-policy: {exc}" if "--health-policy" not in str(exc) else str(exc)) \
                from exc
        config = PluginConfig(
            node_name=args.node_name,
            kubelet_dir=args.kubelet_dir.absolute(),
            cdi_dir=args.cdi_dir.absolute(),
            state_dir=args.state_dir.absolute(),
            cdi_driver_root=args.cdi_driver_root.absolute() if args.cdi_driver_root else None,
            cdi_host_driver_root=args.cdi_host_driver_root,
            simulate=args.simulate,
            nvml=args.nvml,
            mig_strategy=args.mig_strategy,
            metrics_addr=args.metrics_addr,
            cleanup_on_exit=args.cleanup_on_exit,
            kubeconfig=args.kubeconfig,
            instance_id=args.instance_id,
            health_policy=policy,
            simulate_label=args.simulate_from_node_label,
            mig_strategy_label=args.mig_strategy_from_node_label,
        )
    except PluginConfigError as exc:
        structlog.get_logger(__name__).error("invalid kubelet-plugin flags", error=str(exc))
        return 2
    return run_plugin(config)
