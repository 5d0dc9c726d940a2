"""`tessera explain POD|pod/NAME|resourceclaim/NAME [-n NS]`: why a pod's claims are not allocated, or,
once they are, why kubelet cannot prepare them.

For each claim and request (the claim the scheduler makes for extended resources included): how many
devices pass each step (driver, DeviceClass, selectors, capacity, allocation, taints, counters,
constraints), and at the first step that leaves nothing, the reason and a fix; for a bound pod whose
claims are allocated, kubelet's FailedPrepareDynamicResources message and tessera's fix. The search has
one budget (--search-budget); an answer it cut short says so. Exit status 0 when tessera's part is fine
(allocated, or could be now), 1 when a claim cannot be allocated or prepared, 2 when the cluster cannot
be read or the pod/claim does not exist.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

EXIT_AT_ONCE = True  # tessera.cli.entry: what was read is not freed one object at a time at exit

POD_KINDS = ("pod", "pods", "po")
CLAIM_KINDS = ("resourceclaim", "resourceclaims", "claim", "claims")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="POD|pod/NAME|resourceclaim/NAME",
                        help="a pod (the default kind) or a ResourceClaim")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, else default)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--search-budget", type=_seconds, metavar="SECONDS",
                        help="how long the scheduler's search may run in all (default 3); an answer the budget cut "
                             "short says so")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text",
                        help="text for people, json for tools (exit status: 0 tessera's part is fine, 1 a claim "
                             "cannot be allocated now, 2 the cluster or the object cannot be read)")


def parse_target(text: str) -> tuple[str, str]:
    """`pod/x` -> ("pod", "x"); `resourceclaim/x` -> ("resourceclaim", "x"); `x` -> ("", "x")."""
    kind, sep, name = text.partition("/")
    if not sep:
        return "", text
    kind = kind.lower()
    if kind in POD_KINDS:
        return "pod", name
    if kind in CLAIM_KINDS or kind.startswith("resourceclaims."):
        return "resourceclaim", name
    raise ValueError(f"{text!r}: explain takes a pod or a resourceclaim (pod/NAME or resourceclaim/NAME), "
                     f"not {kind!r}")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    return explain(args.target, namespace=args.namespace, kubeconfig=args.kubeconfig, output=args.output,
                   out=sys.stdout, err=sys.stderr, search_budget=args.search_budget)


def explain(target: str, *, namespace: str | None, kubeconfig: str | None, output: str, out: TextIO,
            err: TextIO, search_budget: float | None = None) -> int:
    from controller.cluster.objects import by_name
    from controller.explain.explain import Budget, ClusterView, NotFound, explain_claim, explain_pod
    from controller.explain.render import render_json, render_text
    from driver.gcpause import keep_for_good
    from tessera import clusterread as read

    budget = Budget() if search_budget is None else Budget(search_budget)
    try:
        kind, name = parse_target(target)
    except ValueError as exc:
        print(f"tessera explain: {exc}", file=err)
        return 2
    try:
        api = read.connect(kubeconfig)
        ns = namespace or api.namespace
        got = read.read_together({
            "slices": lambda: read.resource_slices(api), "classes": lambda: read.device_classes(api),
            "claims": lambda: read.resource_claims(api), "pods": lambda: read.pods(api, ns),
            "nodes": lambda: read.nodes(api), "templates": lambda: read.templates(api, ns),
            "events": lambda: read.prepare_events(api, ns, name) if kind != "resourceclaim" else [],
            "taint_rules": lambda: read.taint_rules(api)})
    except read.ReadError as exc:
        print(f"tessera explain: {exc}", file=err)
        return 2
    # what was read lives until the command exits; frozen before the snapshot is built (see `tessera status`)
    keep_for_good()
    view = ClusterView(
        slices=got["slices"], classes=by_name(got["classes"]), claims=got["claims"], pods=got["pods"] or [],
        nodes=got["nodes"], templates=got["templates"], events=got["events"], taint_rules=got["taint_rules"] or [],
    )
    try:
        if kind == "resourceclaim" or (not kind and view.find("pod", ns, name) is None
                                       and view.find("claim", ns, name) is not None):
            explanation = explain_claim(view, ns, name, budget)
        else:
            explanation = explain_pod(view, ns, name, budget)
    except NotFound as exc:
        print(f"tessera explain: {exc}", file=err)
        return 2
    if output == "json":
        out.write(json.dumps(render_json(explanation), indent=2) + "\n")
    else:
        out.write(render_text(explanation))
    return 0 if explanation.verdict.ok and not explanation.problem else 1
