"""numeric as `decimal.Decimal`: PostgreSQL's base-10000 binary format and its text format.

Binary layout (numeric_send / numeric_recv): Int16 ndigits, Int16 weight, UInt16 sign,
UInt16 dscale, then ndigits base-10000 digits, most significant first. The value is
sum(digit[i] * 10000 ** (weight - i)); dscale is the number of decimal digits shown after
the point. Leading and trailing zero digits are never sent; zero has no digits.

No arithmetic here goes through a `decimal` context, so nothing is rounded to 28 digits.
"""

from __future__ import annotations

import re
import struct
from decimal import Decimal, InvalidOperation
from typing import Final

from proxy.errors import InvalidParameterValue
from proxy.wire.integers import DIGITS, parse_integer_syntax

__all__ = ["numeric_to_binary", "numeric_from_binary", "format_numeric", "parse_numeric"]

_HEADER: Final = struct.Struct("!HhHH")
_POSITIVE: Final = 0x0000
_NEGATIVE: Final = 0x4000
_NAN: Final = 0xC000
_PLUS_INFINITY: Final = 0xD000
_MINUS_INFINITY: Final = 0xF000
_DSCALE_MAX: Final = 0x3FFF
# What numeric_send emits as dscale for +-Infinity: their short header, read as a dscale.
_INFINITY_DSCALE: Final = 32
_DIGITS_PER_GROUP: Final = 4
_WEIGHT_MIN, _WEIGHT_MAX = -(1 << 15), (1 << 15) - 1

# numeric_in (PostgreSQL 16): NaN, signed infinities, decimals with underscores between digits.
_NUMERIC_INPUT: Final = re.compile(
    r"\s*(?:(?P<nan>nan)|(?P<sign>[+-]?)(?:(?P<infinity>inf(?:inity)?)"
    rf"|(?P<number>(?:{DIGITS}(?:\.(?:{DIGITS})?)?|\.{DIGITS})(?:e[+-]?{DIGITS})?)))\s*",
    re.ASCII | re.IGNORECASE,
)


def _groups(digits: tuple[int, ...], exponent: int) -> tuple[int, list[int]]:
    """Split coefficient * 10 ** exponent into (weight, base-10000 digits), zeros stripped."""
    pad_right = exponent % _DIGITS_PER_GROUP  # align the last digit on a group boundary
    padded = (0,) * (-(len(digits) + pad_right) % _DIGITS_PER_GROUP) + digits + (0,) * pad_right
    groups = [
        int("".join(map(str, padded[i : i + _DIGITS_PER_GROUP])))
        for i in range(0, len(padded), _DIGITS_PER_GROUP)
    ]
    weight = len(groups) - 1 + (exponent - pad_right) // _DIGITS_PER_GROUP
    first = next((i for i, group in enumerate(groups) if group), len(groups))
    last = len(groups) - next((i for i, group in enumerate(reversed(groups)) if group), 0)
    groups = groups[first:last]
    return (weight - first if groups else 0), groups


