"""Structure-aware fuzzing of the GPU health event log through the real `tessera kubelet-plugin` process
(issue 24 item 1: no event-file content can stop the node agent).

The process runs on the `mixed` profile against the HTTP apiserver stand-in, as the other process tests
do. Each case writes a whole new event log (the agent follows the file's identity, so a replaced log is
replayed from its start) made of:

- valid events of every kind, with optional fields;
- valid events with exactly one field wrong (a time in milliseconds, NaN, a GPU the node lacks, an XID
  of the wrong type, a message over the limit, ...): they decode as JSON objects, so they get past the
  first check and test the field checks behind it;
- garbage: binary, text, JSON that is not an object, nesting 200,000 deep, lines over 64 KiB, torn
  writes (a valid line cut short);
- sometimes a last line without its newline.

Then a sentinel event is appended. The properties, checked against a model of the policy written here:

- the process stays up and the taints it publishes are exactly those of the valid lines;
- every bad line, and only bad lines, is logged with the file and its line number;
- a claim can still be prepared and unprepared.
A few logs that used to stop the agent at start are also started with, cold.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from driver.health import MAX_EVENT_TIME, MAX_LINK, MAX_XID
from kubeletplugin.healthlog import EVENT_LOG_FILE, MAX_LINE, append_event
from tests.builders.plugin import PluginProcess, add_share_claim, uid
from tests.fakes.apiserver import FakeApiServer
from tests.fakes.kubeletclient import KubeletClient

EXAMPLES = int(os.environ.get("TESSERA_HEALTH_FUZZ_EXAMPLES", "30"))
# no shrinking: each step would run the real process again for minutes; the failing log is printed whole
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])
GPUS = [0, 1, 2, 3]  # the mixed profile; gpu-1 is in MIG mode and published as its MIG devices
IGNORED = {13, 31, 43, 45, 68}
CLASSES = ["xid", "ecc-double-bit", "gpu-lost", "nvlink-down"]
KINDS = [*CLASSES, "reset", "recovered"]
# no quiet period: the model below need not know the clock
POLICY = '--health-policy={"taints": {"xid": {"clearAfterSeconds": 0}}}'
BAD_LINE = "ignoring a bad line in the health event log"
NO_NEWLINE = "health event log line has no newline; taken as written"

# -- what is written ---------------------------------------------------------------------------------

good_time = st.one_of(st.integers(0, MAX_EVENT_TIME), st.floats(0, MAX_EVENT_TIME, allow_nan=False))
common = {"time": good_time, "message": st.text(max_size=30)}
reason = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)


def event_of(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    required: dict[str, Any] = {"gpu": st.sampled_from(GPUS), "event": st.just(kind)}
    optional: dict[str, Any] = dict(common)
    if kind == "xid":
        required["xid"] = st.one_of(st.integers(1, 200), st.integers(1, MAX_XID))
    elif kind == "nvlink-down":
        required["link"] = st.integers(0, MAX_LINK)
    elif kind in ("ecc-double-bit", "gpu-lost"):
        optional["reason"] = reason
    elif kind == "recovered":
        optional["condition"] = st.sampled_from(CLASSES)
    return st.fixed_dictionaries(required, optional=optional)


valid_event = st.sampled_from(KINDS).flatmap(event_of)
not_str = st.sampled_from([None, 5, 1.5, True, ["x"], {"x": 1}])
BAD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "gpu": st.one_of(st.integers(4, 10**6), st.integers(max_value=-1), st.sampled_from([True, None, "0", 1.0, [0]])),
    "event": st.one_of(st.text(max_size=12).filter(lambda t: t not in KINDS), st.sampled_from([None, 0, ["xid"]])),
    "time": st.one_of(
        st.integers(MAX_EVENT_TIME + 1, 10**40),  # milliseconds (year 58877) and beyond
        st.floats(MAX_EVENT_TIME * 1.01, 1e300),
        st.floats(max_value=-1e-6, allow_infinity=False, allow_nan=False),
        st.sampled_from([float("nan"), float("inf"), float("-inf"), "now", None, True, [1], {"t": 1}]),
    ),
    "xid": st.one_of(st.integers(max_value=0), st.integers(MAX_XID + 1, 10**30),
                     st.sampled_from([None, "79", 79.0, True, [79]])),
    "link": st.one_of(st.integers(max_value=-1), st.integers(MAX_LINK + 1, 10**9), st.sampled_from([None, "2", 2.0])),
    "message": st.one_of(not_str, st.integers(1025, 3000).map(lambda n: "m" * n)),
    "reason": st.one_of(not_str, st.just("r" * 257)),
    "condition": st.one_of(not_str, st.text(max_size=10).filter(lambda t: t not in ("", *CLASSES))),
}


class Line:
    """One line of the log: its bytes (without the newline), and the event it carries when it is valid."""

    def __init__(self, data: bytes, event: dict[str, Any] | None, kind: str) -> None:
        self.data, self.event, self.kind = data, event, kind  # kind: valid, wrong-<field>, or a garbage kind

    def __repr__(self) -> str:  # lines can be 200 KB; a failing case should stay readable
        shown = self.data if len(self.data) <= 200 else self.data[:120] + b"..." + self.data[-40:]
        return f"Line({self.kind}, {len(self.data)} bytes: {shown!r})"


@st.composite
def one_field_wrong(draw: st.DrawFn) -> Line:
    event = draw(valid_event)
    field_name = draw(st.sampled_from(sorted((set(event) | {"time"}) & set(BAD_VALUES))))
    event[field_name] = draw(BAD_VALUES[field_name])
    return Line(json.dumps(event).encode(), None, f"wrong-{field_name}")


@st.composite
def torn(draw: st.DrawFn) -> Line:
    whole = json.dumps(draw(valid_event)).encode()
    return Line(whole[: draw(st.integers(1, len(whole) - 1))], None, "torn")


def garbage(kind: str, strategy: st.SearchStrategy[bytes]) -> st.SearchStrategy[Line]:
    return strategy.filter(lambda b: b"\n" not in b and b.strip() != b"").map(lambda b: Line(b, None, kind))


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3), max_leaves=6)
garbage_line = st.one_of(
    torn(),
    garbage("binary", st.binary(min_size=1, max_size=120)),
    garbage("text", st.text(min_size=1, max_size=60).map(lambda t: t.encode("utf-8", "surrogatepass"))),
    garbage("not-an-object", json_values.map(lambda v: json.dumps(v).encode())),
    garbage("deep", st.integers(1_000, 200_000).map(lambda n: b"[" * n)),
    garbage("huge", st.integers(MAX_LINE + 1, 3 * MAX_LINE).map(lambda n: b'{"gpu": 0, "message": "' + b"x" * n)),
    garbage("long-int", st.integers(4_400, 20_000).map(lambda n: b'{"gpu": 0, "event": "xid", "xid": 1'
                                                                  + b"0" * n + b"}")),
)
valid_line = valid_event.map(lambda e: Line(json.dumps(e).encode(), e, "valid"))


@dataclass
class Log:
    lines: list[Line]
    partial: bool  # the last line has no newline

    def content(self) -> bytes:
        return b"\n".join(line.data for line in self.lines) + (b"" if self.partial else b"\n")


@st.composite
def event_logs(draw: st.DrawFn) -> Log:
    # half valid, 30 % one field wrong (they get past the JSON decoding), 20 % garbage; one_of would
    # flatten the garbage choices and weigh each like a valid line
    line = st.sampled_from(["valid", "wrong", "valid", "garbage", "wrong", "valid", "wrong", "valid", "wrong",
                            "garbage"]).flatmap(
        lambda kind: {"valid": valid_line, "wrong": one_field_wrong(), "garbage": garbage_line}[kind])
    lines = draw(st.lists(line, min_size=1, max_size=10))
    # a last line over the limit is skipped up to a newline that never comes: nothing to report then
    partial = len(lines[-1].data) <= MAX_LINE and draw(st.sampled_from([False] * 3 + [True]))
    return Log(lines, partial)


# -- what the agent must publish: the policy, modelled independently ----------------------------------


def model(events: list[dict[str, Any]]) -> dict[int, set[tuple[str, str]]]:
    book: dict[int, dict[str, str]] = {}
    for e in events:
        conds = book.setdefault(e["gpu"], {})
        kind = e["event"]
        if kind == "reset":
            for cls in ("xid", "ecc-double-bit", "nvlink-down"):
                conds.pop(cls, None)
            continue
        if kind == "recovered":
            for cls in [e["condition"]] if "condition" in e else CLASSES:
                conds.pop(cls, None)
            continue
        if kind == "xid":
            xid = e["xid"]
            if xid in IGNORED:
                continue
            kind, value = {79: ("gpu-lost", "fallen-off-bus"), 48: ("ecc-double-bit", "double-bit")}.get(
                xid, ("xid", str(xid)))
        elif kind == "nvlink-down":
            value = f"link-{e['link']}"
        else:
            value = e.get("reason", {"ecc-double-bit": "double-bit", "gpu-lost": "fallen-off-bus"}[kind])
        conds[kind] = value
    return {gpu: {(f"gpu.tessera.dev/{c}", v) for c, v in conds.items()} for gpu, conds in book.items() if conds}


def published(apiserver: FakeApiServer) -> dict[int, set[tuple[str, str]]]:
    out: dict[int, set[tuple[str, str]]] = {}
    for s in apiserver.fake.list_resource_slices()["items"]:
        for device in s["spec"].get("devices") or []:
            if device.get("taints"):
                out.setdefault(int(device["name"].split("-")[1]), set()).update(
                    (t["key"], t["value"]) for t in device["taints"])
    return out


# -- the process ------------------------------------------------------------------------------------


@dataclass
class Stats:
    bad: dict[str, int] = field(default_factory=dict)
    bad_json_objects: int = 0  # bad lines that still decode as a JSON object: the field checks must catch them
    valid: int = 0
    partial: int = 0


@pytest.fixture
def agent(apiserver: FakeApiServer, root: Path) -> Iterator[PluginProcess]:
    plugin = PluginProcess(root, apiserver.write_kubeconfig(root / "kubeconfig"), POLICY)
    try:
        plugin.start()
        yield plugin
    finally:
        plugin.kill()


def drain(plugin: PluginProcess) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            plugin.events.get_nowait()


def events_until(plugin: PluginProcess, done: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            event = plugin.events.get(timeout=0.5)
        except queue.Empty:
            continue
        if event.get("event") == "<exit>":
            raise AssertionError("the agent exited:\n" + "".join(plugin.lines[-40:]))
        seen.append(event)
        if done(event):
            return seen
    raise AssertionError(f"timed out; last events: {seen[-10:]}")


def write_log(path: Path, content: bytes) -> None:
    tmp = path.with_name(".fuzz-log")
    tmp.write_bytes(content)
    tmp.chmod(0o600)
    os.replace(tmp, path)  # a new file: the agent reads it from its start


def prepare_and_release(plugin: PluginProcess, apiserver: FakeApiServer, n: int) -> None:
    ref = add_share_claim(apiserver.fake, f"fuzz-{n}", uid(1000 + n))
    conn = KubeletClient(plugin.paths.kubelet_dir).register()
    try:
        assert conn.prepare([ref])[ref.uid].error == ""
        assert conn.unprepare([ref]) == {ref.uid: ""}
    finally:
        conn.close()


def test_no_event_log_content_stops_the_agent_or_changes_what_valid_lines_publish(
        agent: PluginProcess, apiserver: FakeApiServer) -> None:
    path = agent.state_dir / EVENT_LOG_FILE
    stats = Stats()
    counter = iter(range(1, 10**6))

    @FUZZ
    @given(log=event_logs())
    def case(log: Log) -> None:
        n = next(counter)
        drain(agent)
        write_log(path, log.content())
        seen = []
        if log.partial:
            seen = events_until(agent, lambda e: e.get("event") == NO_NEWLINE and e.get("line") == len(log.lines))
        sentinel = {"gpu": 3, "event": "nvlink-down", "link": n % (MAX_LINK + 1), "time": 1_790_000_000}
        append_event(path, sentinel)
        seen += events_until(agent, lambda e: e.get("event") == "GPU health event"
                             and e.get("value") == f"link-{sentinel['link']}")
        valid = [line.event for line in log.lines if line.event is not None]
        expected = model([*valid, sentinel])
        deadline = time.monotonic() + 20
        while published(apiserver) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert published(apiserver) == expected
        warned = {e["line"] for e in seen if e.get("event") == BAD_LINE and e.get("path") == str(path)}
        assert warned == {i for i, line in enumerate(log.lines, 1) if line.event is None}
        assert agent.proc is not None and agent.proc.poll() is None
        if n % 10 == 0:
            prepare_and_release(agent, apiserver, n)
        stats.partial += log.partial
        for line in log.lines:
            if line.event is not None:
                stats.valid += 1
                continue
            stats.bad[line.kind] = stats.bad.get(line.kind, 0) + 1
            with contextlib.suppress(ValueError, RecursionError):
                decoded = json.loads(line.data)
                stats.bad_json_objects += isinstance(decoded, dict)

    case()
    prepare_and_release(agent, apiserver, 0)
    bad = sum(stats.bad.values())
    print("HEALTH-FUZZ-STATS", stats)
    # the fuzzing reaches the field checks: most bad lines are well-formed events with one field wrong
    assert bad and stats.bad_json_objects >= 0.5 * bad, stats
    assert stats.valid >= EXAMPLES and stats.partial, stats
    assert {k for k in stats.bad if k.startswith("wrong-")} >= {"wrong-time", "wrong-gpu"}, stats


@pytest.mark.parametrize("bad", [
    {"gpu": 0, "event": "gpu-lost", "time": 1_790_000_000_000},  # milliseconds: year 58877
    {"gpu": 0, "event": "xid", "xid": 94, "time": float("nan")},
    {"gpu": 0, "event": "ecc-double-bit", "time": 10**400},
    {"gpu": 0, "event": "xid", "xid": 94, "message": {"not": "text"}},
], ids=["milliseconds", "nan", "huge-int", "wrong-type"])
def test_an_agent_started_on_a_log_that_used_to_stop_it_serves_and_publishes(
        apiserver: FakeApiServer, root: Path, bad: dict[str, Any]) -> None:
    path = root / "state" / EVENT_LOG_FILE
    path.parent.mkdir(mode=0o755)
    path.write_bytes(json.dumps(bad).encode() + b"\n" + b"\x00\xff" * 10 + b"\n"
                     + json.dumps({"gpu": 3, "event": "gpu-lost", "time": 1_790_000_000}).encode() + b"\n")
    path.chmod(0o600)
    plugin = PluginProcess(root, apiserver.write_kubeconfig(root / "kubeconfig"))
    try:
        plugin.start()  # before the fix: exit 1 with a ValueError traceback from the first publish
        deadline = time.monotonic() + 20
        while published(apiserver) != {3: {("gpu.tessera.dev/gpu-lost", "fallen-off-bus")}} \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert published(apiserver) == {3: {("gpu.tessera.dev/gpu-lost", "fallen-off-bus")}}
        warned = [e for e in _logged(plugin) if e.get("event") == BAD_LINE]
        assert [(e["path"], e["line"]) for e in warned] == [(str(path), 1), (str(path), 2)]
        prepare_and_release(plugin, apiserver, 1)
    finally:
        plugin.kill()


def _logged(plugin: PluginProcess) -> list[dict[str, Any]]:
    out = []
    for text in plugin.lines:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(text))
    return out
