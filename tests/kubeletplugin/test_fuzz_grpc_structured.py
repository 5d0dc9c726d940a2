"""Structure-aware fuzzing of NodePrepareResources / NodeUnprepareResources through the real socket.

An in-process plugin serves its real unix socket; kubelet's side is the stand-in client. Two claims
are prepared first and stay prepared. Every case then sends a valid-shaped request for a fresh
claim (a memory share under MPS, or a whole time-sliced GPU) with exactly one field wrong, either
in the request itself (namespace, name, uid) or in the ResourceClaim the apiserver returns
(metadata.uid, a result's driver, pool, request, device, consumed memory, an opaque config field),
batched with the claims already prepared. The properties:

- the wrong claim gets a per-claim error that names the wrong field, and no devices;
- the claims already prepared answer exactly as before in the same call;
- nothing on the node changes (checkpoint, CDI specs, MPS and time-slice records);
- an unprepare of the wrong claim succeeds (it holds nothing) or is refused for an unsafe UID.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.config import API_VERSION
from driver.discovery import load_inventory
from kubeletplugin.kubeletclaims import ClaimRef
from tests.builders.nodefiles import snapshot
from tests.builders.plugin import NODE, make_config
from tests.fakes.apiserver import FakeKubeAPI
from tests.fakes.kubeletclient import ClaimAnswer, KubeletClient, PluginConnection, short_tmpdir

DRIVER = "gpu.tessera.dev"
FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
RESULTS = "status.allocation.devices.results[0]"
PARAMS = "status.allocation.devices.config[0].opaque.parameters"


def _claim(name: str, uid: str, result: dict[str, Any], sharing: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, **result}],
            "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing}}}],
        }}},
    }  # fmt: skip


def share_claim(name: str, uid: str, memory: str = "1Gi") -> dict[str, Any]:
    return _claim(name, uid, {"device": "gpu-2", "shareID": f"{uid[:-4]}5e7a", "consumedCapacity": {"memory": memory}},
                  {"strategy": "MPS", "mps": {"activeThreadPercentage": 50}})  # fmt: skip


def timesliced_claim(name: str, uid: str) -> dict[str, Any]:
    return _claim(name, uid, {"device": "gpu-3"}, {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}})


BASES = {"share": share_claim, "time-sliced": timesliced_claim}

# (base, where, field, wrong values, words the error must contain besides the field)
# where: "ref" edits the ClaimRef kubelet sends, "claim" edits the ResourceClaim at a dotted path,
# "both" gives the claim and kubelet's request the same (unsafe) uid
CLAIM_FIELDS: list[tuple[str, str, str, list[Any], str]] = [
    ("*", "ref", "namespace", ["kube-system", "Default"], "does not exist"),
    ("*", "ref", "name", ["other", "fuzz-claim-x"], "does not exist"),
    ("*", "ref", "uid", ["00000000-0000-4000-8000-00000000beef"], "but kubelet asked for uid"),
    ("*", "both", "uid", ["abc\n", "../../etc", "a b"], "not a plain token"),  # the claim's own uid unsafe
    ("*", "claim", "metadata.uid", ["00000000-0000-4000-8000-00000000beef", ""], "but kubelet asked for uid"),
    ("*", "claim", f"{RESULTS}.driver", ["gpu.nvidia.com", "gpu.tessera.dev\n"], "no device allocated by"),
    ("*", "claim", f"{RESULTS}.pool", ["node-b", f"{NODE}\n"], "none on this node"),
    ("*", "claim", f"{RESULTS}.request", [""], "request and device are required"),
    ("*", "claim", f"{RESULTS}.device", ["gpu-99", "gpu-2\n", "GPU-2", "gpu-2-mig-9g99gb-0"], "device"),
    ("share", "claim", f"{RESULTS}.consumedCapacity.memory", ["1GB", "-1Gi", "0", "999Gi", "lots"], "memory"),
    # the strategy alone (the MPS settings would otherwise be a second wrong field): the share's
    # device result is refused, and the message names sharing.strategy
    ("share", "claim", f"{PARAMS}.sharing", [{"strategy": "Exclusive"}, {"strategy": "TimeSlicing"}],
     "sharing.strategy must be MPS"),
    ("share", "claim", f"{PARAMS}.sharing.mps.activeThreadPercentage", [0, 101, "50"], "integer from 1 to 100"),
    ("*", "claim", f"{PARAMS}.apiVersion", ["gpu.tessera.dev/v1", 1], API_VERSION),
    ("*", "claim", f"{PARAMS}.kind", ["GPUConfig"], "GpuConfig"),
    ("time-sliced", "claim", f"{PARAMS}.sharing.timeSlicing.interval", ["short", 3], "Default, Short, Medium, Long"),
    ("*", "claim", f"{PARAMS}.sharing.sameNVLinkIsland", ["yes"], "true or false"),
]


def _path(dotted: str) -> list[Any]:
    parts: list[Any] = []
    for part in dotted.split("."):
        if part.endswith("]"):
            name, index = part[:-1].split("[")
            parts += [name, int(index)]
        else:
            parts.append(part)
    return parts


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    target: Any = doc
    keys = _path(dotted)
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value


class Rig:
    def __init__(self, plugin: Any, fake: FakeKubeAPI, conn: PluginConnection) -> None:
        self.plugin, self.fake, self.conn = plugin, fake, conn
        self.dirs = (plugin.config.cdi_dir, plugin.config.state_dir)
        kept = [share_claim("kept-share", "00000000-0000-4000-8000-00000000aaaa", "512Mi"),
                _claim("kept-whole", "00000000-0000-4000-8000-00000000bbbb", {"device": "gpu-0"}, {})]  # fmt: skip
        for c in kept:
            fake.add_claim(c)
        self.kept = [ClaimRef("default", c["metadata"]["name"], c["metadata"]["uid"]) for c in kept]
        answers = conn.prepare(self.kept)
        assert all(a.error == "" and a.devices for a in answers.values()), answers
        self.kept_answers: dict[str, ClaimAnswer] = answers
        self.baseline = snapshot(*self.dirs)
        self.cases = 0


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    from kubeletplugin.plugin import KubeletPlugin, build_device_state

    with short_tmpdir() as root:
        config = make_config(root)
        inventory = load_inventory(NODE, simulate="mixed")
        fake = FakeKubeAPI()
        fake.add_node(NODE)
        plugin = KubeletPlugin(config, fake, inventory, build_device_state(config, inventory))
        plugin.start()
        conn = KubeletClient(config.socket_paths.kubelet_dir).register()
        r = Rig(plugin, fake, conn)
        yield r
        print(f"\nstructure-aware gRPC cases: {r.cases}")
        conn.close()
        fake.close_watches()
        plugin.stop()


@st.composite
def one_wrong_field(draw: st.DrawFn) -> tuple[str, str, str, Any, str]:
    base, where, field, values, words = draw(st.sampled_from(CLAIM_FIELDS))
    if base == "*":
        base = draw(st.sampled_from(sorted(BASES)))
    return base, where, field, draw(st.sampled_from(values)), words


@FUZZ
@given(case=one_wrong_field(), n=st.integers(0, 9999), kept_first=st.booleans())
def test_one_wrong_field_fails_that_claim_alone_and_names_the_field(
    rig: Rig, case: tuple[str, str, str, Any, str], n: int, kept_first: bool
) -> None:
    base, where, field, value, words = case
    rig.cases += 1
    uid = f"00000000-0000-4000-9000-{n:012d}"
    claim = BASES[base]("fuzz-claim", uid)
    ref = ClaimRef("default", "fuzz-claim", uid)
    if where in ("ref", "both"):
        ref = ClaimRef(**{**ref.__dict__, field: value})
    if where == "both":
        _set(claim, "metadata.uid", value)
    else:
        _set(claim, field, copy.deepcopy(value))
    rig.fake.claims.pop(("default", "fuzz-claim"), None)
    rig.fake.add_claim(claim)
    try:
        batch = [*rig.kept, ref] if kept_first else [ref, *rig.kept]
        answers = rig.conn.prepare(batch)
        answer = answers[ref.uid]
        assert answer.error, f"{field}={value!r} ({base}) was prepared: {answer.devices}"
        assert answer.devices == []
        if where in ("ref", "both"):  # the error quotes what kubelet sent
            assert str(value) in answer.error or repr(value) in answer.error, answer.error
        elif field.startswith(PARAMS):  # the full path of the config field
            assert f"{field}: " in answer.error or field.endswith(".sharing"), answer.error
        elif field.startswith(RESULTS):  # the result's path, or the wrong value itself (a foreign driver or pool)
            assert RESULTS in answer.error or str(value) in answer.error or repr(value) in answer.error, answer.error
        else:
            assert "uid" in answer.error, answer.error
        assert words in answer.error, answer.error
        assert "internal error" not in answer.error, answer.error
        for kept in rig.kept:  # the prepared claims in the same call answer exactly as before
            assert answers[kept.uid] == rig.kept_answers[kept.uid]
        assert snapshot(*rig.dirs) == rig.baseline, "a refused claim changed the node"
        released = rig.conn.unprepare([ref])[ref.uid]
        assert released == "" or "not a plain token" in released, released
        assert snapshot(*rig.dirs) == rig.baseline
    finally:
        rig.fake.claims.pop(("default", "fuzz-claim"), None)


def test_the_valid_claims_the_fuzzer_starts_from_do_prepare(rig: Rig) -> None:
    """The cases above differ from these by one field, so every refusal there is that field's doing."""
    for n, make in enumerate(BASES.values()):
        uid = f"00000000-0000-4000-9100-{n:012d}"
        rig.fake.add_claim(make(f"valid-{n}", uid))
        ref = ClaimRef("default", f"valid-{n}", uid)
        answer = rig.conn.prepare([ref])[uid]
        assert answer.error == "" and answer.devices, answer
        assert rig.conn.unprepare([ref]) == {uid: ""}
    assert snapshot(*rig.dirs) == rig.baseline
