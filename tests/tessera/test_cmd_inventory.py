"""`tessera inventory` and `tessera publish` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import driver.kubeapi
from driver.names import slice_name
from driver.poolvalidation import validate_pool
from tessera.cli import main
from tests.fakes.apiserver import FakeKubeAPI


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["--log-format", "json", "--log-level", "error", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_yaml_output_is_valid_named_resourceslices(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inventory", "--simulate", "dgx-h100-8", "--node", "node-a", "-o", "yaml")
    assert rc == 0
    docs = list(yaml.safe_load_all(out))
    assert docs and all(d["kind"] == "ResourceSlice" for d in docs)
    assert [d["metadata"]["name"] for d in docs] == [slice_name("node-a", i) for i in range(len(docs))]
    assert validate_pool(docs, require_name=True) == []
    names = [dev["name"] for d in docs for dev in d["spec"]["devices"]]
    assert names == [f"gpu-{i}" for i in range(8)]


def test_json_output_is_a_list_of_the_slices(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inventory", "--simulate", "h100-16-mig", "--node", "big", "--mig-strategy", "dynamic",
                     "-o", "json")
    assert rc == 0
    document = json.loads(out)
    assert (document["apiVersion"], document["kind"]) == ("v1", "List")
    items: list[dict[str, Any]] = document["items"]
    assert validate_pool(items, require_name=True) == []
    assert sum(len(i["spec"].get("sharedCounters") or []) for i in items) == 16


def test_table_shows_each_gpu_with_its_devices(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inventory", "--simulate", "mixed", "--node", "node-a")
    assert rc == 0
    lines = out.splitlines()
    assert any(line.startswith("GPU") and "NVLINK ISLAND" in line and "DEVICES" in line for line in lines)
    assert any(line.startswith("1 ") and "enabled" in line and "gpu-1-mig-" in line for line in lines)
    assert any(line.startswith("0 ") and "gpu-0" in line for line in lines)
    assert "ResourceSlice(s)" in lines[-1]


def test_table_says_when_a_gpu_is_not_published(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inventory", "--simulate", "h100-16-mig", "--node", "n", "--mig-strategy", "none")
    assert rc == 0
    assert "(not published)" in out


def test_node_name_defaults_to_the_lower_case_host_name(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "GPU-Box-7")
    rc, out, _ = run(capsys, "inventory", "--simulate", "t4-4", "-o", "json")
    assert rc == 0
    assert {i["spec"]["nodeName"] for i in json.loads(out)["items"]} == {"gpu-box-7"}


def test_an_unknown_profile_is_a_clear_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "inventory", "--simulate", "no-such-profile", "--node", "n")
    assert rc == 1
    assert out == ""
    assert err.startswith("tessera inventory: ") and "no-such-profile" in err


def test_an_invalid_node_name_is_reported_with_the_field(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "inventory", "--simulate", "t4-4", "--node", "Node_A")
    assert rc == 1
    assert "spec.nodeName" in err


# -- tessera publish ----------------------------------------------------------------------------------------


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeKubeAPI:
    api = FakeKubeAPI()
    api.add_node("node-a")
    monkeypatch.setattr(driver.kubeapi, "RealKubeAPI", lambda kubeconfig=None: api)
    return api


def test_publish_once_writes_the_pool(capsys: pytest.CaptureFixture[str], fake: FakeKubeAPI) -> None:
    rc, _, _ = run(capsys, "publish", "--node-name", "node-a", "--simulate", "a100-pcie-4", "--once")
    assert rc == 0
    assert sorted(fake.slices) == [slice_name("node-a", 0)]
    assert len(fake.slices[slice_name("node-a", 0)]["spec"]["devices"]) == 4


def test_publish_once_with_cleanup_removes_the_pool(capsys: pytest.CaptureFixture[str], fake: FakeKubeAPI) -> None:
    run(capsys, "publish", "--node-name", "node-a", "--simulate", "t4-4", "--once")
    rc, _, _ = run(capsys, "publish", "--node-name", "node-a", "--simulate", "t4-4", "--once", "--cleanup")
    assert rc == 0
    assert fake.slices == {}


def test_publish_once_fails_with_the_apiserver_error(capsys: pytest.CaptureFixture[str], fake: FakeKubeAPI) -> None:
    fake.fail_next(10)
    rc, _, err = run(capsys, "publish", "--node-name", "node-a", "--simulate", "t4-4", "--once")
    assert rc == 1
    assert "Unreachable" in err


def test_publish_runs_until_sigterm_and_cleans_up_when_asked(fake: FakeKubeAPI,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import signal
    import threading
    import time

    from tessera.cli import build_parser
    from tessera.cmd_publish import run as publish

    handlers: dict[int, Any] = {}
    monkeypatch.setattr(signal, "signal", handlers.__setitem__)
    args = build_parser().parse_args(["publish", "--node-name", "node-a", "--simulate", "t4-4", "--cleanup"])
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(publish(args)))
    worker.start()
    deadline = time.monotonic() + 10
    while not (fake.slices and signal.SIGTERM in handlers) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slice_name("node-a", 0) in fake.slices
    handlers[signal.SIGTERM](signal.SIGTERM, None)
    worker.join(10)
    fake.close_watches()
    assert result == [0]
    assert fake.slices == {}


def test_injected_health_events_show_as_taints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from kubeletplugin.healthlog import append_event

    log = tmp_path / "health-events.jsonl"
    append_event(log, {"gpu": 1, "event": "gpu-lost", "time": 1_790_000_000})
    append_event(log, {"gpu": 2, "event": "xid", "xid": 13})  # application-caused: no taint
    rc, out, _ = run(capsys, "inventory", "--simulate", "mixed", "--node", "node-a", "--health-events", str(log))
    assert rc == 0
    section = out.split("HEALTH TAINTS\n")[1].split("\n\n")[0].splitlines()
    assert section == [f"{m}  gpu.tessera.dev/gpu-lost=fallen-off-bus:NoExecute  since 2026-09-21T14:13:20Z"
                       for m in ("gpu-1-mig-1g10gb-6", "gpu-1-mig-2g20gb-4", "gpu-1-mig-3g40gb-0")]
    rc, out, _ = run(capsys, "inventory", "--simulate", "mixed", "--node", "node-a", "--health-events", str(log),
                     "-o", "json")
    tainted = [d["name"] for s in json.loads(out)["items"] for d in s["spec"]["devices"] if d.get("taints")]
    assert len(tainted) == 3


def test_inventory_shows_the_taints_the_agent_publishes_now(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import time

    log = tmp_path / "health-events.jsonl"
    log.write_text(json.dumps({"gpu": 0, "event": "xid", "xid": 94, "time": time.time() - 3600}) + "\n"  # quiet since
                   + json.dumps({"gpu": 2, "event": "xid", "xid": 94}) + "\n"
                   + json.dumps({"gpu": 3, "event": "gpu-lost"}) + "\n"
                   + json.dumps({"gpu": 3, "event": "recovered", "condition": "gpu-lost"}) + "\n")
    rc, out, _ = run(capsys, "inventory", "--simulate", "mixed", "--node", "node-a", "--health-events", str(log))
    assert rc == 0
    section = out.split("HEALTH TAINTS\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in section] == ["gpu-2"]


def test_bad_health_event_log_is_an_error_naming_the_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "health-events.jsonl"
    log.write_text('{"gpu": 0, "event": "gpu-lost"}\n{"gpu": 0, "event": "melted"}\n')
    rc, _, err = run(capsys, "inventory", "--simulate", "mixed", "--node", "node-a", "--health-events", str(log))
    assert rc == 1 and "line 2.event: unknown health event 'melted'" in err
    rc, _, err = run(capsys, "inventory", "--simulate", "mixed", "--health-events", str(tmp_path / "nope"))
    assert rc == 1 and "cannot read the health event log" in err
