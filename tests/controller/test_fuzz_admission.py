"""AdmissionReviews, fuzzed by structure, through the real HTTPS server (controller/webhook.py).

Every case starts from a valid review (a DeviceClass with selectors and a GpuConfig, a ResourceClaim
or ResourceClaimTemplate with selectors, capacity, count, firstAvailable, constraints and GpuConfig
opaque parameters) and makes one thing wrong: one field anywhere in the object, chosen uniformly
among all of them so that deep fields (`exactly.count`, `opaque.parameters.sharing.totalMemory`,
a selector) are as likely as the envelope, replaced by a value of the wrong type, a boundary value,
a hostile selector or a deeply nested document, or deleted. Other cases damage the HTTP request
itself (Content-Length). The server's answer must be a well-formed AdmissionReview for the same uid
(a change inside `request.object.spec` must reach the checks: 200, never a 400 from the envelope),
or a 4xx with a message; never a 500 and never a connection closed without an answer.

Each property was checked against the defects of issue 12 put back one at a time (ZeroDivisionError
on `count: 0`, RecursionError on deep nesting, `Content-Length: ²`): each fails its test.
"""

from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import socket
import ssl
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controller import webhook
from controller.admission import AdmissionHandler
from controller.checks.inputs import CheckContext
from controller.cluster.inventory import DeviceIndex
from controller.cluster.sampledevices import sample_index
from controller.cluster.schema import published_schema
from controller.webhook import CertificateStore, WebhookServer
from driver.discovery import load_inventory
from driver.slices import build_slices
from tests.builders.webhook import CA, client_context

CASES: Counter[str] = Counter()
EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "250"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
UID = "7d1f6c2a-0000-4000-8000-00000000f022"
D = 'device.attributes["gpu.tessera.dev"]'
GPU_CONFIG = {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
              "sharing": {"strategy": "MPS", "mps": {"activeThreadPercentage": 50}}}
MULTI_CARD_CONFIG = {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
                     "sharing": {"totalMemory": "16Gi", "sameNVLinkIsland": True}}
TIME_SLICING_CONFIG = {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig",
                       "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}}

DEVICE_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mps.gpu.tessera.dev"},
    "spec": {
        "selectors": [{"cel": {"expression": f'device.driver == "gpu.tessera.dev" && {D}.type == "gpu"'}},
                      {"cel": {"expression": f'{D}.productName.lowerAscii().contains("h100")'}}],
        "config": [{"opaque": {"driver": "gpu.tessera.dev", "parameters": GPU_CONFIG}}],
    },
}
CLAIM_SPEC: dict[str, Any] = {"devices": {
    "requests": [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.tessera.dev", "allocationMode": "ExactCount",
                                     "count": 2,
                                     "selectors": [{"cel": {"expression": f'{D}.cudaComputeCapability.isGreaterThan('
                                                                          'semver("8.0.0"))'}}]}},
        {"name": "share", "exactly": {"deviceClassName": "gpu.tessera.dev",
                                      "capacity": {"requests": {"memory": "10Gi"}}}},
        {"name": "any", "firstAvailable": [
            {"name": "mig", "deviceClassName": "gpu.tessera.dev", "count": 1,
             "selectors": [{"cel": {"expression": f'{D}.type == "mig" && {D}.profile == "1g.10gb"'}}]},
            {"name": "whole", "deviceClassName": "gpu.tessera.dev", "count": 1}]},
    ],
    "constraints": [{"requests": ["gpus"], "matchAttribute": "gpu.tessera.dev/nvlinkIsland"}],
    "config": [
        {"requests": ["gpus"], "opaque": {"driver": "gpu.tessera.dev", "parameters": MULTI_CARD_CONFIG}},
        {"requests": ["share"], "opaque": {"driver": "gpu.tessera.dev", "parameters": GPU_CONFIG}},
        {"requests": ["any"], "opaque": {"driver": "gpu.tessera.dev", "parameters": TIME_SLICING_CONFIG}},
    ],
}}
SHARE_CLAIM: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "share", "namespace": "team-a"}, "spec": {"devices": {
                   "requests": [{"name": "share", "exactly": {"deviceClassName": "gpu.tessera.dev",
                                                              "capacity": {"requests": {"memory": "10Gi"}}}}],
                   "config": [{"requests": ["share"],
                               "opaque": {"driver": "gpu.tessera.dev", "parameters": GPU_CONFIG}}]}}}
