"""Kubernetes resource quantities, parsed and compared exactly as apimachinery does.

tessera's one quantity type: CEL selectors, GpuConfig's totalMemory, allocation results, the slice
validator, simulated profiles and the webhook all parse with it, so they agree with each other and with
the apiserver. Values as JSON carries them (a string or an integer) go through `parse_quantity`, and
`quantity_bytes` when whole bytes are what the caller wants. Free of CEL imports: the node agent uses it.

`kubernetes.utils.parse_quantity` rounds through a 28-digit Decimal context and accepts strings
Go rejects, so it cannot decide a selector the way the scheduler does. This module follows the
Go implementation (`k8s.io/apimachinery/pkg/api/resource`) step by step, including its internal
representation: CEL's `isInteger()`/`asInteger()` and `asApproximateFloat()` answer differently
for the same number depending on whether Go holds it as a scaled int64 or as an `inf.Dec`.

Representation (mirrors Go):
- int form: ``value * 10**scale`` with ``value`` in int64 range (Go's `int64Amount`),
- dec form: ``unscaled * 10**-dec_scale`` with an unbounded integer (Go's `inf.Dec`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

Format = Literal["DecimalExponent", "BinarySI", "DecimalSI"]

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
_NANO = -9
# Go keeps at most 18 decimal digits on the int64 fast path.
_MAX_INT64_FACTORS = 18

_DEC_SUFFIXES: dict[str, int] = {
    "n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
}
_BIN_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DEC_EXPONENT_TO_SUFFIX = {v: k for k, v in _DEC_SUFFIXES.items()}
_BIN_EXPONENT_TO_SUFFIX = {v: k for k, v in _BIN_SUFFIXES.items()}
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")

QUANTITY_PATTERN = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
_FORMAT_ERROR = f"quantities must match the regular expression '{QUANTITY_PATTERN}'"


def _fits_int64(v: int) -> bool:
    return INT64_MIN <= v <= INT64_MAX


def _to_int32(v: int) -> int:
    """Go's int32(x) conversion: keep the low 32 bits, two's complement."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


def _go_pow10(n: int) -> float:
    """Go's math.Pow10: table-based, so some results differ from Python's 10.0 ** n in the last bit."""
    if 0 <= n <= 308:
        return float(f"1e{(n // 32) * 32}") * float(f"1e{n % 32}")
    if -323 <= n <= 0:
        m = -n
        return float(f"1e-{(m // 32) * 32}") / float(f"1e{m % 32}")
    return float("inf") if n > 0 else 0.0


def _int_to_float(v: int) -> float:
    try:
        return float(v)
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")


def _round_up_div(value: int, divisor: int) -> tuple[int, bool]:
    """value / divisor rounded away from zero, and whether it was exact."""
    q, r = divmod(abs(value), divisor)
    if r:
        q += 1
    return (q if value >= 0 else -q), r == 0


def _digits_end(s: str, pos: int) -> int:
    while pos < len(s) and s[pos] in _DIGITS:
        pos += 1
    return pos


