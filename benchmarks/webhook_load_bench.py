"""Benign review latency while hostile reviews run (issue 12): the real HTTPS server (controller/webhook.py)
with its defaults, a 1,000-GPU inventory, and 64 client threads that send hostile DeviceClass reviews
back to back while one client measures a benign claim review and /readyz.

The hostile selectors are the issue's: two nested all() over 100-element lists, lists.range(20000),
a 1.9 KB selector of such terms, and a cel.bind chain doubling a string to 512 MiB. Each case is
measured first with no load, then under load, in the same process.

Run: python -m benchmarks.webhook_load_bench [--hostile 64] [--samples 200] [--nodes 125]
Prints a table; asserts nothing (the numbers go to BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import inspect
import ipaddress
import json
import logging
import multiprocessing
import os
import queue
import ssl
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from benchmarks.stats import SUMMARY_HEADERS, Summary, machine, summarize, table
from benchmarks.webhook_bench import GPU_CLASS, inventory
from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.webhook import CertificateStore, WebhookServer

A = 'device.attributes["gpu.tessera.dev"]'
HUNDRED = "[" + ", ".join(str(i) for i in range(100)) + "]"
NESTED = f"{HUNDRED}.all(a, {HUNDRED}.all(b, a + b >= 0))"
RANGE = "lists.range(20000).all(a, a >= 0)"
# 1.9 KB, estimated cost 944,584 with the class guard (admitted); cel-cpp's budget stops it in its fourth term
LARGE = " && ".join(f"lists.range({3000 + i}).all(x, x >= 0)" for i in range(52))
DOUBLING = ('cel.bind(v0, "' + "x" * 64 + '", '
            + "".join(f"cel.bind(v{i}, v{i - 1} + v{i - 1}, " for i in range(1, 24)) + "v23.size() > 0" + ")" * 24)
HOSTILE = {"nested 100x100": NESTED, "lists.range(20000)": RANGE, "1.9 KB of range terms": LARGE,
           "bind doubling to 512 MiB": DOUBLING}
BENIGN = {
    "metadata": {"name": "benign", "namespace": "default"},
    "spec": {"devices": {"requests": [{"name": "g", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "count": 2,
        "selectors": [{"cel": {"expression": f'{A}.productName.startsWith("NVIDIA H100")'}}]}}]}},
}


def review(kind: str, obj: dict[str, Any], uid: str) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
        "operation": "CREATE", "object": obj}}).encode()


def hostile_class(name: str, expression: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{name}.gpu.tessera.dev"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "gpu.tessera.dev" && {expression}'}}]}}


def certificate(directory: Path) -> tuple[Path, Path, str]:
    """A self-signed pair for 127.0.0.1, and the certificate's PEM for clients to trust."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-bench")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path, cert.public_bytes(serialization.Encoding.PEM).decode()


@dataclass(frozen=True)
class LoadResult:
    rows: list[tuple[str, Summary]]
    hostile_outcomes: Counter[str]
    hostile: Summary | None
    server: str


class Client:
    def __init__(self, port: int, context: ssl.SSLContext, timeout_s: float = 120.0) -> None:
        self.port = port
        self.context = context
        self.timeout_s = timeout_s
        self.conn: http.client.HTTPSConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        for attempt in (1, 2):  # one reconnect: the server closes idle keep-alive connections
            if self.conn is None:
                self.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context,
                                                        timeout=self.timeout_s)
            try:
                self.conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
                response = self.conn.getresponse()
                return response.status, response.read()
            except (http.client.HTTPException, OSError) as exc:
                self.conn.close()
                self.conn = None
                if attempt == 2 or isinstance(exc, TimeoutError):
                    raise
        raise AssertionError("unreachable")


