"""tessera installed the way users install it: its image on every node and `helm install` of the chart.

The demo and the chart's e2e tests use this; both run the commands the README gives, with the
values file the README names (helm/values-simulated.yaml) and nothing else but `--set` flags.

- The image is built here without a daemon or a registry (`make image`, hack/image/) and imported
  into each real node's containerd, as a cluster operator would pre-load it on air-gapped nodes.
- Simulated nodes say which machine they are with a label (SIMULATED_PROFILE_LABEL), and how their
  GPUs are partitioned with another (MIG_STRATEGY_LABEL); the values file points the chart at both,
  so one DaemonSet serves nodes of several profiles.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from e2e.kube import Kube, Obj
from e2e.node.realnode import RealNode

if TYPE_CHECKING:
    from e2e.cluster import Cluster
from e2e.processes import REPO, ClusterError, wait_for

RELEASE = "tessera"
NAMESPACE = "tessera-system"
CHART = REPO / "helm" / "tessera"
# The values every simulated install uses; the README's tour names the same file.
SIMULATED_VALUES = REPO / "helm" / "values-simulated.yaml"
IMAGE_REPOSITORY = "tessera.local/tessera"
SIMULATED_PROFILE_LABEL = "gpu.tessera.dev/simulated-profile"
MIG_STRATEGY_LABEL = "gpu.tessera.dev/mig-strategy"


# What NVIDIA's GPU feature discovery puts on a GPU node; the chart's default nodeSelector.
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"


def simulated_node_labels(profile: str, mig_strategy: str) -> tuple[str, ...]:
    """The labels that make a node one of the chart's simulated GPU nodes (helm/values-simulated.yaml)."""
    return (f"{GPU_PRESENT_LABEL}=true", f"{SIMULATED_PROFILE_LABEL}={profile}", f"{MIG_STRATEGY_LABEL}={mig_strategy}")


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubectl: Path


@cache
def tools() -> Tools:
    """The pinned helm and kubectl (hack/k8stools.py): the binaries the README's commands run."""
    from hack.k8stools import ensure_tools

    paths = ensure_tools()
    return Tools(Path(paths.helm), Path(paths.kubectl))


@dataclass(frozen=True)
class Image:
    archive: Path  # an OCI image layout tarball
    tag: str

    @property
    def reference(self) -> str:
        return f"{IMAGE_REPOSITORY}:{self.tag}"


def chart_app_version() -> str:
    for line in (CHART / "Chart.yaml").read_text().splitlines():
        if line.startswith("appVersion:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise ClusterError(f"{CHART / 'Chart.yaml'} has no appVersion")


def build_image(tag: str = "") -> Image:
    """tessera's image for this checkout, tagged `tag` (default: the chart's appVersion, the tag the chart
    installs when values do not name one); built once per content and tag, then taken from the cache."""
    tag = tag or chart_app_version()
    proc = subprocess.run(["bash", str(REPO / "hack" / "image" / "build.sh"), "--print-path", f"--tag={tag}"],
                          stdout=subprocess.PIPE, text=True, check=False, cwd=REPO)
    if proc.returncode != 0:
        raise ClusterError(f"building tessera's image failed (rc={proc.returncode}); see the output above")
    return Image(Path(proc.stdout.strip().splitlines()[0]), tag)


def load_image(node: RealNode, image: Image) -> None:
    """Import the image into the node's containerd (namespace k8s.io, the one kubelet's CRI uses)."""
    proc = subprocess.run([*node.ctr(), "-n", "k8s.io", "images", "import", "--local", str(image.archive)],
                          capture_output=True, text=True, check=False, timeout=300)
    if proc.returncode != 0:
        raise ClusterError(f"importing {image.reference} into node {node.name} failed: "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")


def helm(kubeconfig: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`helm <args>` against the cluster of `kubeconfig`, as a user would type it (KUBECONFIG set)."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run([str(tools().helm), *args], capture_output=True, text=True, check=False, timeout=timeout,
                          env=env, cwd=REPO)


def kubectl(kubeconfig: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    return subprocess.run([str(tools().kubectl), *args], capture_output=True, text=True, check=False,
                          timeout=timeout, env=env, cwd=REPO)


def install_args(*sets: str, wait: bool = True) -> list[str]:
    """The README's install command: `helm upgrade --install` of the chart with the simulated values."""
    args = ["upgrade", "--install", RELEASE, str(CHART.relative_to(REPO)), "-n", NAMESPACE, "--create-namespace",
            "-f", str(SIMULATED_VALUES.relative_to(REPO))]
    for s in sets:
        args += ["--set", s]
    return [*args, "--wait", "--timeout", "4m"] if wait else args


def install(kubeconfig: Path, *sets: str, wait: bool = True) -> str:
    """Install (or upgrade) the release; returns helm's output (NOTES included)."""
    proc = helm(kubeconfig, *install_args(*sets, wait=wait))
    if proc.returncode != 0:
        raise ClusterError(f"helm {' '.join(install_args(*sets, wait=wait))} failed:\n{proc.stderr or proc.stdout}")
    return proc.stdout


PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"
CONTROLLER_SELECTOR = "app.kubernetes.io/component=controller"


def ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def wait_components_ready(kube: Kube, nodes: Sequence[str], *, controllers: int = 0, timeout: float = 240) -> None:
    """A Ready plugin pod of the release on every node in `nodes`, and `controllers` Ready controller pods."""

    def all_ready() -> bool:
        plugins = {p["spec"].get("nodeName") for p in kube.list("Pod", NAMESPACE, label_selector=PLUGIN_SELECTOR)
                   if ready(p)}
        running = [p for p in kube.list("Pod", NAMESPACE, label_selector=CONTROLLER_SELECTOR) if ready(p)]
        return set(nodes) <= plugins and len(running) >= controllers

    wait_for(all_ready, timeout=timeout, interval=1,
             what=f"tessera's plugin pods on {', '.join(nodes)} and {controllers} controller pod(s) to be Ready")


def install_into(cluster: Cluster, image: Image, *sets: str, controllers: int = 2) -> str:
    """Load the image into the cluster's real nodes and install the chart as the README says; wait until
    a plugin pod runs on every real node that names a simulated profile and `controllers` replicas serve.
    Returns helm's output (NOTES included)."""
    for node in cluster.real_nodes.values():
        load_image(node, image)
    output = install(cluster.kubeconfig, *sets)
    chart_nodes = [n.name for n in cluster.real_nodes.values()
                   if any(label.startswith(f"{SIMULATED_PROFILE_LABEL}=") for label in n.labels)]
    wait_components_ready(cluster.kube, chart_nodes, controllers=controllers)
    return output