CLAIM: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "fuzz", "namespace": "team-a", "annotations": {"a": "b"}}, "spec": CLAIM_SPEC}
TEMPLATE: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "fuzz", "namespace": "team-a"}, "spec": {"spec": CLAIM_SPEC}}
ENDPOINT_OF = {"DeviceClass": ["/validate-deviceclass"],
               "ResourceClaim": ["/mutate-resourceclaim", "/validate-resourceclaim"],
               "ResourceClaimTemplate": ["/mutate-resourceclaim", "/validate-resourceclaim"]}


def review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": UID, "kind": {"group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": obj["kind"].lower() + "s"},
        "operation": operation, "name": obj["metadata"]["name"], "namespace": obj["metadata"].get("namespace", ""),
        "object": obj, "oldObject": None, "dryRun": False}}


# -- what a wrong value can be ---------------------------------------------------------------------------

HUNDRED = "[" + ", ".join(str(i) for i in range(100)) + "]"
HOSTILE_SELECTORS = [
    "", " ", "device.", "true &&", '"unterminated', "device.driver == 1", "device.nope",
    f"{D}.uuid == 'x'",  # unguarded: only full GPUs carry it
    "(" * 900 + "true" + ")" * 900, "!" * 249 + "true", " && ".join(["true"] * 300),
    "device.attributes" + ".x" * 400 + " == 1",
    f"{HUNDRED}.all(a, {HUNDRED}.all(b, a + b >= 0))", "lists.range(20000).all(a, a >= 0)",
    'cel.bind(v0, "' + "x" * 64 + '", ' + "".join(f"cel.bind(v{i}, v{i - 1} + v{i - 1}, " for i in range(1, 24))
    + "v23.size() > 0" + ")" * 24,
    "x" * 10241, "device.driver.matches('(')", "1/0 == 1", '"a" + 1 == "a1"',
]  # fmt: skip
BOUNDARY: list[Any] = [0, -1, 1, 2**31, 2**63 - 1, -(2**63), 2**64, 1.5, -0.0, 1e308, True, False, None, "", "0", "-1",
            "²", "1e3", "NaN", "16Gi", "0Gi", "-8Gi", "1Ei", "x" * 300, "💥", "../x", {}, []]
json_scalars = st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False) | st.text(
    max_size=40)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)


class Nested:
    """Lists nested `depth` deep, spliced into the JSON text (a deep Python list would trip recursion
    in json.dumps, deepcopy and hypothesis' printer long before the server sees it)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth

    def __repr__(self) -> str:
        return f"Nested({self.depth})"

    @property
    def marker(self) -> str:
        return f"@@nested-{self.depth}@@"


def encode(doc: Any) -> bytes:
    depths: list[int] = []

    def default(value: Any) -> Any:
        if isinstance(value, Nested):
            depths.append(value.depth)
            return value.marker
        raise TypeError(type(value).__name__)

    text = json.dumps(doc, default=default)
    for depth in depths:
        text = text.replace(json.dumps(Nested(depth).marker), "[" * depth + "]" * depth)
    return text.encode()


wrong_values = st.one_of(
    json_values,
    st.sampled_from(BOUNDARY),
    st.sampled_from(HOSTILE_SELECTORS),
    st.sampled_from([80, 101, 150, 900, 5000]).map(Nested),
)


def paths(doc: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every node of the document, the root excluded."""
    if isinstance(doc, dict):
        items: list[tuple[Any, Any]] = list(doc.items())
    elif isinstance(doc, list):
        items = list(enumerate(doc))
    else:
        return
    for key, value in items:
        yield (*here, key)
        yield from paths(value, (*here, key))


@st.composite
def one_field_wrong(draw: st.DrawFn, base: dict[str, Any]) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """A copy of `base` with one node, chosen uniformly among all, replaced by a wrong value or deleted."""
    doc = copy.deepcopy(base)
    path = draw(st.sampled_from(list(paths(doc))))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and draw(st.integers(0, 5)) == 0:
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(wrong_values)
    return doc, path


# -- the server ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WebhookServer, ssl.SSLContext]]:
    # a Content-Length larger than the body makes the server wait for the rest: 1 s, not 10
    saved_body_timeout, webhook.BODY_TIMEOUT_S = webhook.BODY_TIMEOUT_S, 1.0
    ca = CA()
    root = tmp_path_factory.mktemp("fuzz-tls")
    cert, key = root / "tls.crt", root / "tls.key"
    ca.issue(cert, key)
    index = DeviceIndex.from_slices(build_slices(load_inventory("node-a", simulate="mixed"), mig_strategy="static"))
    classes = {"gpu.tessera.dev": DEVICE_CLASS | {"metadata": {"name": "gpu.tessera.dev"}}}

    def context() -> CheckContext:
        return CheckContext(schema=published_schema(), samples=sample_index(), inventory=index,
                            classes=classes, classes_complete=True)

    srv = WebhookServer(AdmissionHandler(context), CertificateStore(str(cert), str(key)), "127.0.0.1", 0)
    srv.start()
    yield srv, client_context(ca)
    print(f"\nadmission fuzz cases: {dict(sorted(CASES.items()))}, total {sum(CASES.values())}")
    srv.stop()
    webhook.BODY_TIMEOUT_S = saved_body_timeout


