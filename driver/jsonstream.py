"""Decoding a Kubernetes list answer while it arrives.

The apiserver streams a list (92 MB of ResourceSlices at 1,000 DGX nodes) in about a second, and
`json.loads` of the whole answer takes about as long again once it is all in. Decoded item by item as the
bytes come in, the two overlap: the apiserver encodes the next items while this process decodes the last
ones. Each item is still decoded by the json module's C scanner; only the list's outer object, its keys and
the separators between items are read here.

Anything that is not an object holding an `items` array is decoded whole, the same way.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SCANNER = json.JSONDecoder()
_AFTER_NUMBER = frozenset(" \t\n\r,]}")  # what may follow a whole number (end of text aside)
READ_SIZE = 1 << 18  # what is read from the answer before items are decoded again


class _Text:
    """The answer's text as far as it has arrived; `pos` is where decoding stands."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.ended = False

    def more(self) -> bool:
        """Read on, at least READ_SIZE bytes or to the end; False when nothing more came."""
        if self.ended:
            return False
        parts: list[str] = []
        size = 0
        for chunk in self._chunks:
            parts.append(self._utf8.decode(chunk))
            size += len(chunk)
            if size >= READ_SIZE:
                break
        else:
            parts.append(self._utf8.decode(b"", final=True))  # raises on a sequence cut off at the end
            self.ended = True
        # what was decoded is dropped, so the text kept is one unfinished item and what came after it
        self.buf = self.buf[self.pos:] + "".join(parts)
        self.pos = 0
        return size > 0

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end of the answer)."""
        while True:
            self.pos = _WHITESPACE.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos:self.pos + 1]

    def take(self, char: str) -> None:
        found = self.peek()
        if found != char:
            raise self.error(f"expected {char!r}, found {found or 'the end of the answer'!r}")
        self.pos += 1

    def value(self) -> Any:
        """The next JSON value, read on until it is complete."""
        self.peek()
        tried = 0
        while True:
            if len(self.buf) - self.pos > 2 * tried or self.ended:
                try:
                    value, end = _SCANNER.raw_decode(self.buf, self.pos)
                except json.JSONDecodeError:
                    if self.ended:
                        raise
                else:
                    # a number may go on in the next chunk ("-4." | "5e-1" reads as -4 until then); strings,
                    # objects and arrays end with their own closing character, and true, false and null cannot
                    # be the start of anything longer
                    if self.ended or type(value) not in (int, float) or self.buf[end:end + 1] in _AFTER_NUMBER:
                        self.pos = end
                        return value
                # an unfinished value is retried once the text after it has doubled: a value much larger than
                # READ_SIZE is scanned a few times, not once per read
                tried = len(self.buf) - self.pos
            self.more()

    def error(self, message: str) -> json.JSONDecodeError:
        return json.JSONDecodeError(message, self.buf, self.pos)


def load(chunks: Iterable[bytes]) -> Any:
    """The JSON value the chunks spell, as `json.loads(b"".join(chunks))` would return it (ValueError when they
    are not JSON), decoded while the chunks are read: an object's `items` array item by item."""
    text = _Text(chunks)
    if text.peek() != "{":
        value = text.value()
        _end(text)
        return value
    text.pos += 1
    out: dict[str, Any] = {}
    while text.peek() != "}":
        if out:
            text.take(",")
        if text.peek() != '"':
            raise text.error("expected a key")
        key = text.value()
        text.take(":")
        out[key] = _array(text) if key == "items" and text.peek() == "[" else text.value()
    text.pos += 1
    _end(text)
    return out


def _array(text: _Text) -> list[Any]:
    text.take("[")
    items: list[Any] = []
    if text.peek() == "]":
        text.pos += 1
        return items
    while True:
        items.append(text.value())
        if text.peek() == "]":
            text.pos += 1
            return items
        text.take(",")


def _end(text: _Text) -> None:
    if text.peek():
        raise text.error("extra data after the answer")
