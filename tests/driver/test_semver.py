"""driver.semver: blang/semver v4 parsing and semver 2.0.0 precedence."""

from __future__ import annotations

import itertools

import pytest

from driver.semver import Version


@pytest.mark.parametrize(
    "text",
    ["1.2.3", "0.0.0", "1.2.3-beta.1+build.1", "1.0.0-alpha", "1.0.0-0.3.7", "1.0.0-x.7.z.92", "1.0.0+20130313144700",
     "1.0.0-alpha+001", "1.0.0-rc-1", "18446744073709551615.0.0", "1.2.3+build-1.2"],
)
def test_valid_versions(text: str) -> None:
    assert str(Version.parse(text)) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("v1.0.0", "major"),
        ("1.0", "No Major.Minor.Patch"),
        ("1", "No Major.Minor.Patch"),
        ("01.0.0", "leading zeroes"),
        ("1.01.0", "leading zeroes"),
        ("1.0.01", "leading zeroes"),
        ("1.0.0-01", "leading zeroes"),
        ("1.0.0-", "Prerelease is empty"),
        ("1.0.0-a..b", "Prerelease is empty"),
        ("1.0.0+", "Build meta data is empty"),
        ("1.0.0+a_b", "build meta data"),
        ("1.0.0-a_b", "prerelease"),
        ("1.2.3.4", "patch"),
        ("1..3", "Minor number is empty"),
        ("18446744073709551616.0.0", "out of range"),
        (" 1.0.0", "major"),
    ],
)
def test_invalid_versions_are_rejected_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Version.parse(text)


def test_semver_org_precedence_chain() -> None:
    chain = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11",
             "1.0.0-rc.1", "1.0.0", "2.0.0", "2.1.0", "2.1.1"]
    versions = [Version.parse(v) for v in chain]
    for lower, higher in itertools.pairwise(versions):
        assert lower.compare(higher) == -1
        assert higher.compare(lower) == 1
        assert lower < higher


def test_build_metadata_is_ignored_by_equality() -> None:
    assert Version.parse("1.0.0+a") == Version.parse("1.0.0+b")
    assert hash(Version.parse("1.0.0+a")) == hash(Version.parse("1.0.0"))


def test_alphanumeric_prerelease_compares_bytewise() -> None:
    assert Version.parse("1.0.0-B").compare(Version.parse("1.0.0-a")) == -1
    assert Version.parse("1.0.0-99").compare(Version.parse("1.0.0-a")) == -1


@pytest.mark.parametrize(
    ("text", "normalized"),
    [("v1.2.3", "1.2.3"), ("1", "1.0.0"), ("1.2", "1.2.0"), ("v01.02.03", "1.2.3"), ("1.2.3-rc.1", "1.2.3-rc.1"),
     ("1.2.00", "1.2.0"), ("1.2.0-rc", "1.2.0-rc"), ("01.2.007+b", "1.2.7+b")],
)
def test_normalized_parse(text: str, normalized: str) -> None:
    assert str(Version.parse_normalized(text)) == normalized


def test_normalized_short_version_rejects_prerelease() -> None:
    with pytest.raises(ValueError, match="short version"):
        Version.parse_normalized("1.2-rc")


def test_normalized_parse_is_still_strict_after_normalizing() -> None:
    with pytest.raises(ValueError, match="leading zeroes"):
        Version.parse_normalized("1.2.3-rc.01")
    with pytest.raises(ValueError):
        Version.parse_normalized("vv1.2.3")


def test_major_minor_patch_wrap_like_go_int64() -> None:
    v = Version.parse("18446744073709551615.1.2")
    assert v.cel_major() == -1
    assert (v.cel_minor(), v.cel_patch()) == (1, 2)


def test_is_valid() -> None:
    assert Version.is_valid("550.54.15")
    assert not Version.is_valid("550.54")
