"""driver.jsonstream: a list answer decoded while it arrives must come out exactly as json.loads decodes it
whole, however the bytes are cut, and anything json.loads refuses must be refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver import jsonstream


def cut(data: bytes, sizes: list[int]) -> Iterator[bytes]:
    """`data` in pieces of the given sizes, cycling through them (0 yields an empty piece)."""
    assert any(sizes)
    at, i = 0, 0
    while at < len(data):
        size = sizes[i % len(sizes)]
        yield data[at:at + size]
        at += size
        i += 1


@pytest.fixture(autouse=True, scope="module")
def read_piece_by_piece() -> Iterator[None]:
    """Each piece a test cuts is decoded as it comes, not gathered up to READ_SIZE first (which would put most
    cuts back together before any decoding)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonstream, "READ_SIZE", 1)
        yield


def one_by_one(data: bytes) -> Iterator[bytes]:
    return (data[i:i + 1] for i in range(len(data)))


DEVICES = [{"name": f"gpu-{i}", "capacity": {"memory": {"value": "80Gi"}}, "attributes": {"index": {"int": i}}}
           for i in range(8)]
SLICE = {"metadata": {"name": "node-a-gpu-ab12", "labels": {"x": "ü€𝄞"}},
         "spec": {"driver": "gpu.tessera.dev", "devices": DEVICES}}
LIST = {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "metadata": {"resourceVersion": "7"},
        "items": [SLICE, {**SLICE, "metadata": {"name": "b"}}, {"items": [1, 2]}]}


@pytest.mark.parametrize("pieces", [lambda d: [d], one_by_one, lambda d: cut(d, [7, 0, 3, 4096])],
                         ids=["whole", "byte-by-byte", "uneven"])
def test_a_list_answer_decodes_as_json_loads_does(pieces: Any) -> None:
    data = json.dumps(LIST, ensure_ascii=False).encode()
    assert jsonstream.load(pieces(data)) == json.loads(data) == LIST


def test_items_are_decoded_while_the_answer_still_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of it: items are decoded before the last bytes are read, not after."""
    monkeypatch.setattr(jsonstream, "READ_SIZE", 64)
    data = json.dumps({"metadata": {}, "items": [{"n": i, "pad": "x" * 40} for i in range(200)]}).encode()
    decoded_at_read: list[int] = []
    scanned = jsonstream._SCANNER.raw_decode
    count = {"items": 0, "read": 0}

    def counting(text: str, pos: int) -> tuple[Any, int]:
        value, end = scanned(text, pos)
        count["items"] += isinstance(value, dict) and "n" in value
        return value, end

    def chunks() -> Iterator[bytes]:
        for piece in cut(data, [64]):
            count["read"] += 1
            decoded_at_read.append(count["items"])
            yield piece

    monkeypatch.setattr(jsonstream._SCANNER, "raw_decode", counting)
    result = jsonstream.load(chunks())
    assert len(result["items"]) == 200
    half = len(decoded_at_read) // 2
    assert decoded_at_read[half] >= 50  # half-way through the reads, at least a quarter of the items are done


def test_whitespace_and_key_order_do_not_matter() -> None:
    text = b' \n{ "items" : [ {"a": 1} ,\t{"b": [ ]} ] ,\r\n "kind":"L", "metadata" : { } } \n'
    assert jsonstream.load(one_by_one(text)) == json.loads(text)


@pytest.mark.parametrize("text", [b"{}", b'{"items": []}', b'{"items": null}', b'{"items": {"a": 1}}', b"[1, 2]",
                                  b'"s"', b"12345", b"-1.5e10", b"true", b"null", b'{"a": 1, "a": 2}',
                                  b'{"items": [1, 22, 333, -4.5e-1, true, false, null]}'])
def test_any_other_json_decodes_too(text: bytes) -> None:
    assert jsonstream.load(one_by_one(text)) == json.loads(text)
    assert jsonstream.load([text]) == json.loads(text)


def test_a_number_cut_between_two_reads_is_not_taken_short() -> None:
    assert jsonstream.load([b'{"items": [12', b"34]}"]) == {"items": [1234]}
    assert jsonstream.load([b"12", b"34"]) == 1234
    assert jsonstream.load([b'{"items": [-4', b".5e", b"-1, 0", b"]}"]) == {"items": [-0.45, 0]}
    assert jsonstream.load([b'{"items": [tr', b"ue]}"]) == {"items": [True]}


def test_a_character_cut_between_two_reads_is_put_together() -> None:
    data = json.dumps({"items": ["€𝄞"]}, ensure_ascii=False).encode()
    split = data.index("€".encode()) + 1
    assert jsonstream.load([data[:split], data[split:]]) == {"items": ["€𝄞"]}


def test_a_value_much_larger_than_a_read_is_scanned_a_few_times_not_once_per_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonstream, "READ_SIZE", 16)
    data = json.dumps({"items": [{"big": "y" * 100_000}]}).encode()
    scanned = jsonstream._SCANNER.raw_decode
    calls = []

    def counting(text: str, pos: int) -> tuple[Any, int]:
        calls.append(pos)
        return scanned(text, pos)

    monkeypatch.setattr(jsonstream._SCANNER, "raw_decode", counting)
    assert jsonstream.load(cut(data, [16])) == json.loads(data)
    assert len(calls) < 40  # 6,250 reads; once per read would be thousands


@pytest.mark.parametrize(("text", "message"), [
    (b"", "Expecting value"),
    (b"   ", "Expecting value"),
    (b'{"items": [{"a": 1}', "expected ','"),
    (b'{"items": [{"a": 1}, ', "Expecting value"),
    (b'{"items": [{"a": 1} {"b": 2}]}', "expected ','"),
    (b'{"items": [1,]}', "Expecting value"),
    (b'{"kind": "L"', "expected ','"),
    (b'{"kind": "L",}', "expected a key"),
    (b'{"kind" "L"}', "expected ':'"),
    (b"{kind: 1}", "expected a key"),
    (b'{"items": []} {"items": []}', "extra data"),
    (b'{"items": []}]', "extra data"),
    (b"[1, 2", "Expecting"),
    (b'{"items": ["abc', "Unterminated string"),
])
def test_what_json_loads_refuses_is_refused(text: bytes, message: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    for pieces in ([text], one_by_one(text)):
        with pytest.raises(ValueError, match=message):
            jsonstream.load(pieces)


def test_bytes_that_are_not_utf8_are_refused() -> None:
    with pytest.raises(ValueError, match="utf-8"):
        jsonstream.load([b'{"items": ["\xff"]}'])
    with pytest.raises(ValueError, match="utf-8"):
        jsonstream.load([b'{"items": ["', "€".encode()[:2]])  # cut off inside a character at the end


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(head=st.dictionaries(st.sampled_from(["kind", "apiVersion", "metadata", "x"]), JSON, max_size=3),
       items=st.lists(JSON, max_size=6), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5),
       ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_any_list_cut_anywhere_decodes_as_json_loads_does(head: dict[str, Any], items: list[Any], sizes: list[int],
                                                          ascii_only: bool, indent: int | None) -> None:
    data = json.dumps({**head, "items": items}, ensure_ascii=ascii_only, indent=indent).encode()
    assert jsonstream.load(cut(data, sizes)) == json.loads(data)


@settings(max_examples=300, deadline=None)
@given(value=JSON, sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5))
def test_any_value_cut_anywhere_decodes_as_json_loads_does(value: Any, sizes: list[int]) -> None:
    data = json.dumps(value).encode()
    assert jsonstream.load(cut(data, sizes)) == json.loads(data)