def measure(client: Client, samples: int, outcomes: Counter[str]) -> tuple[Summary, Summary]:
    """Benign claim reviews and /readyz, alternating, in milliseconds. /readyz opens a new connection
    each time, as kubelet's probe does (so it includes the TLS handshake). A request without an answer
    within MEASURE_TIMEOUT_S counts with the time it waited (so the figure is a lower bound)."""
    reviews, ready = [], []
    body = review("ResourceClaim", BENIGN, "benign")
    for _ in range(samples):
        t0 = time.perf_counter()
        try:
            status, answer = client.call("POST", "/validate-resourceclaim?timeout=5s", body)
            outcomes[_outcome(status, answer)] += 1
        except (OSError, http.client.HTTPException):
            outcomes[f"no answer in {MEASURE_TIMEOUT_S:g} s"] += 1
        reviews.append((time.perf_counter() - t0) * 1000)
        probe = Client(client.port, client.context, timeout_s=MEASURE_TIMEOUT_S)
        t0 = time.perf_counter()
        try:
            status, _ = probe.call("GET", "/readyz")
            outcomes[f"/readyz HTTP {status}"] += 1
        except (OSError, http.client.HTTPException):
            outcomes[f"/readyz: no answer in {MEASURE_TIMEOUT_S:g} s"] += 1
        ready.append((time.perf_counter() - t0) * 1000)
        probe.close()
    return summarize(reviews), summarize(ready)


def run(hostile_clients: int = 64, samples: int = 200, nodes: int = 125,
        selectors: tuple[str, ...] = tuple(HOSTILE), settle_s: float = 3.0) -> LoadResult:
    index = inventory(nodes)
    sample_devices = sample_index()
    handler = AdmissionHandler(lambda: CheckContext(
        schema=published_schema(), samples=sample_devices, inventory=index,
        classes={"gpu.tessera.dev": GPU_CLASS}, classes_complete=True))
    with tempfile.TemporaryDirectory(prefix="tessera-load-") as d:
        cert, key, pem = certificate(Path(d))
        context = ssl.create_default_context(cadata=pem)
        server = WebhookServer(handler, CertificateStore(str(cert), str(key)), "127.0.0.1", 0)
        server.start()
        try:
            client = Client(server.port, context, timeout_s=MEASURE_TIMEOUT_S)
            measure(client, 10, Counter())  # warm: compiled selectors, TLS session
            benign: dict[str, Counter[str]] = {"no load": Counter(), "loaded": Counter()}
            quiet = measure(client, samples, benign["no load"])
            # the attackers run in processes of their own: in this one their client work would take the
            # server's GIL and be measured as server latency
            spawn = multiprocessing.get_context("spawn")
            stop = spawn.Event()
            results: Any = spawn.Queue()
            per_process = -(-hostile_clients // ATTACK_PROCESSES)
            running = spawn.Value("i", 0)
            processes = [spawn.Process(target=_attack, args=(server.port, pem, per_process, selectors, p, stop,
                                                              results, running), daemon=True)
                         for p in range(ATTACK_PROCESSES)]
            for process in processes:
                process.start()
            # a spawned process takes seconds to import on a busy machine: count from when all attack
            deadline = time.monotonic() + 120
            while running.value < len(processes) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(settle_s)  # every attacker has a review in flight, queues fill
            loaded = measure(client, samples, benign["loaded"])
            stop.set()
            outcomes: Counter[str] = Counter()
            latencies: list[float] = []
            for _ in processes:
                try:
                    counts, times = results.get(timeout=2 * ATTACKER_TIMEOUT_S + 30)
                except queue.Empty:
                    outcomes["(an attacker process did not report)"] += 1
                    continue
                outcomes.update(counts)
                latencies.extend(times)
            for process in processes:
                process.join(timeout=30)
        finally:
            server.stop()
    label = f"{hostile_clients} hostile clients"
    rows = [("benign claim review, no load", quiet[0]), (f"benign claim review, {label}", loaded[0]),
            ("/readyz on a new connection, no load", quiet[1]), (f"/readyz on a new connection, {label}", loaded[1])]
    params = inspect.signature(WebhookServer).parameters
    server_desc = "no review bound (code before issue 12)"
    if "max_reviews" in params:
        server_desc = (f"max_reviews={params['max_reviews'].default}, waiting={params['max_waiting_reviews'].default}"
                       f", deadline={params['review_deadline_s'].default} s")
    for when, counts in benign.items():
        for outcome, count in counts.items():
            outcomes[f"(benign, {when}): {outcome}"] += count
    return LoadResult(rows, outcomes, summarize(latencies) if latencies else None, server_desc)


ATTACK_PROCESSES = 4
ATTACKER_TIMEOUT_S = 10.0
MEASURE_TIMEOUT_S = 30.0


def _attack(port: int, pem: str, clients: int, selectors: tuple[str, ...], process: int,  # noqa: PLR0917
            stop: Any, results: Any, running: Any) -> None:
    """`clients` threads sending hostile reviews back to back until `stop`; puts (outcomes, latencies)."""
    context = ssl.create_default_context(cadata=pem)
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    lock = threading.Lock()

    parent = os.getppid()

    def attack(n: int) -> None:
        # the apiserver gives up after the webhook's timeout (5 s in the chart); 10 s here
        attacker = Client(port, context, timeout_s=ATTACKER_TIMEOUT_S)
        i = n
        while not stop.is_set() and os.getppid() == parent:  # also stop when the benchmark was killed
            name = selectors[i % len(selectors)]
            i += 1
            body = review("DeviceClass", hostile_class(f"h{process}x{i}", HOSTILE[name]), f"h-{process}-{n}-{i}")
            t0 = time.perf_counter()
            try:
                status, answer = attacker.call("POST", "/validate-deviceclass?timeout=5s", body)
            except TimeoutError:
                outcome = f"no answer in {ATTACKER_TIMEOUT_S:g} s"
            except (OSError, http.client.HTTPException) as exc:
                outcome = f"connection failed ({type(exc).__name__})"
            else:
                outcome = _outcome(status, answer)
            with lock:
                outcomes[f"{name}: {outcome}"] += 1
                latencies.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=attack, args=(n,), daemon=True) for n in range(clients)]
    for t in threads:
        t.start()
    with running.get_lock():
        running.value += 1
    for t in threads:
        t.join()
    results.put((outcomes, latencies))


