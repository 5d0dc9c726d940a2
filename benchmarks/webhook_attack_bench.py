"""Benign claims created through a real apiserver while hostile clients attack the webhook port directly
(issue 24, item 5): a real control plane (e2e.cluster), `tessera controller` as its own process behind
Validating/MutatingWebhookConfigurations with failurePolicy Fail and timeoutSeconds 5 (the chart's), and
two attacks from processes of their own:

- idle: N TCP connections that never send a byte, each re-opened a second after the server drops it;
- posters: M clients posting valid claim AdmissionReviews straight to the webhook, back to back, from
  127.0.0.2 (another pod's address) and without a client certificate (a pod has none). Each review is
  admitted, and costs the webhook about 80 ms of CPU (4 requests of 8 `lists.range(9000).all(...)`
  selectors each); --light-posters sends the benign claim instead (about 1 ms).

Per phase (quiet, idle, posters, both) it creates benign ResourceClaims through the apiserver, two a
second, and probes /healthz and /readyz as kubelet does (a new connection each, 1 s timeout). A claim
counts as answered when the apiserver created it, that is when every webhook answered within its timeout.

    python -m benchmarks.webhook_attack_bench                         # this checkout, client auth on
    python -m benchmarks.webhook_attack_bench --no-client-auth        # only the per-client bounds
    python -m benchmarks.webhook_attack_bench --controller-src DIR    # another checkout (the BEFORE)

A checkout whose controller has no --probe-addr is probed on its webhook port over HTTPS, as its chart
did, and gets no client certificate. Prints Markdown; asserts nothing (the numbers go to BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import datetime
import http.client
import ipaddress
import json
import multiprocessing
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from benchmarks.stats import machine, percentile, table
from driver.discovery import load_inventory
from driver.slices import build_slices
from e2e.cluster import ControlPlane, harness_path
from e2e.kube import Kube, KubeError, load_manifests
from e2e.processes import ManagedProcess, free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
A = 'device.attributes["gpu.tessera.dev"]'
NAMESPACE = "bench"
WEBHOOK_TIMEOUT_S = 5  # the chart's webhook.timeoutSeconds
PROBE_TIMEOUT_S = 1.0  # kubelet's default timeoutSeconds
HOSTILE_SOURCE = "127.0.0.2"


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {
                "deviceClassName": "gpu.tessera.dev", "count": 2,
                "selectors": [{"cel": {"expression": f'{A}.productName.startsWith("NVIDIA H100")'}}]}}]}}}


HEAVY_SELECTORS = [f"lists.range(9000).all(a, a >= {-i})" for i in range(8)]


def heavy_claim(name: str) -> dict[str, Any]:
    """Valid (admitted without a warning) and costly: every selector runs 9,000 iterations per device shape."""
    obj = claim(name)
    obj["spec"]["devices"]["requests"] = [
        {"name": f"r{n}", "exactly": {"deviceClassName": "gpu.tessera.dev",
                                      "selectors": [{"cel": {"expression": e}} for e in HEAVY_SELECTORS]}}
        for n in range(4)]
    return obj


def review_body(n: int, heavy: bool) -> bytes:
    obj = heavy_claim(f"direct-{n}") if heavy else claim(f"direct-{n}")
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
        "operation": "CREATE", "namespace": NAMESPACE, "name": obj["metadata"]["name"], "object": obj}}).encode()


# -- certificates -------------------------------------------------------------------------------------


@dataclass
class Certs:
    """One CA for the webhook's serving certificate and the apiserver's client certificate."""

    directory: Path
    key: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))

    def __post_init__(self) -> None:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-bench-ca")])
        self.ca = self._sign(x509.CertificateBuilder().subject_name(name).public_key(self.key.public_key())
                             .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True))
        self.ca_file = self.directory / "ca.crt"
        self.ca_file.write_bytes(self.ca_pem)

    @property
    def ca_pem(self) -> bytes:
        return self.ca.public_bytes(serialization.Encoding.PEM)

    def _sign(self, builder: x509.CertificateBuilder) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-bench-ca")])
        return (builder.issuer_name(issuer).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .sign(self.key, hashes.SHA256()))

    def issue(self, name: str, usage: x509.ObjectIdentifier) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .public_key(key.public_key()).add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if usage == ExtendedKeyUsageOID.SERVER_AUTH:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = self._sign(builder)
        cert_path, key_path = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path


def admission_config(certs: Certs) -> Path:
    """The apiserver's AdmissionConfiguration: present a client certificate to every webhook ("*")."""
    cert, key = certs.issue("kube-apiserver-webhook-client", ExtendedKeyUsageOID.CLIENT_AUTH)
    kubeconfig = certs.directory / "webhook-client.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "users": [{"name": "*", "user": {"client-certificate": str(cert), "client-key": str(key)}}]}))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(kubeconfig)}
    path = certs.directory / "admission.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": "ValidatingAdmissionWebhook", "configuration": plugin},
                    {"name": "MutatingAdmissionWebhook", "configuration": plugin}]}))
    return path


