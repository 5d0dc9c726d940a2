"""`tessera` console script. Each subcommand lives in its own module with `add_arguments` and `run`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from driver.logsetup import configure_logging

# subcommand -> (module, one-line help). Subcommand modules keep heavy imports (gRPC, webhook)
# inside run(), so `tessera inventory` does not pay for them.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "inventory": ("tessera.cmd_inventory", "print this node's GPUs and the ResourceSlices tessera would publish"),
    "publish": ("tessera.cmd_publish", "run the ResourceSlice publisher alone against a kubeconfig"),
    "kubelet-plugin": ("tessera.cmd_kubelet_plugin", "run the node agent kubelet talks to"),
    "controller": ("tessera.cmd_controller", "run the admission webhook and inventory cache"),
    "check": ("tessera.cmd_check", "check DeviceClass/ResourceClaim YAML offline"),
    "explain": ("tessera.cmd_explain", "why a pod or claim does not get its GPUs, step by step"),
    "inject-health-event": ("tessera.cmd_inject", "simulate a GPU health event on a simulated node (demos, tests)"),
    "status": ("tessera.cmd_status", "which claims and pods hold which GPU, and what is free"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--log-format", choices=["auto", "json", "console"], default="auto")
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sp = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sp)
        sp.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return _run(argv)[0]


def _run(argv: Sequence[str] | None) -> tuple[int, ModuleType]:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    rc: int = args._module.run(args)
    return rc, args._module


def entry() -> None:
    """The console script (and `python -m tessera`). A command that read a whole cluster (`EXIT_AT_ONCE` in its
    module) leaves without freeing it: at 1,000 DGX nodes that is a gigabyte of small objects, whose teardown
    took about 0.3 s of a 5 s `tessera status` and did nothing the kernel does not do at exit anyway."""
    rc, module = _run(None)
    if getattr(module, "EXIT_AT_ONCE", False):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    raise SystemExit(rc)