def _outcome(status: int, answer: bytes) -> str:
    if status != 200:
        return f"HTTP {status}"
    response = json.loads(answer)["response"]
    if not response["allowed"]:
        message = response["status"]["message"]
        if "could not finish checking" in message:
            return "cut short"
        return "denied (cost limit)" if "exceeds cost limit" in message else "denied"
    warnings = response.get("warnings") or []
    if any("did not evaluate" in w for w in warnings):
        return "warned (skipped: iteration budget)"
    return "allowed with warnings" if warnings else "allowed"


def render(result: LoadResult) -> str:
    out = [f"Server: {result.server}.", table(["case", *SUMMARY_HEADERS], [[n, *s.row()] for n, s in result.rows])]
    if result.hostile is not None:
        out.append("Hostile reviews answered while measuring: " + table(["p50 ms", "p99 ms", "mean ms", "max ms", "n"],
                                                                    [result.hostile.row()]))
    out.append(table(["review: outcome", "count"], sorted(result.hostile_outcomes.items())))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hostile", type=int, default=64, help="concurrent hostile clients (default 64)")
    parser.add_argument("--samples", type=int, default=200, help="benign reviews per case (default 200)")
    parser.add_argument("--nodes", type=int, default=125, help="DGX H100 nodes in the inventory (default 125)")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds of attack before the loaded measurement starts (default 3)")
    parser.add_argument("--selectors", default=",".join(HOSTILE),
                        help=f"hostile selectors to send, comma-separated among: {', '.join(HOSTILE)}")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    started = time.perf_counter()
    chosen = tuple(name.strip() for name in args.selectors.split(",") if name.strip())
    unknown = [name for name in chosen if name not in HOSTILE]
    if unknown:
        parser.error(f"unknown selectors {unknown}; choose among {', '.join(HOSTILE)}")
    result = run(args.hostile, args.samples, args.nodes, chosen, args.settle)
    print(render(result))
    print(f"\n{machine()}\nran in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
