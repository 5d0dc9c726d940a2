"""Many nodes' slice publishers in one process: tessera's own slices and Publisher, one per fake node.

    python -m benchmarks.scale.fleet --kubeconfig K --nodes NODES.json --events EVENTS.jsonl --commands CMDS

Each node gets what `tessera kubelet-plugin` would publish for it (driver.slices.build_slices of its
simulated profile) through its own kubeletplugin.publisher.Publisher with its own API client, so each
has its own connections, sync thread and watch, as on a real node. A process per node would not fit
the machine (about 95 MiB each), so the scale benchmark runs a few of these, each with a share of the
nodes.

Lines appended to --commands drive the rollout storm: `prepare restart` builds a new set of publishers
with the same slices, `prepare upgrade` one with slices as after a driver upgrade (a new driverVersion on
every device, so every slice changes); `go` then stops every old publisher and starts the new ones at
once. "Restart" is what a new plugin process does: a new client, a new Publisher, a first sync from
nothing. Building ahead lets every fleet process start its round at the same moment, and keeps this
process building 1,000 inventories off the storm's clock. SIGTERM stops everything.

Events go to --events as JSON lines: one `synced` per node per round (wall-clock time it was first
seen published, its failed syncs so far and the last error), then `round-done`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import structlog

from driver.backoff import Backoff
from driver.discovery import load_inventory
from driver.kubeapi import RealKubeAPI
from driver.slices import build_slices
from kubeletplugin.publisher import Publisher

Obj = dict[str, Any]
ORIGINAL_DRIVER_VERSION = "550.54.15"  # what the simulated profiles publish
UPGRADED_DRIVER_VERSION = "580.95.5"  # semver: no leading zeros, or the apiserver says 422


def upgraded(slices: list[Obj], driver_version: str = UPGRADED_DRIVER_VERSION) -> list[Obj]:
    """`slices` as after a driver upgrade: every device's driverVersion attribute changed."""
    out: list[Obj] = json.loads(json.dumps(slices))
    for s in out:
        for device in s.get("spec", {}).get("devices") or []:
            attrs = device.get("attributes") or {}
            if "driverVersion" in attrs:
                attrs["driverVersion"] = {"version": driver_version}
    return out


def node_slices(name: str, profile: str, mig_strategy: str, *, upgrade: bool) -> list[Obj]:
    slices = build_slices(load_inventory(name, simulate=profile), mig_strategy=mig_strategy)
    return upgraded(slices) if upgrade else slices


class Fleet:
    def __init__(self, kubeconfig: str, nodes: list[Obj], events: IO[str], stop: threading.Event) -> None:
        self._kubeconfig = kubeconfig
        self._stop = stop
        self._nodes = nodes
        self._events = events
        self._events_lock = threading.Lock()
        self._publishers: dict[str, Publisher] = {}
        self._round = 0

    def emit(self, event: Obj) -> None:
        with self._events_lock:
            self._events.write(json.dumps(event) + "\n")
            self._events.flush()

    def build(self, *, upgrade: bool) -> dict[str, Publisher]:
        """A new client and Publisher per node (not started), as a freshly started plugin has them."""
        out: dict[str, Publisher] = {}
        for node in self._nodes:
            api = RealKubeAPI(self._kubeconfig, request_timeout=30.0)
            slices = node_slices(node["name"], node["profile"], node["mig_strategy"], upgrade=upgrade)
            # The plugin's defaults (publisher.py) except the resync: a 300 s resync would only add noise.
            out[node["name"]] = Publisher(api, node["name"], slices, backoff=Backoff(), resync_interval=3600.0)
        return out

    def start_round(self, publishers: dict[str, Publisher], *, upgrade: bool) -> None:
        old = self._publishers
        self._round += 1
        round_no = self._round
        if old:
            # Stopping waits for each sync thread; in parallel, so 1,000 of them take seconds, not minutes.
            with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
                list(pool.map(lambda p: p.stop(), old.values()))
        self._publishers = publishers
        started = time.time()
        self.emit({"event": "round-start", "round": round_no, "upgrade": upgrade, "t": started,
                   "nodes": len(publishers)})
        for publisher in publishers.values():
            publisher.start()
        pending = dict(publishers)
        while pending and not self._stop.is_set():
            for name, publisher in list(pending.items()):
                if publisher.wait_synced(0):
                    self.emit({"event": "synced", "round": round_no, "node": name, "t": time.time(),
                               "errors": publisher.errors, "last_error": publisher.last_error[:200]})
                    del pending[name]
            if pending:
                time.sleep(0.05)
        if pending:
            return
        self.emit({"event": "round-done", "round": round_no, "t": time.time(), "started": started,
                   "errors": sum(p.errors for p in publishers.values())})

    def stop(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
            list(pool.map(lambda p: p.stop(), self._publishers.values()))


def commands(path: Path, stop: threading.Event) -> Iterator[str]:
    """Lines appended to `path`, as they come, until `stop` is set."""
    seen = 0
    while not stop.is_set():
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines[seen:]:
            yield line.strip()
        seen = len(lines)
        stop.wait(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--nodes", type=Path, required=True, help="JSON list of {name, profile, mig_strategy}")
    parser.add_argument("--events", type=Path, required=True, help="where the JSON-lines events go")
    parser.add_argument("--commands", type=Path, required=True, help="file the benchmark appends commands to")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    nodes = json.loads(args.nodes.read_text())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with args.events.open("a") as events:
        fleet = Fleet(args.kubeconfig, nodes, events, stop)
        fleet.emit({"event": "building", "t": time.time(), "nodes": len(nodes)})
        fleet.start_round(fleet.build(upgrade=False), upgrade=False)
        prepared: dict[str, Publisher] = {}
        upgrade = False
        for command in commands(args.commands, stop):
            if command in ("prepare restart", "prepare upgrade"):
                upgrade = command.endswith("upgrade")
                prepared = fleet.build(upgrade=upgrade)
                fleet.emit({"event": "built", "t": time.time(), "upgrade": upgrade})
            elif command == "go" and prepared:
                fleet.start_round(prepared, upgrade=upgrade)
                prepared = {}
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