def _suffix_shape_ok(suffix: str) -> bool:
    """Whether suffix matches `[eEinumkKMGTP]*[-+]?[0-9]*`, the shape Go's scanner accepts after the number."""
    pos = 0
    while pos < len(suffix) and suffix[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < len(suffix) and suffix[pos] in "+-":
        pos += 1
    return _digits_end(suffix, pos) == len(suffix)


def _scan(s: str) -> tuple[bool, str, str, str, str]:
    """Go's parseQuantityString: (positive, value, num, denom, suffix); raises ValueError on bad format."""
    positive = True
    pos = 0
    if s[:1] in ("+", "-"):
        positive = s[0] == "+"
        pos = 1
    while pos < len(s) and s[pos] == "0":  # strip leading zeros
        pos += 1
    if pos >= len(s):
        return positive, "0", "0", "", ""
    start = pos
    pos = _digits_end(s, pos)
    num = s[start:pos]
    if pos >= len(s):
        return positive, s, num, "", ""
    num = num or "0"
    denom = ""
    if s[pos] == ".":
        start = pos + 1
        pos = _digits_end(s, start)
        denom = s[start:pos]
        if pos >= len(s):
            return positive, s, num, denom, ""
    if not _suffix_shape_ok(s[pos:]):
        raise ValueError(_FORMAT_ERROR)
    return positive, s[:pos], num, denom, s[pos:]


def _go_parse_int64(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64): optional sign, ASCII digits, int64 range."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or any(c not in _DIGITS for c in body):
        return None
    v = int(text)
    return v if _fits_int64(v) else None


def _interpret_suffix(suffix: str) -> tuple[int, int, Format]:
    if suffix in _DEC_SUFFIXES:
        return 10, _DEC_SUFFIXES[suffix], "DecimalSI"
    if suffix in _BIN_SUFFIXES:
        return 2, _BIN_SUFFIXES[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE":
        parsed = _go_parse_int64(suffix[1:])
        if parsed is not None:
            # Go truncates the exponent to int32: "1e4294967296" is 1.
            return 10, _to_int32(parsed), "DecimalExponent"
    raise ValueError("unable to parse quantity's suffix")


def _parse_dec(value: str) -> tuple[int, int]:
    """inf.Dec SetString for the scanner's value part: [sign] digits [. digits]."""
    sign = -1 if value.startswith("-") else 1
    body = value.lstrip("+-")
    whole, _, frac = body.partition(".")
    digits = whole + frac
    if not digits:
        raise ValueError("unable to parse numeric part of quantity")
    return sign * int(digits), len(frac)


def _int64_form(s: str, *, positive: bool, num: str, denom: str, exponent: int, fmt: Format) -> Quantity | None:
    """Go's int64 fast path of ParseQuantity; None where Go falls back to inf.Dec."""
    scale = 0
    mantissa = 1
    if fmt == "BinarySI":
        if exponent < 0 or denom:
            return None
        mantissa = 1 << exponent
        # float32(exponent)*3/10 truncated, as Go computes it
        precision = 15 - len(num) - int(exponent * 3 / 10) - 1
    else:
        scale = exponent
        precision = _MAX_INT64_FACTORS - (len(num) + len(denom))
    if precision < 0:
        return None
    scale -= len(denom)
    if scale < _NANO:
        return None
    shifted = num + denom
    parsed = _go_parse_int64(shifted)
    if parsed is None:
        raise ValueError("unable to parse numeric part of quantity")
    result = parsed * mantissa
    if not _fits_int64(result):
        return None
    canonical = (
        exponent % 10 == 0 and (parsed & 0x07) != 0
        if fmt == "BinarySI"
        else _go_rem(scale, 3) == 0 and not shifted.endswith("000") and shifted[0] != "0"
    )
    return Quantity(int_amount=(result if positive else -result, scale), fmt=fmt, text=s if canonical else "")


def _dec_form(value: str, base: int, exponent: int, fmt: Format) -> Quantity:
    """Go's inf.Dec path of ParseQuantity: exact, rounded up to nano precision."""
    unscaled, dec_scale = _parse_dec(value)
    if base == 10:
        dec_scale -= exponent
    else:
        unscaled <<= exponent
    negative = unscaled < 0
    unscaled = abs(unscaled)
    if unscaled != 0 and dec_scale != -_NANO:
        unscaled, dec_scale = _dec_round_up(unscaled, dec_scale, -_NANO)
    if fmt == "BinarySI" and _dec_fraction(unscaled, dec_scale) > INT64_MAX:
        unscaled, dec_scale = INT64_MAX, 0
    if fmt == "BinarySI" and 0 < _dec_fraction(unscaled, dec_scale) < 1:
        fmt = "DecimalSI"
    return Quantity(dec_amount=(-unscaled if negative else unscaled, dec_scale), fmt=fmt)


class Quantity:
    """An immutable Kubernetes quantity (see module docstring for the representation)."""

    __slots__ = ("_dec", "_int", "_s", "format")

    def __init__(
        self,
        *,
        int_amount: tuple[int, int] | None = None,
        dec_amount: tuple[int, int] | None = None,
        fmt: Format = "DecimalSI",
        text: str = "",
    ) -> None:
        if (int_amount is None) == (dec_amount is None):
            raise ValueError("Quantity needs exactly one of int_amount and dec_amount")
        if int_amount is not None and not _fits_int64(int_amount[0]):
            raise ValueError(f"int amount {int_amount[0]} does not fit in int64")
        self._int = int_amount
        self._dec = dec_amount
        self.format: Format = fmt
        self._s = text

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_int(cls, value: int, fmt: Format = "DecimalSI") -> Quantity:
        """Go's NewQuantity(value, format)."""
        return cls(int_amount=(value, 0), fmt=fmt)

    @classmethod
    def parse(cls, s: str) -> Quantity:
        """Go's ParseQuantity. Raises ValueError with Go's message on anything Go rejects."""
        if not isinstance(s, str):
            raise ValueError(f"quantity must be a string, not {type(s).__name__}")
        if not s or not s.isascii():
            raise ValueError(_FORMAT_ERROR)
        if s == "0":
            return cls(int_amount=(0, 0), fmt="DecimalSI", text=s)
        positive, value, num, denom, suffix = _scan(s)
        base, exponent, fmt = _interpret_suffix(suffix)
        fast = _int64_form(s, positive=positive, num=num, denom=denom, exponent=exponent, fmt=fmt)
        return fast if fast is not None else _dec_form(value, base, exponent, fmt)

    # -- inspection -----------------------------------------------------------------------------

    @property
    def is_int_form(self) -> bool:
        """True when Go holds this value as a scaled int64 (not as inf.Dec)."""
        return self._int is not None

    def fraction(self) -> Fraction:
        """The exact value."""
        if self._int is not None:
            v, sc = self._int
            return Fraction(v) * 10**sc if sc >= 0 else Fraction(v, 10**-sc)
        assert self._dec is not None
        return _dec_fraction(*self._dec)

    def sign(self) -> int:
        f = self.fraction()
        return (f > 0) - (f < 0)

    def is_zero(self) -> bool:
        return self.sign() == 0

    def cmp(self, other: Quantity) -> int:
        a, b = self.fraction(), other.fraction()
        return (a > b) - (a < b)

    def as_int64(self) -> int | None:
        """Go's AsInt64: the value when the int64 fast path can express it, else None."""
        if self._int is None:
            return None
        v, sc = self._int
        if sc == 0:
            return v
        if sc < 0:
            return None
        result = v * 10**sc
        return result if _fits_int64(result) else None

    def value(self) -> int:
        """Go's Value(): the value rounded up to an integer.

        Go rounds the int64 form away from zero but the inf.Dec form by truncating and adding one
        when there is a remainder (so -1.5 in Dec form gives 0); both are reproduced. Go silently
        overflows past int64; this returns the exact Python int instead.
        """
        f = self.fraction()
        if self._int is not None:
            return _round_up_div(f.numerator, f.denominator)[0]
        trunc = abs(f.numerator) // f.denominator * (1 if f >= 0 else -1)
        return trunc + (1 if f.denominator != 1 and Fraction(trunc) != f else 0)

    def milli_value(self) -> int:
        """Go's MilliValue(): the value times 1000, rounded up (away from zero)."""
        f = self.fraction() * 1000
        q, _ = _round_up_div(f.numerator, f.denominator)
        return q

    def as_approximate_float(self) -> float:
        """Go's AsApproximateFloat64, bit for bit (including math.Pow10's table rounding)."""
        if self._dec is not None:
            base = _int_to_float(self._dec[0])
            exponent = -self._dec[1]
        else:
            assert self._int is not None
            base = float(self._int[0])
            exponent = self._int[1]
        if exponent == 0:
            return base
        return base * _go_pow10(exponent)

    # -- arithmetic (Go's Add/Sub, including the int64 overflow switch to inf.Dec) --------------

    def add(self, other: Quantity) -> Quantity:
        fmt = self.format
        if self._int is not None and other._int is not None:
            if self._int[0] == 0:
                fmt = other.format
            summed = _int_add(self._int, other._int)
            if summed is not None:
                return Quantity(int_amount=summed, fmt=fmt)
        elif self.is_zero():
            fmt = other.format
        a, b = self._as_dec(), other._as_dec()
        return Quantity(dec_amount=_dec_add(a, b), fmt=fmt)

    def sub(self, other: Quantity) -> Quantity:
        fmt = self.format
        if self.is_zero():
            fmt = other.format
        if self._int is not None and other._int is not None:
            if self._int[0] == 0 and other._int[0] == INT64_MIN:
                neg = -other._int[0]
                return Quantity(dec_amount=(neg, -other._int[1]), fmt=fmt)
            diff = _int_add(self._int, (-other._int[0], other._int[1]))
            if diff is not None:
                return Quantity(int_amount=diff, fmt=fmt)
        a, b = self._as_dec(), other._as_dec()
        return Quantity(dec_amount=_dec_add(a, (-b[0], b[1])), fmt=fmt)

    def _as_dec(self) -> tuple[int, int]:
        if self._dec is not None:
            return self._dec
        assert self._int is not None
        return self._int[0], -self._int[1]

    # -- formatting -----------------------------------------------------------------------------

    def __str__(self) -> str:
        if self._s:
            return self._s
        return self._canonical()

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def _canonical(self) -> str:
        if self.is_zero():
            return "0"
        fmt = self.format
        f = self.fraction()
        if fmt == "BinarySI" and (-1024 < f < 1024 or f.denominator != 1):
            fmt = "DecimalSI"
        if fmt == "BinarySI":
            amount = f.numerator
            times = 0
            while abs(amount) >= 1024 and amount % 1024 == 0:
                amount //= 1024
                times += 1
            return f"{amount}{_BIN_EXPONENT_TO_SUFFIX.get(times * 10, '')}"
        mantissa, exponent = _decimal_digits(f)
        shift = exponent % 3
        mantissa *= 10**shift
        exponent -= shift
        if fmt == "DecimalSI" and exponent in _DEC_EXPONENT_TO_SUFFIX:
            suffix = _DEC_EXPONENT_TO_SUFFIX[exponent]
        else:
            suffix = f"e{exponent}" if exponent != 0 else ""
        return f"{mantissa}{suffix}"

    # -- Python protocol ------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.fraction() == other.fraction()

    def __hash__(self) -> int:
        return hash(self.fraction())

    def __lt__(self, other: Quantity) -> bool:
        return self.cmp(other) < 0

    def __le__(self, other: Quantity) -> bool:
        return self.cmp(other) <= 0

    def __gt__(self, other: Quantity) -> bool:
        return self.cmp(other) > 0

    def __ge__(self, other: Quantity) -> bool:
        return self.cmp(other) >= 0


def canonical_roundtrip(s: str) -> Quantity:
    """Parse s the way the scheduler sees it: the apiserver stores String() and readers re-parse it."""
    return Quantity.parse(str(Quantity.parse(s)))


def parse_quantity(value: object) -> Quantity:
    """A quantity as JSON carries it: a string ("12Gi") or an integer; ValueError when it is not one.

    An integer is read as its decimal text, as apimachinery reads a JSON number. Floats and booleans are
    refused: callers that must accept a JSON float (the slice validator) turn it into text themselves.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"not a quantity: {value!r}")
    return Quantity.parse(str(value))


def quantity_bytes(value: object, *, whole: bool = False) -> int:
    """A memory quantity as bytes, rounded up the way Kubernetes' `Quantity.Value()` does.

    ValueError when `value` is not a quantity, and with `whole` also when it is not a whole number
    ("1.5", "100m"), for callers that must not round a user's amount silently.
    """
    quantity = parse_quantity(value)
    if whole and quantity.fraction().denominator != 1:
        raise ValueError(f"{value} is not a whole number of bytes")
    return quantity.value()


def quantity_bytes_or_none(value: object, *, whole: bool = False) -> int | None:
    """`quantity_bytes`, or None when it raises: for callers that report a bad value in their own words."""
    try:
        return quantity_bytes(value, whole=whole)
    except ValueError:
        return None


def canonical_quantity(value: int, *, binary: bool = False) -> str:
    """`value` written the way the apiserver writes it back, so a stored slice compares equal to ours.

    The apiserver re-serialises every quantity in canonical form ("1000" comes back as "1k"); publishing
    anything else would make each comparison with the stored object report a change. `binary` picks
    the power-of-1024 suffixes (bytes: "80Gi", "9856Mi").
    """
    if value < 0:
        raise ValueError(f"quantities tessera publishes are never negative, got {value}")
    if value == 0:
        return "0"
    # A bare number is read back as a decimal quantity, so only a value that takes a binary suffix stays binary.
    if binary and value % 1024 == 0:
        exponent = 0
        while value % 1024 == 0 and exponent < max(_BIN_EXPONENT_TO_SUFFIX):
            value //= 1024
            exponent += 10
        return f"{value}{_BIN_EXPONENT_TO_SUFFIX.get(exponent, '')}"
    exponent = 0
    while value % 10 == 0:
        value //= 10
        exponent += 1
    value *= 10 ** (exponent % 3)
    exponent -= exponent % 3
    if exponent > _DEC_SUFFIXES["E"]:
        value *= 10 ** (exponent - _DEC_SUFFIXES["E"])
        exponent = _DEC_SUFFIXES["E"]
    return f"{value}{_DEC_EXPONENT_TO_SUFFIX[exponent]}"


def format_bytes(value: int | Fraction, *, approximate: bool = False) -> str:
    """An amount of bytes for people; tessera's one formatter for them.

    Exact (the default) is the shortest quantity that parses back to the same value, so a message can
    offer it as the fix to write: `40Gi`, `9856Mi`, `132` (a fraction of a byte, which only a request
    policy's rounding makes, as a decimal). Approximate is for tables and sizes: whole GiB as `40Gi`,
    other amounts from 1 GiB on with one decimal (`79.6Gi`), below it in MiB (`512Mi`).
    """
    gib, mib = 1 << 30, 1 << 20
    if approximate:
        if value % gib == 0:
            return f"{value // gib}Gi"
        if abs(float(value)) >= gib:
            return f"{float(value) / gib:.1f}Gi"
        return f"{int(value / mib)}Mi"
    if isinstance(value, Fraction):
        if value.denominator != 1:
            return f"{float(value):g}"
        value = value.numerator
    if value and value % gib == 0:
        return f"{value // gib}Gi"
    if value and value % mib == 0:
        return f"{value // mib}Mi"
    return str(value)


def _go_rem(a: int, b: int) -> int:
    """Go's % (truncated toward zero)."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _dec_fraction(unscaled: int, dec_scale: int) -> Fraction:
    return Fraction(unscaled, 10**dec_scale) if dec_scale >= 0 else Fraction(unscaled * 10**-dec_scale)


def _dec_round_up(unscaled: int, dec_scale: int, target: int) -> tuple[int, int]:
    """inf.Dec Round(x, target, RoundUp) for x >= 0: sets the scale to exactly target."""
    if dec_scale <= target:
        return unscaled * 10 ** (target - dec_scale), target
    q, _ = _round_up_div(unscaled, 10 ** (dec_scale - target))
    return q, target


def _dec_add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    scale = max(a[1], b[1])
    return a[0] * 10 ** (scale - a[1]) + b[0] * 10 ** (scale - b[1]), scale


def _int_add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """Go's int64Amount.Add: None where Go's int64 arithmetic would overflow."""
    av, asc = a
    bv, bsc = b
    if bv == 0:
        return a
    if av == 0:
        return b
    if asc == bsc:
        c = av + bv
        return (c, asc) if _fits_int64(c) else None
    if asc > bsc:
        scaled = av * 10 ** (asc - bsc)
        if not _fits_int64(scaled):
            return None
        c = scaled + bv
        return (c, bsc) if _fits_int64(c) else None
    scaled = bv * 10 ** (bsc - asc)
    if not _fits_int64(scaled):
        return None
    c = av + scaled
    return (c, asc) if _fits_int64(c) else None


def _decimal_digits(f: Fraction) -> tuple[int, int]:
    """(mantissa, exponent) with f == mantissa * 10**exponent and no trailing zeros in mantissa."""
    num, den = f.numerator, f.denominator
    exponent = 0
    while den != 1:
        # every stored quantity is a finite decimal, so the denominator only has factors 2 and 5
        num *= 10
        exponent -= 1
        g = Fraction(num, den)
        num, den = g.numerator, g.denominator
    while num % 10 == 0:
        num //= 10
        exponent += 1
    return num, exponent