def send(served: tuple[WebhookServer, ssl.SSLContext], path: str, body: bytes,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One request on a fresh connection; an answer that never comes is a test failure, not an exception."""
    srv, context = served
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=context, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    except (http.client.HTTPException, ConnectionError, ssl.SSLError) as exc:
        pytest.fail(f"{path}: no answer, the connection failed: {exc!r}")
    finally:
        conn.close()


def check_answer(status: int, body: bytes, *, must_review: bool, uid: Any = UID) -> dict[str, Any] | None:
    assert status != 500, body
    if status != 200:
        assert 400 <= status < 500, (status, body)
        assert not must_review, f"a change inside the object's spec got {status}: {body[:300]!r}"
        assert body.strip(), "a 4xx must say why"
        return None
    answer = json.loads(body)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response: dict[str, Any] = answer["response"]
    if isinstance(uid, str):
        assert response["uid"] == uid
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        message = response["status"]["message"]
        assert message.startswith(("tessera rejected", "tessera could not finish")), message
    for warning in response.get("warnings", []):
        assert isinstance(warning, str) and warning
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
        assert isinstance(json.loads(base64.b64decode(response["patch"])), list)
    return response


def in_spec(path: tuple[Any, ...]) -> bool:
    return path[:3] == ("request", "object", "spec") and len(path) > 3


def replaced(doc: Any, path: tuple[Any, ...]) -> Any:
    """The value now at `path` (None when the key was deleted)."""
    for key in path[:-1]:
        doc = doc[key]
    return doc.get(path[-1]) if isinstance(doc, dict) else doc[path[-1]]


def too_deep(value: Any) -> bool:
    """Nested past the server's 100 levels once inside the review (a 400 is the right answer)."""
    return isinstance(value, Nested) and value.depth > 80


def wrong_for(original: Any, key: Any) -> list[Any]:
    """The wrong values the sweep tries for one field, by what the field holds."""
    if key == "expression":
        return HOSTILE_SELECTORS
    if isinstance(original, bool):
        return ["true", 0, None]
    if isinstance(original, int):
        return [0, -1, 2**63, "2", 1.5, None]
    if isinstance(original, str):
        return ["", "x" * 300, "²", "-8Gi", 1, None]
    if isinstance(original, dict):
        return [[], "x", 7, {}, Nested(150), None]
    return [{}, "x", 7, [], [None], Nested(150), None]


# -- the tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("base", "endpoint", "outcome"), [
    (DEVICE_CLASS, "/validate-deviceclass", "allowed"),
    (SHARE_CLAIM, "/validate-resourceclaim", "allowed"),
    (CLAIM, "/mutate-resourceclaim", "mutated"),
    (TEMPLATE, "/mutate-resourceclaim", "mutated"),
    (CLAIM, "/validate-resourceclaim", "denied"),  # the multi-card request needs the mutation first
])  # fmt: skip
def test_the_starting_points_are_valid(served, base: dict[str, Any], endpoint: str, outcome: str) -> None:
    status, body = send(served, endpoint, json.dumps(review(base)).encode())
    response = check_answer(status, body, must_review=True)
    assert response is not None
    got = "mutated" if "patch" in response else ("allowed" if response["allowed"] else "denied")
    assert got == outcome, response


@pytest.mark.parametrize(("base", "endpoint"), [
    (DEVICE_CLASS, "/validate-deviceclass"),
    (CLAIM, "/mutate-resourceclaim"),
    (CLAIM, "/validate-resourceclaim"),
    (TEMPLATE, "/mutate-resourceclaim"),
    (SHARE_CLAIM, "/validate-resourceclaim"),
], ids=["class", "claim-mutate", "claim-validate", "template-mutate", "share-claim-validate"])  # fmt: skip
def test_every_spec_field_wrong_in_turn(served, base: dict[str, Any], endpoint: str) -> None:
    """The systematic half: every field of the spec, each replaced by the wrong values for its kind or
    deleted, one at a time (the random half below also damages the envelope and combines values)."""
    start = review(base)
    failures: list[str] = []
    for path in [p for p in paths(start) if in_spec(p)]:
        original = replaced(start, path)
        for value in [*wrong_for(original, path[-1]), DELETE]:
            doc = copy.deepcopy(start)
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            if value is DELETE:
                if not isinstance(parent, dict):
                    continue
                del parent[path[-1]]
            else:
                parent[path[-1]] = value
            CASES["every spec field in turn"] += 1
            status, body = send(served, endpoint, encode(doc))
            try:
                check_answer(status, body, must_review=not too_deep(value))
            except AssertionError as exc:
                failures.append(f"{'.'.join(map(str, path))} = {value!r:.80}: {str(exc)[:200]}")
    assert not failures, f"{len(failures)} wrong answers:\n" + "\n".join(failures)


