"""The --feature-gates flag of `tessera check` and `tessera controller`: the cluster's DRA gates that
shape the CEL environment selectors compile in (driver.cel.environment)."""

from __future__ import annotations

import argparse

from driver.cel.environment import DEFAULT_GATES, NEW, CelEnvironment, with_feature_gates


def add_feature_gates_argument(parser: argparse.ArgumentParser) -> None:
    defaults = ",".join(f"{name}={str(on).lower()}" for name, on in DEFAULT_GATES.items())
    parser.add_argument(
        "--feature-gates", default="", metavar="GATES",
        help=f"the apiserver's DRA feature gates that change CEL selectors, as Name=true|false,... "
             f"(default: Kubernetes 1.36's, {defaults})")


def cel_environment(gates: str) -> CelEnvironment:
    """The new-expressions environment under `gates`; ValueError names a bad entry."""
    return with_feature_gates(gates, NEW)
