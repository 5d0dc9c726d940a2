"""`tessera status`: per node and GPU, what is allocated (by claim and pod) and what is free."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")


def run(args: argparse.Namespace) -> int:
    return 0
