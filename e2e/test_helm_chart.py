"""The Helm chart's rendered objects, validated by the real 1.36 apiserver (server-side dry run).

Server-side validation covers what offline linting cannot: every field against the served
OpenAPI schema, defaulting, DeviceClass CEL compilation, RBAC and webhook configuration rules, and
(because tessera's webhook is registered) tessera's own admission checks on the shipped classes.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.processes import REPO

# Not the session's release and namespace: where real nodes run, tessera itself is installed by the chart
# as `tessera` in tessera-system, and a dry run over it would merge into the installed objects.
NAMESPACE = "tessera-dryrun"
RELEASE = "dryrun-tessera"


@pytest.fixture(scope="module")
def tools() -> Any:
    try:
        from hack.k8stools import RegistryUnreachable, UnsupportedPlatform, ensure_tools
    except ImportError as exc:
        pytest.skip(f"hack/k8stools is not there: {exc}")
    try:
        return ensure_tools()
    except (RegistryUnreachable, UnsupportedPlatform) as exc:
        pytest.skip(f"helm/kubectl unavailable: {exc}")


@pytest.mark.parametrize("sets", [[], ["--set", "kubeletPlugin.migStrategy=dynamic,kubeletPlugin.simulate=dgx-h100-8"]],
                         ids=["defaults", "simulated-dynamic-mig"])
def test_rendered_chart_is_accepted_by_the_apiserver(cluster: Cluster, tools: Any, sets: list[str]) -> None:
    from e2e.workloads import ensure_namespace

    ensure_namespace(cluster.kube, NAMESPACE)
    helm, kubectl = str(tools.helm), str(tools.kubectl)
    render = subprocess.run([helm, "template", RELEASE, str(REPO / "helm" / "tessera"), "--namespace", NAMESPACE,
                             *sets], capture_output=True, text=True, timeout=120, check=False)
    assert render.returncode == 0, render.stderr
    applied = subprocess.run([kubectl, f"--kubeconfig={cluster.kubeconfig}", "apply", "--dry-run=server",
                              "-n", NAMESPACE, "-f", "-"], input=render.stdout, capture_output=True, text=True,
                             timeout=120, check=False)
    assert applied.returncode == 0, applied.stderr
    kinds = {line.split("/", 1)[0] for line in applied.stdout.splitlines() if "/" in line}
    assert {"daemonset.apps", "deployment.apps", "deviceclass.resource.k8s.io"} <= kinds, applied.stdout
