"""Bad input, fuzzed: every entry point that reads something a user or another component wrote.

- the gRPC handlers, over the real socket of an in-process plugin: malformed claims, unknown UIDs,
  hostile names, claims of other drivers and other nodes, huge batches, and bytes that are not
  protobuf at all;
- the AdmissionReview parser: request fields of the wrong shape (the structure-aware fuzzing of
  AdmissionReviews through the real HTTPS server is tests/controller/test_fuzz_admission.py);
- the opaque GpuConfig decoder: valid configs with any leaf or subtree replaced;
- the simulated profile loader: valid profiles mutated the same way, and arbitrary text.

The property is the same everywhere: a clear error (of the documented type, naming what is wrong)
or a correct answer; no other exception escapes, and nothing changes on disk. Hypothesis runs with
bounded max_examples and no deadline; the counts land in docs/reliability.md.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.admission import ENDPOINTS, AdmissionHandler, ReviewError
from driver.config import API_VERSION, ConfigError, GpuConfig, decode_gpu_config
from driver.discovery import load_inventory
from driver.errors import DiscoveryError
from driver.model import Inventory
from kubeletplugin.kubeletclaims import ClaimRef
from tests.builders.admission import claim as admission_claim
from tests.builders.admission import multicard_spec, review
from tests.builders.nodefiles import snapshot
from tests.builders.plugin import NODE, make_config
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.kubeletclient import KubeletClient, PluginConnection, short_tmpdir
from tests.paths import REPO

CASES: Counter[str] = Counter()
PROFILES = REPO / "driver" / "profiles"
# TESSERA_FUZZ_EXAMPLES=5000 fuzzes deeper by hand; CI keeps the bounded default
EXAMPLES = int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "250"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64) | st.floats(allow_nan=False) | st.text(
    max_size=40
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
hostile_text = st.sampled_from([
    "", " ", "../../etc/passwd", "..", "/", "a/b", "a\x00b", "\n", "x" * 300, "ü", "${HOME}", "*", "-",
    "00000000-0000-4000-8000-000000000000/..", "CON", "💥",
]) | st.text(max_size=64)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print(f"\nfuzz cases run: {dict(sorted(CASES.items()))}, total {sum(CASES.values())}")


def mutations(base: Any) -> st.SearchStrategy[Any]:
    """`base` with one node (found by a random walk) replaced by any JSON value, or deleted."""

    @st.composite
    def mutate(draw: st.DrawFn) -> Any:
        doc = copy.deepcopy(base)
        node, key = doc, None
        parent: Any = None
        while isinstance(node, dict | list) and node and draw(st.integers(0, 3)) > 0:
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            key = draw(st.sampled_from(keys))
            parent, node = node, node[key]
        if parent is None:
            return draw(json_values)
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[key]
        else:
            parent[key] = draw(json_values)
        return doc

    return mutate()


# -- gRPC handlers -----------------------------------------------------------------------------------


def _claim(uid: str, results: list[dict[str, Any]], name: str = "fuzz", namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}},
        "status": {"allocation": {"devices": {"results": results, "config": []}}},
    }  # fmt: skip


VALID_RESULT = {"request": "gpu", "driver": "gpu.tessera.dev", "pool": NODE, "device": "gpu-2",
                "shareID": "00000000-0000-4000-f000-000000000001", "consumedCapacity": {"memory": "1Gi"}}
FUZZ_UID = "00000000-0000-4000-f000-00000000fuzz".replace("fuzz", "0001")


class Rig:
    def __init__(self, plugin: Any, conn: PluginConnection) -> None:
        self.plugin = plugin
        self.fake: FakeKubeAPI = plugin.fake
        self.conn = conn
        self.dirs = (plugin.config.cdi_dir, plugin.config.state_dir)
        self.baseline = snapshot(*self.dirs)

    def unchanged(self) -> None:
        assert snapshot(*self.dirs) == self.baseline, "a refused claim changed the node"


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    from kubeletplugin.plugin import KubeletPlugin, build_device_state

    with short_tmpdir() as root:
        config = make_config(root)
        inventory = load_inventory(NODE, simulate="mixed")
        fake = FakeKubeAPI()
        fake.add_node(NODE)
        plugin = KubeletPlugin(config, fake, inventory, build_device_state(config, inventory))
        plugin.fake = fake  # type: ignore[attr-defined]
        plugin.start()
        conn = KubeletClient(config.socket_paths.kubelet_dir).register()
        r = Rig(plugin, conn)
        yield r
        conn.close()
        fake.close_watches()
        plugin.stop()


@FUZZ
@given(claim=mutations(_claim(FUZZ_UID, [VALID_RESULT])), ref_uid=st.sampled_from([FUZZ_UID]) | hostile_text)
def test_grpc_prepare_of_malformed_claims(rig: Rig, claim: Any, ref_uid: str) -> None:
    CASES["grpc malformed claims"] += 1
    rig.fake.claims.clear()
    if isinstance(claim, dict):
        rig.fake.claims[("default", "fuzz")] = claim
    ref = ClaimRef("default", "fuzz", ref_uid)
    answer = rig.conn.prepare([ref])[ref_uid]
    if answer.error:
        assert "internal error" not in answer.error, answer.error
        assert len(answer.error) > 20 and answer.devices == []
        rig.unchanged()
    else:  # the mutation left a claim tessera can prepare: it must release it again completely
        assert [d["device_name"] for d in answer.devices] == ["gpu-2"]
        assert rig.conn.unprepare([ref]) == {ref_uid: ""}
        rig.unchanged()


@FUZZ
@given(refs=st.lists(st.tuples(hostile_text, hostile_text, hostile_text), min_size=1, max_size=8,
                     unique_by=lambda t: t[2]),
       driver=st.sampled_from(["gpu.tessera.dev", "gpu.nvidia.com", ""]),
       pool=st.sampled_from([NODE, "node-b", ""]))
def test_grpc_unknown_uids_hostile_names_other_drivers_and_nodes(
    rig: Rig, refs: list[tuple[str, str, str]], driver: str, pool: str
) -> None:
    CASES["grpc unknown/hostile/foreign claims"] += 1
    rig.fake.claims.clear()
    for namespace, name, uid in refs[::2]:  # half exist, with a result of another driver or node
        rig.fake.claims[(namespace, name)] = _claim(uid, [{**VALID_RESULT, "driver": driver, "pool": pool}],
                                                    name, namespace)  # fmt: skip
    claims = [ClaimRef(ns, name, uid) for ns, name, uid in refs]
    answers = rig.conn.prepare(claims)
    for c in claims:
        ok = (driver, pool) == ("gpu.tessera.dev", NODE) and c in [ClaimRef(*r) for r in refs[::2]]
        if not ok:
            assert answers[c.uid].error, f"{c} was prepared"
    released = rig.conn.unprepare(claims)
    for c in claims:
        if answers[c.uid].error == "" or _plain_uid(c.uid):
            assert released[c.uid] == ""
        else:  # a uid that cannot name a file is refused, never used
            assert "not a plain token" in released[c.uid]
    rig.unchanged()


def _plain_uid(uid: str) -> bool:
    from driver.cdi import CdiError, check_claim_uid

    try:
        check_claim_uid(uid)
    except CdiError:
        return False
    return True


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (None, "the apiserver answered a NoneType, not an object"),
        ([], "the apiserver answered a list, not an object"),
        ({"metadata": "x"}, "metadata must be an object, got str"),
        ({"metadata": {"uid": FUZZ_UID}, "status": []}, "status must be an object, got list"),
        ({"metadata": {"uid": FUZZ_UID}, "status": {"allocation": 3}}, "allocation must be an object, got int"),
        ({"metadata": {"uid": FUZZ_UID}, "status": {"allocation": {"devices": []}}}, "devices must be an object"),
        ({"metadata": {"uid": FUZZ_UID}, "status": {"allocation": {"devices": {"results": 7}}}},
         "status.allocation.devices.results must be a list, got int"),
    ],
)
def test_grpc_claims_of_the_wrong_shape_get_a_clear_error(rig: Rig, claim: Any, message: str) -> None:
    CASES["grpc wrong-shape claims"] += 1
    rig.fake.claims.clear()
    rig.fake.claims[("default", "fuzz")] = claim
    answer = rig.conn.prepare([ClaimRef("default", "fuzz", FUZZ_UID)])[FUZZ_UID]
    assert message in answer.error
    assert answer.error.startswith("ResourceClaim default/fuzz")
    rig.unchanged()


def test_grpc_huge_batch_gets_one_answer_per_claim(rig: Rig) -> None:
    CASES["grpc huge batch (5000 claims)"] += 1
    rig.fake.claims.clear()
    claims = [ClaimRef("default", f"c{n}", f"00000000-0000-4000-a000-{n:012d}") for n in range(5000)]
    answers = rig.conn.prepare(claims, timeout=120)
    assert len(answers) == 5000
    assert all("does not exist" in a.error for a in answers.values())
    assert set(rig.conn.unprepare(claims, timeout=120).values()) == {""}
    rig.unchanged()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=512), method=st.sampled_from(["NodePrepareResources", "NodeUnprepareResources"]))
def test_grpc_bytes_that_are_not_protobuf(rig: Rig, payload: bytes, method: str) -> None:
    CASES["grpc raw bytes"] += 1
    channel = grpc.insecure_channel(f"unix:{rig.plugin.config.socket_paths.dra_socket}")
    try:
        # no serializers: the payload goes on the wire as it is
        call = channel.unary_unary(f"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}",
                                   request_serializer=None, response_deserializer=None)
        try:
            call(payload, timeout=10)
        except grpc.RpcError as err:  # refused as a bad message, never a crash or a hang
            assert err.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT), err
    finally:
        channel.close()
    rig.unchanged()
    assert rig.conn.prepare([]) == {}  # still serving


# -- AdmissionReview ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("kind",), True, "request.kind must be an object"),
        (("object",), [], "request.object must be an object, got list"),
        (("object", "metadata"), "x", "request.object.metadata must be an object, got str"),
        (("oldObject",), 3, "request.oldObject must be an object, got int"),
    ],
)
def test_admission_request_fields_of_the_wrong_shape_are_a_bad_request(
    handler: AdmissionHandler, path: tuple[str, ...], value: Any, message: str
) -> None:
    CASES["admission wrong-shape requests"] += 1
    body = copy.deepcopy(_CLAIM_REVIEW)
    target = body["request"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    for endpoint in ENDPOINTS:  # once found by the mutation fuzzer: an AttributeError, a 500
        with pytest.raises(ReviewError, match=message):
            handler.review(endpoint, body)


_CLAIM_REVIEW = review(admission_claim(multicard_spec()))


# -- opaque config -------------------------------------------------------------------------------------

_CONFIG = {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {
    "strategy": "MPS", "mps": {"activeThreadPercentage": 50}, "totalMemory": "8Gi", "sameNVLinkIsland": True}}


@FUZZ
@given(raw=mutations(_CONFIG))
def test_config_with_any_field_replaced(raw: Any) -> None:
    CASES["opaque config mutations"] += 1
    path = "spec.devices.config[0].opaque.parameters"
    try:
        got = decode_gpu_config(raw, path)
    except ConfigError as exc:
        assert exc.field_path.startswith(path) and exc.message
    else:
        assert isinstance(got, GpuConfig)


# -- simulated profiles --------------------------------------------------------------------------------

_PROFILE = yaml.safe_load((PROFILES / "mixed.yaml").read_text())


def _load(tmp: Path, text: str) -> None:
    path = tmp / "profile.yaml"
    path.write_text(text)
    try:
        inventory = load_inventory(NODE, simulate=str(path))
    except DiscoveryError as exc:
        assert str(exc)
    else:
        assert isinstance(inventory, Inventory)


@FUZZ
@given(doc=mutations(_PROFILE))
def test_profile_with_any_field_replaced(tmp_path: Path, doc: Any) -> None:
    CASES["profile mutations"] += 1
    _load(tmp_path, yaml.safe_dump(doc))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300) | st.sampled_from(["gpus: [", "{{{", "gpus: !!python/object:os.system x",
                                                     "a: &a [*a]", "\t- x", "gpus:\n  - count: 100000000"]))
def test_profile_arbitrary_text(tmp_path: Path, text: str) -> None:
    CASES["profile arbitrary text"] += 1
    _load(tmp_path, text)
