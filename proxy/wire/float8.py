"""float8 (double precision) in PostgreSQL's text format: float8out and float8in, in Python."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Final

from proxy.errors import InvalidParameterValue

__all__ = ["format_float8", "parse_float8"]

# PostgreSQL's d2s.c prints fixed-point while the decimal exponent is in [-4, 15).
_FIXED_MIN_EXPONENT: Final = -4
_FIXED_MAX_EXPONENT: Final = 15

# What float8in accepts through strtod: decimal and hexadecimal notation, NaN, infinities.
_FLOAT8_INPUT: Final = re.compile(
    r"\s*(?P<number>[+-]?(?:(?P<mantissa>\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?"
    r"|0x(?P<hex>[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?\d+)?"
    r"|(?P<infinity>inf(?:inity)?)|nan))\s*",
    re.ASCII | re.IGNORECASE,
)


def format_float8(value: float) -> str:
    """Render a float exactly as PostgreSQL 12+ float8out does (extra_float_digits >= 1).

    The digits are the shortest that read back as the same float (what `repr` finds, and
    PostgreSQL's Ryu port too); the layout is PostgreSQL's: fixed-point for decimal exponents
    in [-4, 15), otherwise ``d.ddde+XX`` with at least two exponent digits.

    Args:
        value: the float.

    Returns:
        The text PostgreSQL would send.

    >>> [format_float8(x) for x in (0.1, 100000.0, 1e20, 1e15, 1e14, 1e-5, -0.0)]
    ['0.1', '100000', '1e+20', '1e+15', '100000000000000', '1e-05', '-0']
    >>> format_float8(float("inf")), format_float8(float("nan"))
    ('Infinity', 'NaN')
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    assert isinstance(exponent, int)  # finite
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    exponent += len(digit_tuple) - len(digits)
    point = exponent + len(digits) - 1  # decimal exponent of the leading digit
    if _FIXED_MIN_EXPONENT <= point < _FIXED_MAX_EXPONENT:
        return sign + _fixed(digits, point)
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{'-' if point < 0 else '+'}{abs(point):02d}"


def _fixed(digits: str, point: int) -> str:
    if point < 0:
        return "0." + "0" * (-point - 1) + digits
    if point + 1 >= len(digits):
        return digits + "0" * (point + 1 - len(digits))
    return digits[: point + 1] + "." + digits[point + 1 :]


def parse_float8(text: str) -> float:
    """Read a float as PostgreSQL's float8in does: decimal or hex syntax, NaN and Infinity.

    Args:
        text: the value, possibly surrounded by whitespace.

    Returns:
        The float.

    Raises:
        InvalidParameterValue: not a number, or too large or too small for float8
            (PostgreSQL's 22P02 and 22003).

    >>> parse_float8(" -1.5e3 "), parse_float8("-Infinity"), parse_float8("4.9e-324")
    (-1500.0, -inf, 5e-324)
    >>> parse_float8("0x1.8p1")
    3.0
    """
    match = _FLOAT8_INPUT.fullmatch(text)
    if match is None:
        raise InvalidParameterValue(f'invalid input syntax for type double precision: "{text}"')
    number, mantissa = match["number"], match["mantissa"] or match["hex"]
    try:
        value = float.fromhex(number) if match["hex"] else float(number)
    except OverflowError:  # float.fromhex refuses what float() would round to infinity
        value = math.inf
    overflow = math.isinf(value) and match["infinity"] is None
    underflow = value == 0 and mantissa is not None and mantissa.strip("0.") != ""
    if overflow or underflow:
        raise InvalidParameterValue(f'"{text}" is out of range for type double precision')
    return value
