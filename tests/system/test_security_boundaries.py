"""Security boundaries of the node agent and the webhook.

- files and sockets get least permissions whatever the process umask (000 is what some runtimes
  hand a container), checked on a live plugin after a real prepare;
- the plugin writes only under its configured directories: hostile claim UIDs and names over
  gRPC, and a symlink planted where a CDI spec will go, reach nothing outside;
- the webhook speaks TLS 1.2+ only (the server itself refuses an older handshake), refuses bodies
  over 3 MiB without reading them, and refuses hostile CEL (too long, too costly) in bounded time,
  which is measured and printed, never asserted as a timing.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import stat
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.admission import AdmissionHandler
from controller.webhook import MAX_BODY_BYTES, CertificateStore, WebhookServer
from driver.cel.limits import MAX_EXPRESSION_BYTES
from kubeletplugin.kubeletclaims import ClaimRef
from tests.builders.plugin import NODE, add_share_claim, make_config, uid
from tests.builders.webhook import CA
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.kubeletclient import KubeletClient, short_tmpdir

# -- the node agent ------------------------------------------------------------------------------------


def running_plugin(root: Path) -> Any:
    from driver.discovery import load_inventory
    from kubeletplugin.plugin import KubeletPlugin, build_device_state

    config = make_config(root)
    inventory = load_inventory(NODE, simulate="mixed")
    fake = FakeKubeAPI()
    fake.add_node(NODE)
    plugin = KubeletPlugin(config, fake, inventory, build_device_state(config, inventory))
    plugin.fake = fake  # type: ignore[attr-defined]
    plugin.start()
    return plugin


def stop(plugin: Any) -> None:
    plugin.fake.close_watches()
    plugin.stop()


def modes(root: Path) -> dict[str, tuple[str, int]]:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        kind = "socket" if stat.S_ISSOCK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
        out[str(p.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode))
    return out


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_files_and_sockets_get_least_permissions_whatever_the_umask(umask: int) -> None:
    previous = os.umask(umask)
    try:
        with short_tmpdir() as root:
            plugin = running_plugin(root)
            try:
                ref = add_share_claim(plugin.fake, "share", uid(1))
                with KubeletClient(plugin.config.socket_paths.kubelet_dir).register() as conn:
                    assert conn.prepare([ref])[ref.uid].error == ""
                got = modes(root)
            finally:
                stop(plugin)
    finally:
        os.umask(previous)
    shared = ("/pipe", "/shm")  # the MPS client dirs every container user must write: sticky 1777, by design
    for path, (kind, mode) in got.items():
        if any(s + "/" in path or path.endswith(s) for s in shared):
            if path.endswith(shared):
                assert mode == 0o1777, (path, oct(mode))
            continue
        if kind == "socket":
            assert mode == 0o660, (path, oct(mode))  # whoever connects can hand out GPUs: kubelet's group only
            continue
        assert mode & 0o022 == 0, f"{path} ({kind}) is group/world-writable: {oct(mode)}"
        if path.startswith("kubelet") and kind == "dir":
            assert mode == 0o750, (path, oct(mode))
        if path.startswith("state/") and kind == "file":
            assert mode & 0o077 == 0 or path.endswith("control.log"), (path, oct(mode))
    assert got["state/checkpoint.json"] == ("file", 0o600)
    assert got[f"cdi/gpu.tessera.dev-claim_{uid(1)}.json"] == ("file", 0o644)  # runtimes read it


HOSTILE_UIDS = ["../../../../tmp/tessera-escape", "..", "a/../../b", "/etc/passwd", "x\x00y", "~root", "uid;rm -rf"]
HOSTILE_NAMES = ["../../../escape", "..", "a/b", "$(touch /tmp/tessera-escape)"]


def test_hostile_uids_and_names_write_nothing_outside_the_configured_dirs() -> None:
    with short_tmpdir() as sandbox:
        root = sandbox / "node"
        root.mkdir()
        (sandbox / "outside").mkdir()
        plugin = running_plugin(root)
        try:
            before_outside = modes(sandbox / "outside")
            with KubeletClient(plugin.config.socket_paths.kubelet_dir).register() as conn:
                refs = [ClaimRef("default", "c", u) for u in HOSTILE_UIDS]
                for n, name in enumerate(HOSTILE_NAMES):  # hostile names with a valid uid: names build no paths
                    refs.append(add_share_claim(plugin.fake, name, f"00000000-0000-4000-8000-{n:012d}"))
                    plugin.fake.claims[("default", name)]["metadata"]["namespace"] = "default"
                answers = conn.prepare(refs)
                for u in HOSTILE_UIDS:
                    assert answers[u].error, u
                unprepared = conn.unprepare(refs)
                for u in HOSTILE_UIDS:
                    assert "not a plain token" in unprepared[u] or unprepared[u] == "", u
            assert modes(sandbox / "outside") == before_outside
            assert sorted(p.name for p in sandbox.iterdir()) == ["node", "outside"]
            assert sorted(p.name for p in root.iterdir()) == ["cdi", "kubelet", "state"]
            assert not Path("/tmp/tessera-escape").exists()
        finally:
            stop(plugin)


def test_a_symlink_planted_at_the_spec_path_is_replaced_not_followed() -> None:
    with short_tmpdir() as sandbox:
        root = sandbox / "node"
        root.mkdir()
        target = sandbox / "victim"
        target.write_text("precious\n")
        plugin = running_plugin(root)
        try:
            ref = add_share_claim(plugin.fake, "share", uid(3))
            spec = plugin.config.cdi_dir / f"gpu.tessera.dev-claim_{uid(3)}.json"
            plugin.config.cdi_dir.mkdir(parents=True, exist_ok=True)
            spec.symlink_to(target)
            with KubeletClient(plugin.config.socket_paths.kubelet_dir).register() as conn:
                assert conn.prepare([ref])[ref.uid].error == ""
                assert not spec.is_symlink() and json.loads(spec.read_text())["kind"] == "gpu.tessera.dev/claim"
                assert conn.unprepare([ref]) == {ref.uid: ""}
            assert target.read_text() == "precious\n"
        finally:
            stop(plugin)


# -- the webhook ------------------------------------------------------------------------------------------


@pytest.fixture
def webhook(tmp_path: Path, handler: AdmissionHandler) -> Iterator[tuple[WebhookServer, CA]]:
    ca = CA()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ca.issue(cert, key)
    server = WebhookServer(handler, CertificateStore(str(cert), str(key)), "127.0.0.1", 0,
                           observe=lambda *args: None, ready=lambda: True)  # fmt: skip
    server.start()
    yield server, ca
    server.stop()


def _client(ca: CA, version: ssl.TLSVersion) -> ssl.SSLContext:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = ssl.create_default_context(cadata=ca.pem().decode())
        # level 0 lets this client offer TLS 1.0/1.1 at all, so the refusal below is the server's
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        ctx.minimum_version = version
        ctx.maximum_version = version
    return ctx


@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
def test_webhook_refuses_tls_below_1_2_with_a_protocol_version_alert(webhook: Any, version: str) -> None:
    server, ca = webhook
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=_client(ca, ssl.TLSVersion[version]),
                                       timeout=10)  # fmt: skip
    # the server refuses the handshake; asyncio's TLS layer closes without flushing the protocol_version
    # alert, so the client sees either the alert or the connection closing mid-handshake
    with pytest.raises(ssl.SSLError, match=r"ALERT_PROTOCOL_VERSION|UNEXPECTED_EOF"):
        conn.request("GET", "/healthz")


@pytest.mark.parametrize("version", ["TLSv1_2", "TLSv1_3"])
def test_webhook_serves_tls_1_2_and_1_3(webhook: Any, version: str) -> None:
    server, ca = webhook
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=_client(ca, ssl.TLSVersion[version]),
                                       timeout=10)  # fmt: skip
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    assert conn.sock.version() == version.replace("_", ".").replace("TLSv1.", "TLSv1.")


def _post(server: WebhookServer, ca: CA, body: bytes) -> tuple[int, bytes, float]:
    ctx = ssl.create_default_context(cadata=ca.pem().decode())
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=120)
    start = time.perf_counter()
    conn.request("POST", "/validate-resourceclaim", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    return response.status, data, time.perf_counter() - start


def _claim_review(selectors: list[str], requests: int = 1) -> bytes:
    reqs = [{"name": f"r{n}", "exactly": {"deviceClassName": "gpu.tessera.dev",
                                          "selectors": [{"cel": {"expression": e}} for e in selectors]}}
            for n in range(requests)]  # fmt: skip
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "hostile", "namespace": "team-a"}, "spec": {"devices": {"requests": reqs}}}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "6a1c1f8e-0000-4000-8000-00000000beef", "operation": "CREATE", "name": "hostile",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}, "object": obj}}).encode()


def test_webhook_refuses_a_body_over_3_mib_without_reading_it(webhook: Any) -> None:
    server, ca = webhook
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10,
                                       context=ssl.create_default_context(cadata=ca.pem().decode()))
    conn.putrequest("POST", "/validate-resourceclaim")
    conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    conn.endheaders()  # and no body: the answer must not wait for 3 MiB that never come
    response = conn.getresponse()
    assert response.status == 413 and b"over the 3145728-byte limit" in response.read()


D = 'device.attributes["gpu.tessera.dev"]'
BIG_LIST = "[" + ",".join(str(n) for n in range(200)) + "]"
HOSTILE_SELECTORS = {
    "over the length limit": f'{D}.productName == "' + "x" * MAX_EXPRESSION_BYTES + '"',
    "cost bomb (nested comprehensions)": f"{BIG_LIST}.all(a, {BIG_LIST}.all(b, {BIG_LIST}.all(c, a + b + c >= 0)))",
    "cost bomb (regex and string building per element)": (
        f'{BIG_LIST}.exists(a, {D}.productName.matches("(a+)+$") && '
        f'{BIG_LIST}.all(b, {BIG_LIST}.all(c, {D}.productName + {D}.productName != "x")))'
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SELECTORS))
def test_hostile_selectors_are_refused_in_bounded_time(webhook: Any, name: str) -> None:
    server, ca = webhook
    status, body, seconds = _post(server, ca, _claim_review([HOSTILE_SELECTORS[name]]))
    response = json.loads(body)["response"]
    print(f"hostile selector {name!r}: refused in {seconds * 1000:.1f} ms")
    assert status == 200 and response["allowed"] is False
    assert "exceed" in response["status"]["message"] or "too" in response["status"]["message"], response


@pytest.mark.slow
def test_a_review_packed_with_selectors_up_to_the_body_limit_is_answered(webhook: Any) -> None:
    server, ca = webhook
    selector = f'{D}.productName.startsWith("NVIDIA") && ' + " && ".join(
        f'{D}.productName != "model-{n}"' for n in range(140))
    body = _claim_review([selector] * 16, requests=32)  # every selector valid, trimmed to 3 MiB below
    while len(body) > MAX_BODY_BYTES:
        body = _claim_review([selector] * 16, requests=len(json.loads(body)["request"]["object"]["spec"]["devices"]
                                                        ["requests"]) - 1)  # fmt: skip
    status, data, seconds = _post(server, ca, body)
    response = json.loads(data)["response"]
    print(f"review of {len(body)} bytes packed with selectors answered in {seconds:.2f} s: "
          f"allowed={response['allowed']} {response.get('status', {}).get('message', '')[:300]!r}")
    assert status == 200
    assert response["allowed"] or "too long" not in response["status"]["message"], "the selectors must be valid"