# -- the cluster and the controller -----------------------------------------------------------------------


@dataclass
class Target:
    port: int
    probe: str  # "https://127.0.0.1:P" (the webhook port) or "http://127.0.0.1:Q" (a probe port of its own)
    client_auth: bool


def supports(src: Path, flag: str) -> bool:
    proc = subprocess.run([sys.executable, "-m", "tessera", "controller", "--help"], cwd=src,
                          env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True, check=False)
    return flag in proc.stdout


def start_controller(work: Path, src: Path, plane: ControlPlane, certs: Certs,
                     client_auth: bool) -> tuple[ManagedProcess, Target]:
    cert, key = certs.issue("tessera-webhook", ExtendedKeyUsageOID.SERVER_AUTH)
    port = free_port()
    argv = [sys.executable, "-m", "tessera", "--log-format=json", "--log-level=warning", "controller",
            f"--kubeconfig={plane.kubeconfig}", f"--tls-cert={cert}", f"--tls-key={key}",
            f"--listen=127.0.0.1:{port}", "--metrics-addr="]
    probe = f"https://127.0.0.1:{port}"
    if supports(src, "--probe-addr"):
        probe_port = free_port()
        argv.append(f"--probe-addr=127.0.0.1:{probe_port}")
        probe = f"http://127.0.0.1:{probe_port}"
    if client_auth:
        argv.append(f"--client-ca={certs.ca_file}")
    process = ManagedProcess("controller", argv, work / "controller.log", env={"PYTHONPATH": str(src)},
                             cwd=src).start()
    target = Target(port, probe, client_auth)
    wait_for(lambda: process.alive_and(lambda: probe_once(target, "/readyz")[0] == 200), timeout=120,
             what=f"the controller to be ready (log {process.log_path})")
    return process, target


def register_webhooks(kube: Kube, certs: Certs, port: int) -> None:
    def hook(name: str, path: str, operations: list[str]) -> dict[str, Any]:
        return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                "timeoutSeconds": WEBHOOK_TIMEOUT_S,
                "clientConfig": {"url": f"https://127.0.0.1:{port}{path}",
                                 "caBundle": base64.b64encode(certs.ca_pem).decode()},
                "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"], "operations": operations,
                           "resources": ["resourceclaims", "resourceclaimtemplates"], "scope": "*"}]}

    kube.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": "tessera"},
                "webhooks": [hook("resourceclaims.gpu.tessera.dev", "/validate-resourceclaim", ["CREATE", "UPDATE"])]})
    kube.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "tessera"},
                "webhooks": [hook("mutate-resourceclaims.gpu.tessera.dev", "/mutate-resourceclaim", ["CREATE"])]})


def publish_inventory(kube: Kube, nodes: int) -> None:
    template = build_slices(load_inventory("template", simulate="dgx-h100-8"), mig_strategy="static")
    for n in range(nodes):
        node = f"dgx-{n:03d}"
        for i, s in enumerate(template):
            spec = dict(s["spec"], nodeName=node, pool=dict(s["spec"]["pool"], name=node))
            kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                         "metadata": {"name": f"{node}-{i}"}, "spec": spec})


@contextlib.contextmanager
def cluster(src: Path, client_auth: bool, nodes: int) -> Iterator[tuple[Kube, Target, Path]]:
    work = Path(tempfile.mkdtemp(prefix="tessera-attack-"))
    certs = Certs(work)
    plane = ControlPlane(work / "cp", harness_path(),
                         admission_control_config=admission_config(certs) if client_auth else None)
    controller: ManagedProcess | None = None
    try:
        kube = plane.start()
        for obj in load_manifests(REPO / "deviceclasses"):
            if obj.get("kind") == "DeviceClass":
                kube.apply(obj)
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        publish_inventory(kube, nodes)
        controller, target = start_controller(work, src, plane, certs, client_auth)
        register_webhooks(kube, certs, target.port)
        wait_for(lambda: try_create(kube, f"warm-{uuid.uuid4().hex[:6]}")[0] == "answered", timeout=60,
                 what="the first claim to pass the webhooks")
        yield kube, target, work
    finally:
        if controller is not None:
            controller.stop()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)


# -- what is measured ------------------------------------------------------------------------------------------


