"""`tessera check FILE... [--slices FILE | --kubeconfig K]`: the admission checks, offline.

Prints each DeviceClass/ResourceClaim/ResourceClaimTemplate with its findings (error or warning, with
the field path) and, per class and request, how many devices match on which nodes. Exit status 1 when
any error was found, 2 when the input cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from driver.cel.environment import NEW, CelEnvironment
from driver.errors import InvalidInputError
from tessera.celgates import add_feature_gates_argument, cel_environment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML or JSON files (multi-document, or kind: List)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--slices", metavar="FILE", help="ResourceSlices to match against (e.g. `tessera inventory -o yaml` output)"
    )
    source.add_argument("--kubeconfig", metavar="K", help="read ResourceSlices and DeviceClasses from this cluster")
    add_feature_gates_argument(parser)


def load_documents(path: str) -> list[tuple[str, Any]]:
    import yaml

    from driver.safeyaml import MAX_BYTES, YamlLimitError, load_all

    try:
        with Path(path).open("rb") as f:
            data = f.read(MAX_BYTES + 1)  # never more than the limit into memory
        text = data.decode("utf-8")
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{path}: not UTF-8 text: {exc}") from exc
    if len(data) > MAX_BYTES:
        raise InvalidInputError(f"{path}: larger than the {MAX_BYTES:,}-byte limit for one file; split it")
    try:
        docs = load_all(text)
    except YamlLimitError as exc:
        raise InvalidInputError(f"{path}: refused: {exc}") from exc
    except yaml.YAMLError as exc:
        raise InvalidInputError(f"{path}: not valid YAML/JSON: {exc}") from exc
    if len(docs) == 1:
        return [(path, docs[0])]
    return [(f"{path} (document {i + 1})", doc) for i, doc in enumerate(docs)]


def run(args: argparse.Namespace) -> int:
    try:
        environment = cel_environment(args.feature_gates)
    except ValueError as exc:
        sys.stderr.write(f"tessera check: --feature-gates: {exc}\n")
        return 2
    return check_files(args.files, slices=args.slices, kubeconfig=args.kubeconfig, out=sys.stdout, err=sys.stderr,
                       environment=environment)


def check_files(files: list[str], *, slices: str | None, kubeconfig: str | None, out: TextIO, err: TextIO,
                environment: CelEnvironment = NEW) -> int:
    from controller.checks.inputs import CheckContext
    from controller.cluster.inventory import DeviceIndex
    from controller.cluster.sampledevices import sample_index
    from controller.cluster.schema import published_schema
    from controller.offline import check_objects, flatten

    try:
        objects = flatten(doc for f in files for doc in load_documents(f))
        ctx = CheckContext(schema=published_schema(), samples=sample_index(), cel_environment=environment)
        if slices:
            items = [o.obj for o in flatten(load_documents(slices)) if o.obj.get("kind") in ("ResourceSlice", None)]
            ctx.inventory = DeviceIndex.from_slices(items)
        elif kubeconfig:
            _load_cluster(ctx, kubeconfig)
    except InvalidInputError as exc:
        print(f"tessera check: {exc}", file=err)
        return 2

    results = check_objects(objects, ctx)
    errors = warnings = 0
    for result in results:
        if result.skipped:
            print(f"{result.source}: {result.kind} {result.name}: skipped ({result.skipped})", file=out)
            continue
        print(f"{result.source}: {result.kind} {result.name}".rstrip(), file=out)
        if not result.targets_tessera:
            print("  not a tessera object (no tessera class, selector or config): nothing to check", file=out)
            continue
        for line in result.rewrites:
            print(f"  rewritten: {line}", file=out)
        for finding in result.findings:
            text = str(finding).replace("\n", "\n      ")
            print(f"  {text}", file=out)
        for what, match in result.matches:
            if match is not None:
                print(f"  {what}: matches {match.summary()}", file=out)
        errors += sum(f.severity == "error" for f in result.findings)
        warnings += sum(f.severity == "warning" for f in result.findings)
    checked = sum(1 for r in results if not r.skipped)
    if ctx.inventory is None:
        print("no inventory given: use --slices FILE or --kubeconfig K to see which devices match", file=out)
    print(f"{checked} object(s) checked: {errors} error(s), {warnings} warning(s)", file=out)
    return 1 if errors else 0


def _load_cluster(ctx: Any, kubeconfig: str) -> None:
    from controller.cluster.inventory import DeviceIndex
    from controller.cluster.objects import by_name
    from tessera import clusterread as read

    try:
        api = read.connect(kubeconfig)
        slices = read.resource_slices(api)
        classes = read.device_classes(api)
    except read.ReadError as exc:
        raise InvalidInputError(str(exc)) from exc
    ctx.inventory = DeviceIndex.from_slices(slices)
    ctx.classes = by_name(classes)
    ctx.classes_complete = True
