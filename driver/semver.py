"""Semantic versions parsed and ordered exactly as Kubernetes does (blang/semver v4).

ResourceSlice `version` attributes and CEL's `semver()` both go through blang/semver v4 `Parse`:
strict semver 2.0.0 (no `v` prefix, no leading zeros, exactly three numeric parts) with
prerelease and build identifiers limited to `[0-9A-Za-z-]`. Equality and ordering ignore build
metadata; numeric prerelease identifiers rank below alphanumeric ones.
"""

from __future__ import annotations

from dataclasses import dataclass

UINT64_MAX = (1 << 64) - 1
_NUMBERS = frozenset("0123456789")
_ALPHANUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-")


def _parse_number(text: str, what: str) -> int:
    if not all(c in _NUMBERS for c in text):
        raise ValueError(f"Invalid character(s) found in {what} number {text!r}")
    if len(text) > 1 and text[0] == "0":
        raise ValueError(f"{what.capitalize()} number must not contain leading zeroes {text!r}")
    if not text:
        raise ValueError(f"{what.capitalize()} number is empty")
    value = int(text)
    if value > UINT64_MAX:
        raise ValueError(f"{what.capitalize()} number {text!r} is out of range (max {UINT64_MAX})")
    return value


@dataclass(frozen=True, order=False)
class PrereleaseIdentifier:
    """One dot-separated prerelease part: numeric (compared as a number) or alphanumeric."""

    text: str
    number: int | None

    @classmethod
    def parse(cls, text: str) -> PrereleaseIdentifier:
        if not text:
            raise ValueError("Prerelease is empty")
        if all(c in _NUMBERS for c in text):
            if len(text) > 1 and text[0] == "0":
                raise ValueError(f"Numeric PreRelease version must not contain leading zeroes {text!r}")
            value = int(text)
            if value > UINT64_MAX:
                raise ValueError(f"Numeric PreRelease version {text!r} is out of range")
            return cls(text, value)
        if all(c in _ALPHANUM for c in text):
            return cls(text, None)
        raise ValueError(f"Invalid character(s) found in prerelease {text!r}")

    def compare(self, other: PrereleaseIdentifier) -> int:
        if self.number is not None and other.number is not None:
            return (self.number > other.number) - (self.number < other.number)
        if self.number is not None:
            return -1
        if other.number is not None:
            return 1
        a, b = self.text.encode(), other.text.encode()
        return (a > b) - (a < b)


@dataclass(frozen=True, eq=False)
class Version:
    """A parsed version. `==` and ordering follow semver precedence (build metadata ignored)."""

    major: int
    minor: int
    patch: int
    pre: tuple[PrereleaseIdentifier, ...] = ()
    build: tuple[str, ...] = ()

    @classmethod
    def parse(cls, s: str) -> Version:
        """blang/semver v4 Parse. Raises ValueError naming the offending part."""
        if not isinstance(s, str):
            raise ValueError(f"version must be a string, not {type(s).__name__}")
        if not s:
            raise ValueError("Version string empty")
        parts = s.split(".", 2)
        if len(parts) != 3:
            raise ValueError("No Major.Minor.Patch elements found")
        major = _parse_number(parts[0], "major")
        minor = _parse_number(parts[1], "minor")
        rest = parts[2]
        build: list[str] = []
        prerelease: list[str] = []
        if "+" in rest:
            rest, _, build_text = rest.partition("+")
            build = build_text.split(".")
        if "-" in rest:
            rest, _, pre_text = rest.partition("-")
            prerelease = pre_text.split(".")
        patch = _parse_number(rest, "patch")
        pre = tuple(PrereleaseIdentifier.parse(p) for p in prerelease)
        for b in build:
            if not b:
                raise ValueError("Build meta data is empty")
            if not all(c in _ALPHANUM for c in b):
                raise ValueError(f"Invalid character(s) found in build meta data {b!r}")
        return cls(major, minor, patch, pre, tuple(build))

    @classmethod
    def parse_normalized(cls, s: str) -> Version:
        """CEL's semver(s, true), following Kubernetes' normalizeAndParse.

        Strips one leading `v`, removes leading zeros from each of the (up to three) dot-separated
        parts, pads `1` or `1.2` with `.0` parts (a short version may not carry prerelease or
        build metadata), then parses strictly.
        """
        if s.startswith("v"):
            s = s[1:]
        parts = s.split(".", 2)
        for i, part in enumerate(parts):
            if len(part) > 1:
                trimmed = part.lstrip("0")
                if not trimmed or not trimmed[0].isdigit():
                    trimmed = "0" + trimmed
                parts[i] = trimmed
        if len(parts) < 3:
            if any(c in "+-" for c in parts[-1]):
                raise ValueError("short version cannot contain PreRelease/Build meta data")
            parts += ["0"] * (3 - len(parts))
        return cls.parse(".".join(parts))

    @staticmethod
    def is_valid(s: str) -> bool:
        try:
            Version.parse(s)
        except ValueError:
            return False
        return True

    def compare(self, other: Version) -> int:
        for a, b in ((self.major, other.major), (self.minor, other.minor), (self.patch, other.patch)):
            if a != b:
                return 1 if a > b else -1
        if not self.pre and not other.pre:
            return 0
        if not self.pre:
            return 1
        if not other.pre:
            return -1
        for a_id, b_id in zip(self.pre, other.pre, strict=False):
            c = a_id.compare(b_id)
            if c:
                return c
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def cel_major(self) -> int:
        """major() in CEL: Go converts uint64 to int64, so values >= 2**63 wrap negative."""
        return _wrap_int64(self.major)

    def cel_minor(self) -> int:
        return _wrap_int64(self.minor)

    def cel_patch(self) -> int:
        return _wrap_int64(self.patch)

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(p.text for p in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, tuple(p.text for p in self.pre)))

    def __lt__(self, other: Version) -> bool:
        return self.compare(other) < 0

    def __le__(self, other: Version) -> bool:
        return self.compare(other) <= 0

    def __gt__(self, other: Version) -> bool:
        return self.compare(other) > 0

    def __ge__(self, other: Version) -> bool:
        return self.compare(other) >= 0


def _wrap_int64(v: int) -> int:
    return v - (1 << 64) if v >= (1 << 63) else v
