"""`tessera kubelet-plugin`: the node agent kubelet talks to (registration + DRA gRPC, slices, health, metrics).

Its flags are derived from kubeletplugin.pluginconfig.PluginConfig, where each default is written once.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kubeletplugin.pluginconfig import add_arguments as add_config_flags

    add_config_flags(parser)


def run(args: argparse.Namespace) -> int:
    import structlog

    from kubeletplugin.plugin import run_plugin
    from kubeletplugin.pluginconfig import PluginConfigError, config_from_args

    try:
        config = config_from_args(args)
    except PluginConfigError as exc:
        structlog.get_logger(__name__).error("invalid kubelet-plugin flags", error=str(exc))
        return 2
    return run_plugin(config)
