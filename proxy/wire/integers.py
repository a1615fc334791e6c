"""PostgreSQL 16's integer input syntax, shared by int4in, int8in and numeric_in."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["parse_integer_syntax", "DIGITS"]

#: Decimal digits with single underscores between them (PostgreSQL 16).
DIGITS: Final = r"\d(?:_?\d)*"

_INTEGER: Final = re.compile(
    r"\s*(?P<sign>[+-]?)(?:0x(?P<hex>(?:_?[0-9a-f])+)|0o(?P<oct>(?:_?[0-7])+)"
    rf"|0b(?P<bin>(?:_?[01])+)|(?P<dec>{DIGITS}))\s*",
    re.ASCII | re.IGNORECASE,
)
_BASES: Final = {"hex": 16, "oct": 8, "bin": 2, "dec": 10}


def parse_integer_syntax(text: str) -> int | None:
    """Read an integer literal: decimal, or 0x/0o/0b with underscores between digits.

    Args:
        text: the literal, possibly surrounded by whitespace.

    Returns:
        Its value, unbounded; None when the syntax is invalid.

    >>> parse_integer_syntax(" -0x_7f "), parse_integer_syntax("1_000"), parse_integer_syntax("1_")
    (-127, 1000, None)
    """
    match = _INTEGER.fullmatch(text)
    if match is None:
        return None
    base = next(key for key in _BASES if match[key] is not None)
    value = int(match[base].replace("_", ""), _BASES[base])
    return -value if match["sign"] == "-" else value