def try_create(kube: Kube, name: str) -> tuple[str, float]:
    started = time.perf_counter()
    try:
        kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims", claim(name),
                     timeout=60)
        outcome = "answered"
    except KubeError as exc:
        if "failed calling webhook" in exc.body:
            outcome = "webhook failed (failurePolicy)"
        elif "denied the request" in exc.body:
            outcome = "denied by the webhook"
        else:
            outcome = f"HTTP {exc.status}"
    except OSError as exc:
        outcome = f"no answer ({type(exc).__name__})"
    return outcome, time.perf_counter() - started


def probe_once(target: Target, path: str) -> tuple[int, float]:
    """One kubelet-style probe: a new connection, no certificate check, 1 s to answer; (status or 0, s)."""
    host, port = target.probe.rsplit("//", 1)[1].split(":")
    started = time.perf_counter()
    conn: http.client.HTTPConnection
    if target.probe.startswith("https"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, int(port), timeout=PROBE_TIMEOUT_S, context=context)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException):
        status = 0
    finally:
        conn.close()
    elapsed = time.perf_counter() - started
    return (status if elapsed <= PROBE_TIMEOUT_S else 0), elapsed


@dataclass
class Phase:
    name: str
    reviews: list[tuple[str, float]] = field(default_factory=list)
    probes: list[tuple[int, float]] = field(default_factory=list)
    attack: Counter[str] = field(default_factory=Counter)


def measure(kube: Kube, target: Target, phase: Phase, reviews: int, rate: float) -> None:
    """`reviews` claim creations started at `rate` a second (open loop: a slow answer does not slow the
    next start), and a pair of probes every 0.5 s until the last creation ends."""
    done = threading.Event()

    def probes() -> None:
        while not done.is_set():
            for path in ("/healthz", "/readyz"):
                phase.probes.append(probe_once(target, path))
            done.wait(0.5)

    prober = threading.Thread(target=probes, daemon=True)
    prober.start()
    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        futures = []
        for n in range(reviews):
            futures.append(pool.submit(try_create, kube, f"{phase.name.split()[0]}-{n}-{uuid.uuid4().hex[:4]}"))
            time.sleep(1 / rate)
        phase.reviews = [f.result() for f in futures]
    done.set()
    prober.join()


# -- the attacks (each in a process of its own, so their client work is not this process's) -------------------


def idle_attack(port: int, connections: int, stop: Any, results: Any) -> None:
    counts: Counter[str] = Counter()
    parent = os.getppid()

    async def one() -> None:
        while not stop.is_set() and os.getppid() == parent:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(HOSTILE_SOURCE, 0))
            except OSError:
                counts["connect failed"] += 1
                await asyncio.sleep(1)
                continue
            counts["connections opened"] += 1
            while not stop.is_set():
                try:
                    if not await asyncio.wait_for(reader.read(4096), timeout=0.5):
                        counts["dropped by the server"] += 1
                        break
                except TimeoutError:
                    continue
                except OSError:
                    counts["reset by the server"] += 1
                    break
            writer.close()
            await asyncio.sleep(1)  # re-open a second after each drop

    async def main() -> None:
        await asyncio.gather(*(one() for _ in range(connections)))

    asyncio.run(main())
    results.put(("idle", counts))


def poster_attack(port: int, clients: int, heavy: bool, stop: Any, results: Any) -> None:
    import aiohttp

    counts: Counter[str] = Counter()
    parent = os.getppid()
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # an attacker does not care who answers
    url = f"https://127.0.0.1:{port}/validate-resourceclaim?timeout={WEBHOOK_TIMEOUT_S}s"

    async def one(session: Any, n: int) -> None:
        i = 0
        while not stop.is_set() and os.getppid() == parent:
            i += 1
            try:
                async with session.post(url, data=review_body(n * 100000 + i, heavy),
                                        headers={"Content-Type": "application/json"}) as response:
                    body = await response.read()
                    if response.status == 200:
                        allowed = json.loads(body)["response"]["allowed"]
                        counts["200 allowed" if allowed else "200 denied"] += 1
                    else:
                        counts[f"HTTP {response.status}"] += 1
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                counts[f"failed: {type(exc).__name__}"] += 1
                await asyncio.sleep(0.05)

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=0, ssl=context, local_addr=(HOSTILE_SOURCE, 0))
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await asyncio.gather(*(one(session, n) for n in range(clients)))

    asyncio.run(main())
    results.put(("posters", counts))


