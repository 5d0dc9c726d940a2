"""How far a claim travels in tessera's code from kubelet's NodePrepareResources to the CDI spec write.

One whole-GPU claim of a simulated node is prepared through the real v1 servicer, DraService and
DeviceState (an in-memory apiserver, real files in a temporary directory) with a profiler hook on
every thread. It reports:

- the hops: the chain of tessera functions from `NodePrepareResources` down to `driver.cdi.write_spec`
  (the gRPC handler's thread up to where it hands the claim to a worker, then the worker's);
- the files on that chain, and their lines;
- every tessera file whose code ran before the spec was written, and their lines (what a reader
  may have to open to follow one prepare).

Run it in a checkout (`python -m benchmarks.prepare_path`); it runs as well in an older tree with
the same entry points (DraService, DRAPluginV1, PluginConfig, build_device_state), which is how the
before/after table in BENCHMARKS.md was made. Prints a table; asserts nothing.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path.cwd().resolve()
PACKAGES = ("kubeletplugin", "driver", "proto")
UID = "7c1d0c4e-2f7e-4a55-9c8e-1f2a3b4c5d6e"


def _ours(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts and rel.parts[0] in PACKAGES else None


def _name(frame: FrameType) -> str:
    owner = frame.f_locals.get("self")
    qual = f"{type(owner).__name__}.{frame.f_code.co_name}" if owner is not None else frame.f_code.co_name
    return f"{_ours(frame)}:{qual}"


def _chain(frame: FrameType | None) -> list[str]:
    out: list[str] = []
    while frame is not None:
        if _ours(frame):
            out.append(_name(frame))
        frame = frame.f_back
    return list(reversed(out))


@dataclass
class Trace:
    touched: set[str] = field(default_factory=set)
    handler: list[str] = field(default_factory=list)
    worker: list[str] = field(default_factory=list)
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or self.done:
            return
        rel = _ours(frame)
        if rel is None:
            return
        with self.lock:
            self.touched.add(rel)
            name = frame.f_code.co_name
            if name == "prepare_claims" and not self.handler:
                self.handler = _chain(frame)
            if name == "write_spec" and rel == "driver/cdi.py" and not self.worker:
                chain = _chain(frame)
                # the worker thread's chain starts where DraService hands the claim over
                start = next(i for i, c in enumerate(chain) if "DraService." in c)
                self.worker = chain[start:]
                self.done = True


class _Context:
    def time_remaining(self) -> float:
        return 30.0


def run() -> Trace:
    from driver.discovery import load_inventory
    from kubeletplugin.draservice import DRAPluginV1, DraService
    from kubeletplugin.plugin import build_device_state
    from proto.dra.v1 import api_pb2 as v1
    from tests.fakes.apiserver import FakeKubeAPI

    try:
        from kubeletplugin.pluginconfig import PluginConfig
    except ImportError:  # a tree from before the config had its own module
        from kubeletplugin.plugin import PluginConfig  # type: ignore[attr-defined]

    api = FakeKubeAPI(record_calls=False)
    api.add_claim({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "c", "namespace": "ns", "uid": UID},
                   "status": {"allocation": {"devices": {"results": [
                       {"request": "gpu", "driver": "gpu.tessera.dev", "pool": "node-a", "device": "gpu-0"}]}}}})
    with tempfile.TemporaryDirectory(prefix="tsp-", dir="/tmp") as d:
        root = Path(d)
        config = PluginConfig(node_name="node-a", kubelet_dir=root / "k", cdi_dir=root / "cdi",
                              state_dir=root / "state", simulate="dgx-h100-8")
        state = build_device_state(config, load_inventory("node-a", simulate="dgx-h100-8"))
        service = DraService(api, state, pool="node-a")
        servicer = DRAPluginV1(service)
        trace = Trace()
        threading.setprofile(trace.hook)
        sys.setprofile(trace.hook)
        try:
            answer = servicer.NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="ns", name="c", uid=UID)]),
                _Context(),  # type: ignore[arg-type]  # the one method DraService calls on a ServicerContext
            )
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            service.close()
        assert not answer.claims[UID].error, answer.claims[UID].error
    return trace


def lines(files: set[str]) -> int:
    return sum(len((ROOT / f).read_text().splitlines()) for f in files)


def main() -> Trace:
    trace = run()
    chain = trace.handler + trace.worker
    chain_files = {c.split(":", 1)[0] for c in chain}
    touched = {f for f in trace.touched if not f.startswith("proto/")}
    print("Call chain from NodePrepareResources to the CDI write:")
    for i, step in enumerate(chain):
        print(f"  {i:2d} {step}")
    print(f"hops: {len(chain) - 1}")
    print(f"files on the chain: {len(chain_files)}, {lines(chain_files)} lines: {', '.join(sorted(chain_files))}")
    print(f"tessera files whose code ran before the write (proto/ left out): {len(touched)}, {lines(touched)} lines")
    for f in sorted(touched):
        print(f"  {f}")
    return trace


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    main()
