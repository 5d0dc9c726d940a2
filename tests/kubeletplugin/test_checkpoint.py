"""Checkpoint file: round trip, integrity checks, and what happens to a file that cannot be trusted."""

from __future__ import annotations

import json
import stat
import threading

import pytest

from kubeletplugin.checkpoint import CHECKPOINT_VERSION, CheckpointError, decode, encode, entry_to_json
from kubeletplugin.checkpointstore import CheckpointStore
from tests.builders.checkpoint import full_entry

UID = "7c1d0c4e-2f7e-4a55-9c8e-1f2a3b4c5d6e"


def test_round_trip_keeps_every_field(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({UID: full_entry()})
    assert CheckpointStore(tmp_path).load() == {UID: full_entry()}


def test_file_is_private_and_versioned(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({UID: full_entry()})
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    doc = json.loads(store.path.read_text())
    assert doc["version"] == CHECKPOINT_VERSION
    assert doc["checksum"].startswith("sha256:")
    assert list(doc["claims"]) == [UID]


def test_missing_file_is_empty(tmp_path):
    assert CheckpointStore(tmp_path).load() == {}


def test_save_leaves_no_temp_files(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save({UID: full_entry()})
    store.save({})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json", "checkpoint.lock"]


def test_encoding_is_byte_stable():
    assert encode({UID: full_entry(), "b": full_entry("b")}) == encode({"b": full_entry("b"), UID: full_entry()})


def test_decode_rejects_checksum_mismatch():
    doc = json.loads(encode({UID: full_entry()}))
    doc["claims"][UID]["name"] = "tampered"
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        decode(json.dumps(doc).encode())


def test_decode_rejects_a_version_above_its_own_format():
    doc = json.loads(encode({}))
    doc["version"] = doc["format"] + 1
    with pytest.raises(CheckpointError, match="are not a checkpoint's"):
        decode(json.dumps(doc).encode())


def test_decode_rejects_truncated_file():
    data = encode({UID: full_entry()})
    with pytest.raises(CheckpointError, match="not valid JSON"):
        decode(data[: len(data) // 2])


def test_decode_rejects_malformed_entry_with_valid_checksum():
    import hashlib

    claims = {UID: {"uid": UID}}
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    doc = {"version": 1, "checksum": "sha256:" + hashlib.sha256(canonical).hexdigest(), "claims": claims}
    with pytest.raises(CheckpointError, match="malformed claim entry"):
        decode(json.dumps(doc).encode())


def test_decode_rejects_non_object():
    with pytest.raises(CheckpointError, match="not a JSON object"):
        decode(b"[1, 2]")


def test_decode_rejects_missing_claims():
    with pytest.raises(CheckpointError, match="no claims object"):
        decode(json.dumps({"version": 1, "checksum": "x"}).encode())


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda data: data[: len(data) // 3],
        lambda data: data.replace(b"team-a", b"team-b"),
        lambda data: data.replace(b'"version": 1', b'"version": 99'),
        lambda data: b"",
    ],
    ids=["truncated", "checksum", "version-above-format", "empty"],
)
def test_unusable_file_is_moved_aside_and_tessera_starts_empty(tmp_path, corrupt):
    store = CheckpointStore(tmp_path)
    store.save({UID: full_entry()})
    original = store.path.read_bytes()
    store.path.write_bytes(corrupt(original))
    assert store.load() == {}
    assert not store.path.exists()
    (aside,) = tmp_path.glob("checkpoint.json.corrupt-*")
    assert aside.read_bytes() == corrupt(original)
    store.put(full_entry("new"))
    assert list(store.load()) == ["new"]


def test_transaction_saves_changes_and_skips_unchanged(tmp_path):
    store = CheckpointStore(tmp_path)
    with store.transaction() as entries:
        entries[UID] = full_entry()
    assert store.get(UID) == full_entry()
    mtime = store.path.stat().st_mtime_ns
    with store.transaction():
        pass
    assert store.path.stat().st_mtime_ns == mtime


def test_transaction_that_raises_saves_nothing(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(RuntimeError), store.transaction() as entries:
        entries[UID] = full_entry()
        raise RuntimeError("boom")
    assert store.load() == {}


def test_put_and_drop(tmp_path):
    store = CheckpointStore(tmp_path)
    store.put(full_entry("a"))
    store.put(full_entry("b"))
    store.drop("a")
    store.drop("never-there")
    assert list(store.load()) == ["b"]


def test_concurrent_puts_from_two_stores_lose_nothing(tmp_path):
    # two stores on one directory behave like two plugin processes during a rolling update
    stores = [CheckpointStore(tmp_path), CheckpointStore(tmp_path)]

    def writer(n: int) -> None:
        for i in range(20):
            stores[n % 2].put(full_entry(f"c{n}-{i}"))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(CheckpointStore(tmp_path).load()) == 80


# -- found by mutation testing (docs/reliability.md) -------------------------------------------------


def _with_checksum(claims: dict) -> bytes:
    import hashlib

    from kubeletplugin.checkpoint import canonical

    checksum = "sha256:" + hashlib.sha256(canonical(claims)).hexdigest()
    return json.dumps({"version": CHECKPOINT_VERSION, "checksum": checksum, "claims": claims}).encode()


def test_an_entry_with_only_the_required_fields_decodes_with_empty_lists():
    bare = {"uid": UID, "namespace": "ns", "name": "c", "state": "PrepareStarted"}
    entries = decode(_with_checksum({UID: bare})).entries
    entry = entries[UID]
    assert (entry.devices, entry.gpu_uses, entry.migs, entry.time_slices) == ((), (), (), ())
    assert entry.allocation is None and entry.mps is None


def test_the_checksum_does_not_depend_on_key_order():
    claims = json.loads(encode({UID: full_entry()}))["claims"]
    reordered = {UID: dict(reversed(list(claims[UID].items())))}  # an editor or another encoder may reorder keys
    assert decode(_with_checksum(claims)).entries == decode(_with_checksum(reordered)).entries == {UID: full_entry()}
    data = encode({UID: full_entry()})
    doc = json.loads(data)
    doc["claims"] = reordered
    assert decode(json.dumps(doc).encode()).entries == {UID: full_entry()}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply to parse"),
        (b"[]", "not a JSON object"),
        (json.dumps({"version": CHECKPOINT_VERSION, "checksum": "x"}).encode(), "no claims object"),
        (json.dumps({"version": CHECKPOINT_VERSION, "checksum": "sha256:abc", "claims": {}}).encode(),
         "checksum mismatch (file says 'sha256:abc', content is sha256:"),
    ],
)
def test_decode_says_what_is_wrong(data, message):
    with pytest.raises(CheckpointError) as err:
        decode(data)
    assert str(err.value).startswith(message)


def test_an_allocation_that_is_not_an_object_is_a_malformed_entry():
    entry = entry_to_json(full_entry())
    entry["allocation"] = ["not", "an", "object"]
    expected = r"malformed claim entry: TypeError\('allocation must be an object, got list'\)"
    with pytest.raises(CheckpointError, match=expected):
        decode(_with_checksum({UID: entry}))


def test_a_file_replaced_by_another_writer_is_read_again_even_when_its_mtime_is_old(tmp_path):
    import os

    mine, other = CheckpointStore(tmp_path), CheckpointStore(tmp_path)
    mine.save({UID: full_entry()})
    assert mine.load() == {UID: full_entry()}
    other.save({})  # a new file (rename), given an old mtime: only its identity says it changed
    os.utime(other.path, ns=(1_000_000_000, 1_000_000_000))
    assert mine.load() == {}