@contextlib.contextmanager
def attacks(port: int, idle: int, posters: int, phase: Phase, *, heavy: bool, settle_s: float) -> Iterator[None]:
    spawn = multiprocessing.get_context("spawn")
    stop, results = spawn.Event(), spawn.Queue()
    processes = []
    if idle:
        processes.append(spawn.Process(target=idle_attack, args=(port, idle, stop, results), daemon=True))
    if posters:
        processes.append(spawn.Process(target=poster_attack, args=(port, posters, heavy, stop, results), daemon=True))
    for p in processes:
        p.start()
    time.sleep(settle_s)  # every idle connection open, every poster with a review in flight
    try:
        yield
    finally:
        stop.set()
        for _ in processes:
            try:
                name, counts = results.get(timeout=60)
                phase.attack.update({f"{name}: {k}": v for k, v in counts.items()})
            except Exception:  # the queue raises queue.Empty; nothing else is expected
                phase.attack["(an attack process did not report)"] += 1
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


# -- report ---------------------------------------------------------------------------------------------------------


def ms(samples: list[float]) -> str:
    if not samples:
        return "-"
    ordered = sorted(samples)
    return " / ".join(f"{percentile(ordered, q) * 1000:.0f}" for q in (50, 99, 100))


def render(phases: list[Phase], header: str) -> str:
    rows = []
    for p in phases:
        outcomes = Counter(o for o, _ in p.reviews)
        answered = outcomes["answered"]
        others = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()) if k != "answered") or "-"
        ok = sum(1 for s, t in p.probes if s == 200 and t <= PROBE_TIMEOUT_S)
        rows.append([p.name, f"{answered}/{len(p.reviews)}", ms([t for _, t in p.reviews]), others,
                     f"{ok}/{len(p.probes)}", ms([t for _, t in p.probes])])
    out = [header, "", table(["phase", "claims answered", "claim p50 / p99 / max ms", "not answered",
                              "probes ok in 1 s", "probe p50 / p99 / max ms"], rows), ""]
    for p in phases:
        if p.attack:
            out.append(f"- {p.name}, attackers saw: " + ", ".join(f"{k} {v}" for k, v in sorted(p.attack.items())))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--controller-src", type=Path, default=REPO, help="checkout whose `tessera controller` runs")
    parser.add_argument("--client-auth", action=argparse.BooleanOptionalAction, default=True,
                        help="the apiserver presents a client certificate and the webhook requires one "
                             "(only where the controller has --client-ca)")
    parser.add_argument("--idle", type=int, default=300, help="idle connections (default 300)")
    parser.add_argument("--posters", type=int, default=80, help="direct posting clients (default 80)")
    parser.add_argument("--light-posters", action="store_true", help="posters send the benign claim (about 1 ms)")
    parser.add_argument("--reviews", type=int, default=40, help="benign claims per phase (default 40)")
    parser.add_argument("--rate", type=float, default=2.0, help="benign claims started per second (default 2)")
    parser.add_argument("--nodes", type=int, default=16, help="simulated DGX H100 nodes published (default 16)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds the attacks run before measuring")
    args = parser.parse_args(argv)
    src = args.controller_src.resolve()
    client_auth = args.client_auth and supports(src, "--client-ca")
    loadavg = os.getloadavg()
    phases = [Phase("quiet"), Phase(f"idle {args.idle}"), Phase(f"posters {args.posters}"),
              Phase(f"idle {args.idle} + posters {args.posters}")]
    with cluster(src, client_auth, args.nodes) as (kube, target, _):
        for phase, (idle, posters) in zip(phases, [(0, 0), (args.idle, 0), (0, args.posters),
                                                   (args.idle, args.posters)], strict=True):
            with attacks(target.port, idle, posters, phase, heavy=not args.light_posters,
                         settle_s=args.settle if idle or posters else 0):
                measure(kube, target, phase, args.reviews, args.rate)
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "(not a git checkout)"
    facts = machine()
    header = "\n".join([
        f"controller: {src} at {commit}; probes on {target.probe.split(':')[0]} "
        f"({'own port' if target.probe.startswith('http:') else 'the webhook port'}); "
        f"client certificate required: {'yes' if client_auth else 'no'}",
        f"{args.reviews} claims per phase at {args.rate:g}/s through the apiserver, webhook timeoutSeconds "
        f"{WEBHOOK_TIMEOUT_S}, failurePolicy Fail; attackers from {HOSTILE_SOURCE}; posters' reviews "
        f"{'light (the benign claim)' if args.light_posters else 'heavy (about 80 ms each)'}",
        f"machine: {facts['cpus (nproc)']} cpus, {facts['cpu model']}, {facts['memory']}, python {facts['python']}; "
        f"load average at start {loadavg[0]:.1f} / {loadavg[1]:.1f} / {loadavg[2]:.1f} (shared machine)",
    ])
    print(render(phases, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
