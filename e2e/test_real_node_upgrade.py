"""A surge rolling update of tessera's plugin on a real node (kubelet v1.36.3 + containerd), with pods
being created all the while: the new plugin instance starts beside the old one with its own
sockets, kubelet registers it and switches to it, the old one stops. Nothing a user would see may
break: no pod fails to get its devices, no claim is prepared twice or gets two CDI specs, the pods
started before the upgrade keep running with their devices, and the node keeps its ResourceSlices.

The longest gap between two successful prepares across the switch is printed (run with -s);
BENCHMARKS.md records it.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from datetime import datetime
from pathlib import Path

from e2e.kube import Kube
from e2e.node.podresources import list_dynamic_resources
from e2e.node.realnode import RealNode
from e2e.processes import ManagedProcess
from e2e.realpods import KEEP, PodLoop, cdi_specs, failed_prepares
from e2e.workloads import claim_spec, claim_template, pod_claim_name, request, slices_of


def _prepared_at(logs: list[Path]) -> list[tuple[float, str, str]]:
    """(unix time, claim uid, log name) of every "claim prepared" line of the given plugin logs."""
    out = []
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if '"claim prepared"' not in line:
                continue
            rec = json.loads(line)
            if "claim_uid" not in rec:  # older builds logged the same prepare again from the gRPC layer, without it
                continue
            out.append((datetime.fromisoformat(rec["timestamp"]).timestamp(), rec["claim_uid"], path.name))
    return sorted(out)


def _longest_gap(times: list[float]) -> tuple[float, float]:
    """The longest gap between consecutive times, and when it began."""
    return max(((b - a, a) for a, b in itertools.pairwise(times)), default=(0.0, 0.0))


def _restore_plugin(node: RealNode, candidates: list[ManagedProcess]) -> None:
    """Leave the node with one running plugin for the tests after this one."""
    alive = [p for p in candidates if p.alive()]
    for extra in alive[:-1]:
        extra.stop()
    if alive:
        node.plugin = alive[-1]
    else:
        node.start_plugin()


def test_surge_upgrade_keeps_every_prepare_and_every_running_pod(
    kube: Kube, real_a100: RealNode, namespace: str
) -> None:
    node = real_a100
    kube.create(claim_template("share", namespace, claim_spec(request(memory="1Gi"))))
    # the node runs the plugin the way the chart does: one instance id per pod
    if node.plugin is not None:
        node.plugin.stop()
    tag = uuid.uuid4().hex[:6]
    old = node.start_instance(f"old-{tag}")
    started: list[ManagedProcess] = [old]
    loop = PodLoop(kube, node, namespace)
    try:
        loop.thread.start()
        loop.wait_running(KEEP + 2, "pods to run on the old plugin instance")

        t_new = time.time()
        new = node.start_instance(f"new-{tag}")
        t_registered = time.time()
        started.append(new)
        loop.wait_running(len(loop.running) + 3, "pods to run while both instances serve")
        t_stop = time.time()
        old.stop()
        assert old.popen is not None and old.popen.returncode == 0, old.tail()
        loop.wait_running(len(loop.running) + 4, "pods to run after the old instance stopped")
        loop.stop.set()
        loop.thread.join(90)
        t_end = time.time()
        assert not loop.errors, loop.errors

        # every pod got its devices: no FailedPrepareDynamicResources, no pod left behind
        assert failed_prepares(kube, namespace) == []
        assert loop.created == loop.running
        assert all(len(loop.visible[name]) == 1 for name in loop.running), loop.visible

        # each claim prepared once, by one instance, and with exactly one CDI spec
        prepared = _prepared_at([old.log_path, new.log_path])
        live = {
            name: kube.get("ResourceClaim", pod_claim_name(kube.get("Pod", name, namespace)) or "", namespace)
            for name in loop.running if name not in loop.deleted
        }
        uids = {name: c["metadata"]["uid"] for name, c in live.items()}
        per_claim = {uid: [p for p in prepared if p[1] == uid] for uid in uids.values()}
        assert {uid: len(p) for uid, p in per_claim.items()} == dict.fromkeys(uids.values(), 1)
        for uid in uids.values():
            specs = cdi_specs(node, uid)
            assert len(specs) == 1, (uid, specs)
        # kubelet used the new instance as soon as it was registered, and only it once the old one left
        assert any(log == new.log_path.name and t_new <= at < t_stop for at, _, log in prepared)
        assert all(log == new.log_path.name for at, _, log in prepared if at > t_stop)

        # the pods started before the upgrade still run their first container, with their devices
        for name in loop.running[:KEEP]:
            p = kube.get("Pod", name, namespace)
            status = p["status"]["containerStatuses"][0]
            assert p["status"]["phase"] == "Running" and "running" in status["state"], status
            assert status["restartCount"] == 0  # (and its claim's spec is among those checked above)
            # kubelet still accounts the claim's device to the pod, with the same CDI id as before
            held = list_dynamic_resources(node.podresources_socket, namespace, name)["probe"]
            assert len(held) == 1 and held[0].cdi_ids, held
            [spec] = cdi_specs(node, uids[name])
            assert all(i.split("=", 1)[1] in spec.read_text() for i in held[0].cdi_ids)
        # the node's slices stayed, now kept by the new instance
        assert slices_of(kube, node.name)
        assert "took over publishing" in new.log_path.read_text()

        times = [at for at, _, _ in prepared]
        before = [t for t in times if t < t_new]
        during = [t for t in times if t >= t_new - (t_new - before[-1] if before else 0)]
        gap, gap_at = _longest_gap(during)
        print(
            f"\nsurge upgrade on {node.name}: {len(times)} prepares, {len(during)} from the last one before the "
            f"new instance started to the end ({t_end - t_new:.1f} s; new instance registered at "
            f"+{t_registered - t_new:.1f} s, old instance stopped at +{t_stop - t_new:.1f} s); longest gap "
            f"between prepares: {gap:.2f} s across the upgrade (from +{gap_at - t_new:.2f} s), "
            f"{_longest_gap(before)[0]:.2f} s before it"
        )
    finally:
        loop.stop.set()
        loop.thread.join(90)
        _restore_plugin(node, started)