def _layout(value: Decimal) -> tuple[int, int, int, list[int]]:
    """(weight, sign, dscale, digits) of a finite Decimal, checked against the format's limits."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # callers handled NaN and infinities
    dscale = max(0, -exponent)
    weight, groups = _groups(digits, exponent)
    if dscale > _DSCALE_MAX or not _WEIGHT_MIN <= weight <= _WEIGHT_MAX:
        raise ValueError(f"{value} overflows the numeric format")
    return weight, (_NEGATIVE if sign and groups else _POSITIVE), dscale, groups


def numeric_to_binary(value: Decimal) -> bytes:
    """Encode a Decimal as numeric_send does.

    Args:
        value: the number; NaN and infinities allowed, signalling NaN not.

    Returns:
        The binary value.

    Raises:
        ValueError: a signalling NaN, or beyond numeric's weight or scale.

    >>> numeric_to_binary(Decimal("-1.5")).hex(" ", 2)
    '0002 0000 4000 0001 0001 1388'
    """
    if value.is_snan():
        raise ValueError("numeric has no signalling NaN")
    if value.is_nan():
        return _HEADER.pack(0, 0, _NAN, 0)
    if value.is_infinite():
        sign = _MINUS_INFINITY if value.is_signed() else _PLUS_INFINITY
        return _HEADER.pack(0, 0, sign, _INFINITY_DSCALE)
    weight, sign, dscale, groups = _layout(value)
    return _HEADER.pack(len(groups), weight, sign, dscale) + struct.pack(
        f"!{len(groups)}H", *groups
    )


def _invalid(reason: str) -> InvalidParameterValue:
    return InvalidParameterValue(f'invalid {reason} in external "numeric" value')


def numeric_from_binary(data: bytes) -> Decimal:
    """Decode a binary numeric as numeric_recv does, truncating digits that dscale hides.

    Args:
        data: the value's bytes.

    Returns:
        The number, with exactly dscale digits after the point.

    Raises:
        InvalidParameterValue: malformed (PostgreSQL's 22P03).

    >>> numeric_from_binary(bytes.fromhex("0001fffe0000000503e8"))
    Decimal('0.00001')
    """
    if len(data) < _HEADER.size:
        raise InvalidParameterValue(f"binary numeric value of {len(data)} bytes lacks its header")
    count, weight, sign, dscale = _HEADER.unpack_from(data)
    if sign not in (_POSITIVE, _NEGATIVE, _NAN, _PLUS_INFINITY, _MINUS_INFINITY):
        raise _invalid("sign")
    if dscale > _DSCALE_MAX:
        raise _invalid("scale")
    if len(data) != _HEADER.size + 2 * count:
        raise InvalidParameterValue(
            f"binary numeric value has {len(data)} bytes; {count} digits need "
            f"{_HEADER.size + 2 * count}"
        )
    groups = struct.unpack_from(f"!{count}H", data, _HEADER.size)
    if any(group >= 10_000 for group in groups):
        raise _invalid("digit")
    if sign == _NAN:
        return Decimal("NaN")
    if sign in (_PLUS_INFINITY, _MINUS_INFINITY):
        return Decimal("-Infinity" if sign == _MINUS_INFINITY else "Infinity")
    return _from_groups(groups, weight, dscale, negative=sign == _NEGATIVE)


def _from_groups(groups: tuple[int, ...], weight: int, dscale: int, *, negative: bool) -> Decimal:
    digits = "".join(f"{group:04d}" for group in groups)
    exponent = _DIGITS_PER_GROUP * (weight - len(groups) + 1)  # of the last digit
    if exponent < -dscale:
        digits = digits[: max(0, len(digits) + exponent + dscale)]  # numeric_recv truncates
    else:
        digits += "0" * (exponent + dscale)
    coefficient = tuple(int(d) for d in digits) or (0,)
    is_zero = not any(coefficient)
    return Decimal((1 if negative and not is_zero else 0, coefficient, -dscale))


def format_numeric(value: Decimal) -> str:
    """Render a Decimal as numeric_out does: no exponent, dscale digits after the point.

    Args:
        value: the number.

    Returns:
        The text PostgreSQL would send.

    Raises:
        ValueError: a signalling NaN, or beyond numeric's weight or scale.

    >>> [format_numeric(Decimal(s)) for s in ("1.50", "1E+3", "-0.00", "-inf", "NaN")]
    ['1.50', '1000', '0.00', '-Infinity', 'NaN']
    """
    if value.is_snan():
        raise ValueError("numeric has no signalling NaN")
    if value.is_nan():
        return "NaN"
    if value.is_infinite():
        return "-Infinity" if value.is_signed() else "Infinity"
    _layout(value)  # enforce the same limits as the binary format
    return format(value.copy_abs() if value.is_zero() else value, "f")


def parse_numeric(text: str) -> Decimal:
    """Read a numeric as PostgreSQL's numeric_in does.

    Args:
        text: the value, possibly surrounded by whitespace.

    Returns:
        The number, keeping the scale written (``"1.50"`` has two decimals).

    Raises:
        InvalidParameterValue: not a number, or beyond numeric's range (22P02, 22003).

    >>> [parse_numeric(text) for text in (" 1.50 ", "-Inf", "1_2e-3", "0x1F")]
    [Decimal('1.50'), Decimal('-Infinity'), Decimal('0.012'), Decimal('31')]
    """
    match = _NUMERIC_INPUT.fullmatch(text)
    if match is None:
        integer = parse_integer_syntax(text)  # also 0x1F, 0o17, 0b101
        if integer is None:
            raise InvalidParameterValue(f'invalid input syntax for type numeric: "{text}"')
        return _checked(Decimal(integer), text)
    if match["nan"] is not None:
        return Decimal("NaN")
    if match["infinity"] is not None:
        return Decimal(match["sign"] + "Infinity")
    try:
        value = Decimal(match["sign"] + match["number"].replace("_", ""))
    except InvalidOperation:  # an exponent beyond even Decimal's range
        raise InvalidParameterValue(f'"{text}" overflows the numeric format') from None
    return _checked(value, text)


def _checked(value: Decimal, text: str) -> Decimal:
    try:
        _layout(value)
    except ValueError:
        raise InvalidParameterValue(f'"{text}" overflows the numeric format') from None
    return value
