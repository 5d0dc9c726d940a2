"""driver.quantity against apimachinery's ParseQuantity golden behaviour."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.quantity import (
    INT64_MAX,
    Quantity,
    _go_pow10,
    canonical_quantity,
    canonical_roundtrip,
    format_bytes,
    parse_quantity,
    quantity_bytes,
    quantity_bytes_or_none,
)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0", "0"),
        ("0Mi", "0"),
        ("1Ki", "1Ki"),
        ("1024", "1024"),
        ("1000", "1k"),
        ("1.5Gi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1.1Gi", "1181116006400m"),
        ("100m", "100m"),
        ("0.1", "100m"),
        ("1.5k", "1500"),
        ("1234567890123456789", "1234567890123456789"),
        ("1000000000000000000", "1E"),
        ("9Ei", "9223372036854775807"),
        ("1Ei", "1Ei"),
        ("0.1n", "1n"),
        ("-0.1n", "-1n"),
        ("1e3", "1e3"),
        ("1E3", "1e3"),
        ("1000E", "1e21"),
        ("1000m", "1"),
        ("80Gi", "80Gi"),
        ("81920Mi", "80Gi"),
        ("1e-3", "1e-3"),
        ("-5Ki", "-5Ki"),
    ],
)
def test_canonical_string_matches_go(text: str, canonical: str) -> None:
    assert Quantity.parse(text)._canonical() == canonical
    # the canonical form re-parses to the same value
    assert Quantity.parse(canonical) == Quantity.parse(text)


@pytest.mark.parametrize("text", ["+1k", "01k", "50.703k", "1E3", "1025Ki"])
def test_string_keeps_the_input_when_go_reuses_it(text: str) -> None:
    assert str(Quantity.parse(text)) == text


@pytest.mark.parametrize(
    "text",
    ["", "200K", "1e3Mi", "Infinity", "NaN", "1_000", " 5", "5 ", "\u0661\u0662", "1.1.M", "0.1mi", ".5i",
     "-3.01e-", "10Mo", "10Mm", "1i", "1ee3", "e", "1+1.0M", "aoeu", "1.0 Gi", "1e9223372036854775808"],
)
def test_go_rejects_and_so_do_we(text: str) -> None:
    with pytest.raises(ValueError, match="quantit"):
        Quantity.parse(text)


def test_non_string_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        Quantity.parse(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "value"), [("+", 0), ("-", 0), (".", 0), ("Mi", 0), ("k", 0), ("1e4294967296", 1)])
def test_lenient_inputs_parse_like_go(text: str, value: int) -> None:
    assert Quantity.parse(text).fraction() == value


@pytest.mark.parametrize(
    ("text", "as_int64"),
    [
        ("1000m", None),  # negative scale
        ("1.0", None),
        ("1.5Gi", None),  # inf.Dec form
        ("1536Mi", 1610612736),
        ("1.5k", 1500),
        ("1E", 10**18),
        ("1000000000000000000", None),  # 19 digits: inf.Dec
        ("50", 50),
        ("9999999999999999999999999999999999999G", None),
        ("10E", None),  # 10**19 overflows int64
    ],
)
def test_as_int64_depends_on_go_representation(text: str, as_int64: int | None) -> None:
    assert Quantity.parse(text).as_int64() == as_int64


def test_canonical_roundtrip_changes_representation() -> None:
    assert Quantity.parse("1000m").as_int64() is None
    assert canonical_roundtrip("1000m").as_int64() == 1


@pytest.mark.parametrize(
    ("a", "b", "cmp"),
    [("200M", "0.2G", 0), ("50M", "50Mi", -1), ("50Mi", "50M", 1), ("1Ki", "1024", 0), ("-1", "1n", -1),
     ("9999999999999999999999999999999999999G", "1E", 1)],
)
def test_comparison_is_exact(a: str, b: str, cmp: int) -> None:
    assert Quantity.parse(a).cmp(Quantity.parse(b)) == cmp
    assert Quantity.parse(b).cmp(Quantity.parse(a)) == -cmp


def test_add_and_sub_follow_go() -> None:
    q = Quantity.parse("50k").add(Quantity.from_int(20, "DecimalExponent"))
    assert q.sub(Quantity.parse("100k")).as_int64() == -49980
    assert Quantity.parse("50k").add(Quantity.parse("20")) == Quantity.parse("50.02k")
    assert Quantity.parse("50k").sub(Quantity.from_int(20000)) == Quantity.parse("30k")


def test_add_overflowing_int64_switches_to_dec_form() -> None:
    big = Quantity.parse("9E")
    total = big.add(Quantity.parse("1E"))
    assert total.fraction() == 10**19
    assert total.as_int64() is None


def test_sub_of_most_negative_from_zero_is_exact() -> None:
    zero = Quantity.parse("0")
    most_negative = Quantity(int_amount=(-(1 << 63), 0))
    assert zero.sub(most_negative).fraction() == 1 << 63


@pytest.mark.parametrize(("text", "value"), [("1.5", 2), ("-1.5", -2), ("100m", 1), ("1.1Gi", 1181116007), ("5", 5)])
def test_value_rounds_up_like_go(text: str, value: int) -> None:
    assert Quantity.parse(text).value() == value


def test_milli_value() -> None:
    assert Quantity.parse("1.5").milli_value() == 1500
    assert Quantity.parse("1n").milli_value() == 1


@pytest.mark.parametrize(("text", "expected"), [("50.703k", 50703.0), ("1n", 1e-9), ("1.5Gi", 1610612736.0)])
def test_approximate_float(text: str, expected: float) -> None:
    assert Quantity.parse(text).as_approximate_float() == expected


def test_go_pow10_uses_go_tables_not_python_pow() -> None:
    # Python's 10.0 ** 23 is off by one ulp; Go's table lookup gives the correctly rounded literal
    assert 10.0**23 != 1e23
    assert _go_pow10(23) == 1e23
    assert _go_pow10(40) == 1e32 * 1e8
    assert _go_pow10(-23) == 1.0 / 1e23
    assert _go_pow10(400) == float("inf")
    assert _go_pow10(-400) == 0.0


_SUFFIXES = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "k": Fraction(10**3),
    "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50),
    "Ei": Fraction(2**60), "e3": Fraction(1000), "e-2": Fraction(1, 100), "E12": Fraction(10**12),
}


def _reference(sign: str, whole: str, frac: str, suffix: str) -> Fraction:
    number = Fraction(int(whole + frac or "0"), 10 ** len(frac)) * _SUFFIXES[suffix]
    # Go rounds anything finer than a nano-unit up, away from zero
    scaled = number * 10**9
    if scaled.denominator != 1:
        number = Fraction(-(-scaled.numerator // scaled.denominator), 10**9)
    if suffix.endswith("i") and number > INT64_MAX:
        number = Fraction(INT64_MAX)
    return -number if sign == "-" else number


@settings(max_examples=300, deadline=None)
@given(
    sign=st.sampled_from(["", "+", "-"]),
    whole=st.text("0123456789", min_size=1, max_size=22),
    frac=st.text("0123456789", max_size=12),
    suffix=st.sampled_from(sorted(_SUFFIXES)),
)
def test_parse_matches_fraction_reference(sign: str, whole: str, frac: str, suffix: str) -> None:
    text = f"{sign}{whole}{'.' + frac if frac else ''}{suffix}"
    q = Quantity.parse(text)
    assert q.fraction() == _reference(sign, whole, frac, suffix)
    # the canonical form is a fixed point and keeps the value
    again = Quantity.parse(q._canonical())
    assert again == q
    assert again._canonical() == q._canonical()


# apimachinery TestQuantityParse: input -> (exact value, format); value = v * 10**scale
_GOLDEN = [
    ("0", 0, 0, "DecimalSI"), ("0n", 0, 0, "DecimalSI"), ("0u", 0, 0, "DecimalSI"), ("0m", 0, 0, "DecimalSI"),
    ("0Ki", 0, 0, "BinarySI"), ("0k", 0, 0, "DecimalSI"), ("0Mi", 0, 0, "BinarySI"), ("0M", 0, 0, "DecimalSI"),
    ("0Gi", 0, 0, "BinarySI"), ("0G", 0, 0, "DecimalSI"), ("0Ti", 0, 0, "BinarySI"), ("0T", 0, 0, "DecimalSI"),
    ("1", 1, 0, "DecimalSI"),
    ("1Ki", 1024, 0, "BinarySI"), ("8Ki", 8 * 1024, 0, "BinarySI"), ("7Mi", 7 * 1024**2, 0, "BinarySI"),
    ("6Gi", 6 * 1024**3, 0, "BinarySI"), ("5Ti", 5 * 1024**4, 0, "BinarySI"), ("4Pi", 4 * 1024**5, 0, "BinarySI"),
    ("3Ei", 3 * 1024**6, 0, "BinarySI"), ("10Ti", 10 * 1024**4, 0, "BinarySI"), ("100Ti", 100 * 1024**4, 0, "BinarySI"),
    ("5n", 5, -9, "DecimalSI"), ("4u", 4, -6, "DecimalSI"), ("3m", 3, -3, "DecimalSI"), ("9", 9, 0, "DecimalSI"),
    ("8k", 8, 3, "DecimalSI"), ("50k", 5, 4, "DecimalSI"), ("7M", 7, 6, "DecimalSI"), ("6G", 6, 9, "DecimalSI"),
    ("5T", 5, 12, "DecimalSI"), ("40T", 4, 13, "DecimalSI"), ("300T", 3, 14, "DecimalSI"), ("2P", 2, 15, "DecimalSI"),
    ("1E", 1, 18, "DecimalSI"),
    ("1E-3", 1, -3, "DecimalExponent"), ("1e3", 1, 3, "DecimalExponent"), ("1E6", 1, 6, "DecimalExponent"),
    ("1e9", 1, 9, "DecimalExponent"), ("1E12", 1, 12, "DecimalExponent"), ("1e15", 1, 15, "DecimalExponent"),
    ("1E18", 1, 18, "DecimalExponent"), ("1e14", 1, 14, "DecimalExponent"), ("1e13", 1, 13, "DecimalExponent"),
    ("100.035k", 100035, 0, "DecimalSI"),
    ("0.001", 1, -3, "DecimalSI"), ("0.0005k", 5, -1, "DecimalSI"), ("0.005", 5, -3, "DecimalSI"),
    ("0.05", 5, -2, "DecimalSI"), ("0.5", 5, -1, "DecimalSI"), ("0.00050k", 5, -1, "DecimalSI"),
    ("0.00500", 5, -3, "DecimalSI"), ("0.05000", 5, -2, "DecimalSI"), ("0.50000", 5, -1, "DecimalSI"),
    ("0.5e0", 5, -1, "DecimalExponent"), ("0.5e-1", 5, -2, "DecimalExponent"), ("0.5e-2", 5, -3, "DecimalExponent"),
    ("10.035M", 10035, 3, "DecimalSI"), ("1.2e3", 12, 2, "DecimalExponent"), ("1.3E+6", 13, 5, "DecimalExponent"),
    ("1.40e9", 14, 8, "DecimalExponent"), ("1.53E12", 153, 10, "DecimalExponent"),
    ("1.6e15", 16, 14, "DecimalExponent"),
    ("1.7E18", 17, 17, "DecimalExponent"), ("9.01", 901, -2, "DecimalSI"), ("8.1k", 81, 2, "DecimalSI"),
    ("7.123456M", 7123456, 0, "DecimalSI"), ("6.987654321G", 6987654321, 0, "DecimalSI"),
    ("5.444T", 5444, 9, "DecimalSI"), ("40.1T", 401, 11, "DecimalSI"), ("300.2T", 3002, 11, "DecimalSI"),
    ("2.5P", 25, 14, "DecimalSI"), ("1.01E", 101, 16, "DecimalSI"),
    ("3.001n", 4, -9, "DecimalSI"), ("1.1E-9", 2, -9, "DecimalExponent"), ("0.0000000001", 1, -9, "DecimalSI"),
    ("0.0000000005", 1, -9, "DecimalSI"), ("0.00000000050", 1, -9, "DecimalSI"), ("0.5e-9", 1, -9, "DecimalExponent"),
    ("0.9n", 1, -9, "DecimalSI"), ("0.00000012345", 124, -9, "DecimalSI"), ("0.00000012354", 124, -9, "DecimalSI"),
    ("9Ei", INT64_MAX, 0, "BinarySI"), ("9223372036854775807Ki", INT64_MAX, 0, "BinarySI"),
    ("12E", 12, 18, "DecimalSI"),
    ("100.035Ki", 10243584, -2, "BinarySI"), ("0.5Mi", 524288, 0, "BinarySI"), ("0.05Gi", 536870912, -1, "BinarySI"),
    ("0.025Ti", 274877906944, -1, "BinarySI"),
    ("0.000000000001Ki", 2, -9, "DecimalSI"), (".001", 1, -3, "DecimalSI"), (".0001k", 100, -3, "DecimalSI"),
    ("1.", 1, 0, "DecimalSI"), ("1.G", 1, 9, "DecimalSI"),
]


@pytest.mark.parametrize("sign", ["", "+", "-"])
@pytest.mark.parametrize(("text", "v", "scale", "fmt"), _GOLDEN, ids=[g[0] for g in _GOLDEN])
def test_apimachinery_parse_table(sign: str, text: str, v: int, scale: int, fmt: str) -> None:
    q = Quantity.parse(sign + text)
    expected = Fraction(v) * Fraction(10) ** scale
    assert q.fraction() == (-expected if sign == "-" else expected)
    assert q.format == fmt


# apimachinery TestQuantityString: (value v * 10**scale, format) -> canonical string, and an
# alternate spelling that parses to the same canonical string
_STRINGS = [
    (1024**3, 0, "BinarySI", "1Gi", "1024Mi"), (300 * 1024**2, 0, "BinarySI", "300Mi", "307200Ki"),
    (6 * 1024, 0, "BinarySI", "6Ki", ""), (1001 * 1024**3, 0, "BinarySI", "1001Gi", "1025024Mi"),
    (1024**4, 0, "BinarySI", "1Ti", "1024Gi"), (5, 0, "BinarySI", "5", "5000m"), (500, -3, "BinarySI", "500m", "0.5"),
    (1, 9, "DecimalSI", "1G", "1000M"), (1000, 6, "DecimalSI", "1G", "0.001T"), (1000000, 3, "DecimalSI", "1G", ""),
    (1000000000, 0, "DecimalSI", "1G", ""), (1, -3, "DecimalSI", "1m", "1000u"), (80, -3, "DecimalSI", "80m", ""),
    (1080, -3, "DecimalSI", "1080m", "1.08"), (108, -2, "DecimalSI", "1080m", "1080000000n"),
    (10800, -4, "DecimalSI", "1080m", ""), (300, 6, "DecimalSI", "300M", ""), (1, 12, "DecimalSI", "1T", ""),
    (1, 18, "DecimalSI", "1E", ""), (1, 21, "DecimalSI", "1e21", "1000E"), (5, 21, "DecimalSI", "5e21", "5000E"),
    (1, 24, "DecimalSI", "1e24", "1000000E"), (1234567, 6, "DecimalSI", "1234567M", ""),
    (1234567, -3, "BinarySI", "1234567m", ""), (3, 3, "DecimalSI", "3k", ""), (1025, 0, "BinarySI", "1025", ""),
    (0, 0, "DecimalSI", "0", ""), (0, 0, "BinarySI", "0", ""), (1, 9, "DecimalExponent", "1e9", ".001e12"),
    (1, -3, "DecimalExponent", "1e-3", "0.001e0"), (1, -9, "DecimalExponent", "1e-9", "1000e-12"),
    (80, -3, "DecimalExponent", "80e-3", ""), (300, 6, "DecimalExponent", "300e6", ""),
    (1, 12, "DecimalExponent", "1e12", ""), (1, 3, "DecimalExponent", "1e3", ""), (3, 3, "DecimalExponent", "3e3", ""),
    (0, 0, "DecimalExponent", "0", "00"), (1, -9, "DecimalSI", "1n", ""), (80, -9, "DecimalSI", "80n", ""),
    (1080, -9, "DecimalSI", "1080n", ""), (108, -8, "DecimalSI", "1080n", ""), (10800, -10, "DecimalSI", "1080n", ""),
    (1, -6, "DecimalSI", "1u", ""), (80, -6, "DecimalSI", "80u", ""), (1080, -6, "DecimalSI", "1080u", ""),
]


@pytest.mark.parametrize(
    ("v", "scale", "fmt", "canonical", "alternate"), _STRINGS, ids=[f"{x[3]}/{x[2]}" for x in _STRINGS]
)
def test_apimachinery_string_table(v: int, scale: int, fmt: str, canonical: str, alternate: str) -> None:
    q = Quantity(dec_amount=(v, -scale), fmt=fmt)  # type: ignore[arg-type]
    assert str(q) == canonical
    if v:
        assert str(Quantity(dec_amount=(-v, -scale), fmt=fmt)) == "-" + canonical  # type: ignore[arg-type]
    # parsing the canonical form keeps the text; an alternate spelling gets it computed
    assert Quantity.parse(canonical)._s == canonical
    if alternate:
        other = Quantity.parse(alternate)
        assert other._s == ""
        assert str(other) == canonical


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("1Ki", "1Ki"), ("1Mi", "1Mi"), ("1Gi", "1Gi"), ("1024Mi", "1Gi"), ("1000M", "1G"), (".001Ki", "1024m"),
     (".000001Ki", "1024u"), (".000000001Ki", "1024n"), (".000000000001Ki", "2n")],
)
def test_apimachinery_parse_emit_table(text: str, canonical: str) -> None:
    assert str(Quantity.parse(text)) == canonical
    assert str(Quantity.parse("-" + text)) == "-" + canonical


# apimachinery TestParseQuantity: (input, AsInt64 or None, String() or None when it equals the input);
# each row is checked for the input and for its negation
_REPRESENTATION = [
    ("999999999999999999", 999999999999999999, None),
    ("999999999999999999.0", None, "999999999999999999"),
    ("999999999999999999.1", None, "999999999999999999100m"),
    ("9999999999999999999", None, None),
    ("1E", 10**18, None),
    ("1000000000000000000", None, "1E"),
    ("9999999999999999999.0", None, "9999999999999999999"),
    ("1.0E", 10**18, "1E"),
    ("1000000000000000000.0", None, "1E"),
    ("9999999999999999999000m", None, "9999999999999999999"),
    ("9999999999999999999.1", None, "9999999999999999999100m"),
    ("1.0000000000000000001E", None, "1000000000000000000100m"),
    ("1000000000000000000.1", None, "1000000000000000000100m"),
    ("1.000000000000000001E", None, "1000000000000000001"),
    ("1000000000000000001", None, None),
    ("10E", None, None),
    ("10000000000000000000", None, "10E"),
    ("10.0E", None, "10E"),
    ("10000000000000000000.0", None, "10E"),
    ("10000000000000000000000m", None, "10E"),
    ("10.0000000000000000001E", None, "10000000000000000000100m"),
    ("10000000000000000000.1", None, "10000000000000000000100m"),
    ("10.000000000000000001E", None, "10000000000000000001"),
    ("10000000000000000001", None, None),
    ("9223372036854775806", None, None),
    ("9223372036854775806.0", None, "9223372036854775806"),
    ("9223372036854775806000m", None, "9223372036854775806"),
    ("9223372036854775806.1", None, "9223372036854775806100m"),
    ("9223372036854775807", None, None),
    ("9223372036854775807.0", None, "9223372036854775807"),
    ("9223372036854775807000m", None, "9223372036854775807"),
    ("9223372036854775807.1", None, "9223372036854775807100m"),
    ("9223372036854775808", None, None),
    ("9223372036854775808000m", None, "9223372036854775808"),
    ("9223372036854775808.1", None, "9223372036854775808100m"),
]


@pytest.mark.parametrize("negative", [False, True])
@pytest.mark.parametrize(("text", "as_int64", "canonical"), _REPRESENTATION, ids=[r[0] for r in _REPRESENTATION])
def test_apimachinery_representation_table(text: str, as_int64: int | None, canonical: str | None,
                                           negative: bool) -> None:
    q = Quantity.parse(("-" if negative else "") + text)
    expected_int = None if as_int64 is None else (-as_int64 if negative else as_int64)
    assert q.as_int64() == expected_int
    expected_text = canonical if canonical is not None else text
    assert str(q) == ("-" if negative else "") + expected_text


# -- JSON values: parse_quantity / quantity_bytes, what config, allocation, validation and profiles call ----


@pytest.mark.parametrize(
    ("value", "exact"),
    [("132", 132), ("80Gi", 80 * 2**30), ("1.5", Fraction(3, 2)), ("500m", Fraction(1, 2)), ("1k", 1000),
     ("1E", 10**18), ("1e3", 1000), ("2E-3", Fraction(2, 1000)), (".5Ki", 512), ("+3", 3), ("-1", -1), (7, 7),
     (2**70, 2**70), ("1n", Fraction(1, 10**9)), ("Gi", 0)],
)
def test_json_values_parse_exactly(value: str | int, exact: Fraction | int) -> None:
    assert parse_quantity(value).fraction() == exact


@pytest.mark.parametrize("value", ["", "80GB", "1.2.3", "1 Gi", "0x10", True, None, 1.5, float("inf"), [1]])
def test_json_values_that_are_not_quantities_raise(value: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(value)


def test_json_floats_and_booleans_are_refused_by_name() -> None:
    # a float would be read by its repr, which is not what the user wrote; callers that must accept one
    # (the slice validator) turn it into text themselves
    with pytest.raises(ValueError, match=r"^not a quantity: 1\.5$"):
        parse_quantity(1.5)
    with pytest.raises(ValueError, match=r"^not a quantity: True$"):
        parse_quantity(True)


def test_quantities_as_bytes_round_up_like_kubernetes() -> None:
    assert quantity_bytes("12Gi") == 12 * 1024**3
    assert quantity_bytes("1.5") == 2  # rounded up like Quantity.Value()
    assert quantity_bytes(4096) == 4096
    assert quantity_bytes("1e3") == 1000
    assert quantity_bytes("1.5Gi", whole=True) == 1536 * 2**20


@pytest.mark.parametrize("value", ["1.5", "100m", "1.9999", "1n"])
def test_whole_bytes_refuse_fractions(value: str) -> None:
    with pytest.raises(ValueError, match=f"^{value} is not a whole number of bytes$"):
        quantity_bytes(value, whole=True)
    assert quantity_bytes_or_none(value, whole=True) is None
    assert quantity_bytes_or_none(value) == quantity_bytes(value)


def test_bytes_or_none_is_none_for_non_quantities() -> None:
    assert quantity_bytes_or_none("eighty gigs") is None
    assert quantity_bytes_or_none(None) is None
    assert quantity_bytes_or_none("80Gi") == 80 * 2**30


# -- writing quantities: for the apiserver (canonical) and for people (format_bytes) ------------------------


@pytest.mark.parametrize(
    ("value", "binary", "expected"),
    [
        (0, False, "0"),
        (7, False, "7"),
        (132, False, "132"),
        (1000, False, "1k"),
        (1500, False, "1500"),
        (2_000_000, False, "2M"),
        (10**21, False, "1000E"),
        (81559 * (1 << 20), True, "81559Mi"),
        (80 * 2**30, True, "80Gi"),
        (1536, True, "1536"),
        (3000, True, "3k"),
        (1000, True, "1k"),
        (1024 * 1000, True, "1000Ki"),
    ],
)
def test_canonical_quantity_matches_the_apiserver_serialisation(value: int, binary: bool, expected: str) -> None:
    assert canonical_quantity(value, binary=binary) == expected
    assert parse_quantity(expected).fraction() == value


def test_canonical_quantity_rejects_negative_values() -> None:
    with pytest.raises(ValueError, match="negative"):
        canonical_quantity(-1)


def test_format_bytes_writes_the_shortest_exact_quantity_in_the_largest_whole_unit() -> None:
    assert [format_bytes(n) for n in (4 << 30, 3 << 20, 1536 << 20, 1000, 0)] == ["4Gi", "3Mi", "1536Mi", "1000", "0"]
    assert format_bytes(Fraction(1, 2)) == "0.5"  # only a request policy's rounding makes fractions
    for n in (4 << 30, 1536 << 20, 1000):
        assert parse_quantity(format_bytes(n)).value() == n


def test_format_bytes_approximate_is_gib_with_one_decimal_and_mib_below_one_gib() -> None:
    assert format_bytes(40 << 30, approximate=True) == "40Gi"
    assert format_bytes(81559 << 20, approximate=True) == "79.6Gi"
    assert format_bytes(512 << 20, approximate=True) == "512Mi"
    assert format_bytes(0, approximate=True) == "0Gi"
