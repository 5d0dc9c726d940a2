"""`tessera status [-o table|json] [--svg FILE]`: per node and GPU, what allocated claims hold (whole GPUs,
memory shares, MIG instances with their placement), by claim and pod, and what is free (memory, MIG
placements still possible). Read from the apiserver alone: ResourceSlices, ResourceClaims (allocation
and reservedFor) and DeviceClasses."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

EXIT_AT_ONCE = True  # tessera.cli.entry: what was read is not freed one object at a time at exit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table",
                        help="table for people, json for tools")
    parser.add_argument("--svg", metavar="FILE", help="also draw the GPUs as bars of their memory into FILE")


def run(args: argparse.Namespace) -> int:
    return status(kubeconfig=args.kubeconfig, output=args.output, svg=args.svg, out=sys.stdout, err=sys.stderr)


def status(*, kubeconfig: str | None, output: str, svg: str | None, out: TextIO, err: TextIO) -> int:
    from controller.explain.explain import ClusterView
    from controller.explain.status import cluster_status, status_json, status_table
    from controller.explain.svg import status_svg
    from driver.gcpause import keep_for_good
    from tessera import clusterread as read

    try:
        api = read.connect(kubeconfig)
        got = read.read_together({"slices": lambda: read.resource_slices(api),
                                  "claims": lambda: read.resource_claims(api), "pods": lambda: read.pods(api)})
    except read.ReadError as exc:
        print(f"tessera status: {exc}", file=err)
        return 2
    # What was read lives until the command exits. Frozen before the snapshot is built: the collector's full
    # passes over a million objects just decoded took 1 s of building it at 1,000 DGX nodes.
    keep_for_good()
    view = ClusterView(slices=got["slices"], classes={}, claims=got["claims"])
    pods = got["pods"]
    report = cluster_status(view, pods)
    if svg:
        try:
            Path(svg).write_text(status_svg(report), encoding="utf-8")
        except OSError as exc:
            print(f"tessera status: cannot write {svg}: {exc.strerror or exc}", file=err)
            return 2
    if output == "json":
        out.write(json.dumps(status_json(report), indent=2) + "\n")
    else:
        out.write(status_table(report))
        if svg:
            out.write(f"card map written to {svg}\n")
    return 0