DELETE = object()


def _deep_spec() -> tuple[dict[str, Any], tuple[Any, ...]]:
    doc = review(copy.deepcopy(CLAIM))
    doc["request"]["object"]["spec"]["devices"]["config"][0]["opaque"]["parameters"] = Nested(5000)
    return doc, ("request", "object", "spec", "devices", "config", 0, "opaque", "parameters")


@FUZZ
@example(case=_deep_spec(), pick=1)  # json.loads gave up with a RecursionError: an HTTP 500
@given(case=st.sampled_from([DEVICE_CLASS, CLAIM, TEMPLATE]).flatmap(lambda b: one_field_wrong(review(b))),
       pick=st.integers(0, 1))
def test_reviews_with_one_field_wrong(served, case: tuple[dict[str, Any], tuple[Any, ...]], pick: int) -> None:
    doc, path = case
    request = doc.get("request") if isinstance(doc, dict) else None
    obj = request.get("object") if isinstance(request, dict) else None
    kind = obj.get("kind") if isinstance(obj, dict) else None
    endpoints = ENDPOINT_OF.get(kind if isinstance(kind, str) else "", ["/validate-resourceclaim"])
    endpoint = endpoints[pick % len(endpoints)]
    CASES["one field wrong, " + ("inside the spec" if in_spec(path) else "envelope or metadata")] += 1
    status, body = send(served, endpoint, encode(doc))
    uid = request.get("uid") if isinstance(request, dict) else None
    response = check_answer(status, body, must_review=in_spec(path) and not too_deep(replaced(doc, path)), uid=uid)
    if response is not None and in_spec(path):
        CASES["reached the checks"] += 1


@FUZZ
@given(config=one_field_wrong({"parameters": GPU_CONFIG}), where=st.sampled_from(["class", "claim"]))
def test_gpu_config_parameters_with_one_field_wrong(served, config: tuple[dict[str, Any], tuple[Any, ...]],
                                                   where: str) -> None:
    CASES["GpuConfig opaque parameters"] += 1
    parameters = config[0].get("parameters")
    deep = too_deep(replaced(*config))
    if where == "class":
        obj = copy.deepcopy(DEVICE_CLASS)
        obj["spec"]["config"][0]["opaque"]["parameters"] = parameters
        endpoint = "/validate-deviceclass"
    else:
        obj = copy.deepcopy(SHARE_CLAIM)
        obj["spec"]["devices"]["config"][0]["opaque"]["parameters"] = parameters
        endpoint = "/validate-resourceclaim"
    status, body = send(served, endpoint, encode(review(obj)))
    response = check_answer(status, body, must_review=not deep)
    if response is not None and not response["allowed"]:
        assert "opaque.parameters" in response["status"]["message"], response["status"]["message"]


@FUZZ
@example(length="²")  # str.isdigit() took it, int() did not: the connection closed unanswered
@given(length=st.text(min_size=1, max_size=24).filter(lambda t: t.strip() and "\n" not in t and "\r" not in t)
       | st.sampled_from(["²", "٣", "\uff11\uff12", "-1", "+5", "0x10", "1_0", "1e3", " 12 ", "9" * 23]))
def test_content_length_values(served, length: str) -> None:
    CASES["Content-Length values"] += 1
    srv, context = served
    body = json.dumps(review(DEVICE_CLASS)).encode()
    raw = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        header = f"POST /validate-deviceclass HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
        try:
            header_bytes = header.encode("latin-1")
        except UnicodeEncodeError:
            header_bytes = header.encode()  # what a careless client sends
        sock.sendall(header_bytes + body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, ssl.SSLEOFError):
                chunk = b""
            if not chunk:
                break
            answer += chunk
    # aiohttp's parser answers what it cannot parse with an HTTP/1.0 status line
    assert answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), \
        f"Content-Length {length!r}: the connection closed without an answer"
    status = int(answer[9:12])
    assert status != 500 and (status == 200 or 400 <= status < 500), answer[:200]
