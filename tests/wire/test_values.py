"""Value codecs against PostgreSQL 16.2's recorded output, other libraries, and round trips."""

from __future__ import annotations

import json
import math
import struct
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.types.numeric import NumericBinaryLoader, dump_decimal_to_numeric_binary

from proxy.errors import DpproxyError, InvalidParameterValue, UnsupportedQuery
from proxy.wire.float8 import format_float8, parse_float8
from proxy.wire.numeric import (
    format_numeric,
    numeric_from_binary,
    numeric_to_binary,
    parse_numeric,
)
from proxy.wire.types import Oid, Value, column, decode_value, encode_value

REFERENCE = json.loads((Path(__file__).parent / "data" / "pg16_values.json").read_text())


def _bits(value: float) -> bytes:
    return struct.pack("!d", value)


def test_float8_output_matches_postgres() -> None:
    """590 floats (boundaries, random bit patterns) print exactly as PostgreSQL prints them."""
    cases = [
        (struct.unpack("!d", bytes.fromhex(h))[0], text) for h, text in REFERENCE["float8_out"]
    ]
    assert [format_float8(value) for value, _ in cases] == [text for _, text in cases]


def test_numeric_matches_postgres() -> None:
    """Text output and numeric_send bytes agree with PostgreSQL for 266 literals."""
    mismatches = []
    for literal, text, send in REFERENCE["numeric"]:
        value = parse_numeric(literal)
        sent = bytes.fromhex(send.removeprefix("\\x"))
        got = (
            format_numeric(value),
            numeric_to_binary(value),
            format_numeric(numeric_from_binary(sent)),
        )
        if got != (text, sent, text):
            mismatches.append((literal, got))
    assert mismatches == []


def _pg_result(outcome: str) -> str:
    """Errors compare by kind only: until errors.py has 22P02/22P03/22003, ours all say 22023."""
    return "ERROR" if outcome.startswith("ERROR") else outcome


def test_numeric_recv_matches_postgres() -> None:
    """Hand-made binary numerics (unnormalized, hidden digits, bad signs) read as in PostgreSQL."""
    ours = []
    for data, _ in REFERENCE["numeric_recv"]:
        try:
            ours.append(format_numeric(numeric_from_binary(bytes.fromhex(data))))
        except InvalidParameterValue:
            ours.append("ERROR")
    assert ours == [_pg_result(outcome) for _, outcome in REFERENCE["numeric_recv"]]


def _as_pg_text(value: Value | None, oid: int) -> str:
    """What ``$1::text`` prints for a decoded parameter."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format_float8(value)
    if isinstance(value, Decimal):
        return format_numeric(value)
    return str(value)


def test_text_parameters_parse_as_postgres_parses_them() -> None:
    """Integer, float, boolean and numeric input syntax is accepted and refused as in PostgreSQL."""
    ours = []
    for oid, text, _ in REFERENCE["text_input"]:
        try:
            ours.append(_as_pg_text(decode_value(text.encode(), oid), oid))
        except InvalidParameterValue:
            ours.append("ERROR")
    assert ours == [_pg_result(outcome) for _, _, outcome in REFERENCE["text_input"]]


def _numpy_pg_style(value: float) -> str:
    """An independent float8out: numpy's Dragon4 shortest digits in PostgreSQL's layout."""
    scientific = np.format_float_scientific(value, unique=True, trim="-", exp_digits=2)
    exponent = int(scientific.split("e")[1])
    if -4 <= exponent < 15:
        return np.format_float_positional(value, unique=True, trim="-")
    return scientific


finite_floats = st.floats(allow_nan=False, allow_infinity=False)


@settings(deadline=None)
@given(finite_floats)
def test_float8_text_agrees_with_numpy_and_round_trips(value: float) -> None:
    """Shortest digits, PostgreSQL's layout, and reading back gives the same bits."""
    text = format_float8(value)
    assert text == _numpy_pg_style(value)
    assert _bits(parse_float8(text)) == _bits(value)


@settings(deadline=None)
@given(st.floats())
def test_float8_binary_round_trips(value: float) -> None:
    """Binary float8 is the IEEE bits, big-endian, NaN included."""
    data = encode_value(value, Oid.FLOAT8, 1)
    assert data == _bits(value)
    decoded = decode_value(data, Oid.FLOAT8, 1)
    assert isinstance(decoded, float) and _bits(decoded) == _bits(value)


finite_numerics = st.builds(
    lambda sign, digits, exponent: Decimal((sign, tuple(digits), exponent)),
    st.integers(0, 1),
    st.lists(st.integers(0, 9), min_size=1, max_size=40),
    st.integers(-60, 60),
)
numerics = finite_numerics | st.sampled_from([Decimal("NaN"), Decimal("Inf"), Decimal("-Inf")])


def _same_numeric(a: Decimal, b: Decimal) -> bool:
    """Equal as PostgreSQL numerics: same value and same display scale."""
    return format_numeric(a) == format_numeric(b)


@settings(deadline=None)
@given(numerics)
def test_numeric_binary_round_trips(value: Decimal) -> None:
    """Binary then back keeps the value and its display scale; psycopg's loader agrees."""
    data = numeric_to_binary(value)
    back = numeric_from_binary(data)
    assert _same_numeric(back, value)
    assert _same_numeric(NumericBinaryLoader(Oid.NUMERIC).load(data), value)


@settings(deadline=None)
@given(finite_numerics)
def test_numeric_binary_matches_psycopg(value: Decimal) -> None:
    """For finite values our bytes are psycopg's (which differs only for infinities' dscale)."""
    assert numeric_to_binary(value) == bytes(dump_decimal_to_numeric_binary(value))


@settings(deadline=None)
@given(numerics)
def test_numeric_text_round_trips(value: Decimal) -> None:
    """Numeric text output parses back to the same numeric."""
    text = encode_value(value, Oid.NUMERIC)
    assert text is not None
    decoded = decode_value(text, Oid.NUMERIC)
    assert isinstance(decoded, Decimal) and _same_numeric(decoded, value)


@pytest.mark.parametrize(
    ("value", "hex_bytes"),
    [
        ("0", "0000 0000 0000 0000"),
        ("0.00", "0000 0000 0000 0002"),
        ("1", "0001 0000 0000 0000 0001"),
        ("-1.5", "0002 0000 4000 0001 0001 1388"),
        ("1234.5678", "0002 0000 0000 0004 04d2 162e"),
        ("12345678.9", "0003 0001 0000 0001 04d2 162e 2328"),
        ("0.00001", "0001 fffe 0000 0005 03e8"),
        ("100000000", "0001 0002 0000 0000 0001"),
        ("1.10", "0002 0000 0000 0002 0001 03e8"),
        ("NaN", "0000 0000 c000 0000"),
        ("Infinity", "0000 0000 d000 0020"),
        ("-Infinity", "0000 0000 f000 0020"),
    ],
)
def test_numeric_known_encodings(value: str, hex_bytes: str) -> None:
    """Worked examples of the base-10000 layout (weight, sign, dscale, digits)."""
    data = bytes.fromhex(hex_bytes)
    assert numeric_to_binary(Decimal(value)) == data
    assert format_numeric(numeric_from_binary(data)) == format_numeric(Decimal(value))


def test_numeric_recv_truncates_hidden_digits() -> None:
    """Digits beyond dscale are cut, not rounded, as numeric_recv does."""
    assert numeric_from_binary(bytes.fromhex("0002 0000 0000 0001 0001 270f")) == Decimal("1.9")
    assert str(numeric_from_binary(bytes.fromhex("0001 fffe 4000 0002 270f"))) == "0.00"


@pytest.mark.parametrize(
    ("hex_bytes", "error"),
    [
        ("0000 0000 1000 0000", 'invalid sign in external "numeric" value'),
        ("0000 0000 0000 4000", 'invalid scale in external "numeric" value'),
        ("0001 0000 0000 0000 2710", 'invalid digit in external "numeric" value'),
        ("0001 0000 0000 0000", "has 8 bytes; 1 digits need 10"),
        ("0000 0000 0000", "binary numeric value of 6 bytes lacks its header"),
    ],
)
def test_numeric_binary_refusals(hex_bytes: str, error: str) -> None:
    """Malformed binary numerics are refused with PostgreSQL's wording."""
    with pytest.raises(InvalidParameterValue, match=error):
        numeric_from_binary(bytes.fromhex(hex_bytes))


@pytest.mark.parametrize("value", [Decimal("1e-16384"), Decimal("1e131072"), Decimal("sNaN")])
def test_numeric_beyond_the_format_is_refused(value: Decimal) -> None:
    """Scale above 16383, weight above 32767, and signalling NaN cannot be sent."""
    with pytest.raises(ValueError):
        numeric_to_binary(value)


@pytest.mark.parametrize(("oid", "bits"), [(Oid.INT8, 64), (Oid.INT4, 32)])
@settings(deadline=None)
@given(data=st.data())
def test_integers_round_trip_in_both_formats(oid: Oid, bits: int, data: st.DataObject) -> None:
    """Every in-range integer survives text and binary; one past the end is refused."""
    value = data.draw(st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1))
    for fmt in (0, 1):
        assert decode_value(encode_value(value, oid, fmt), oid, fmt) == value
    with pytest.raises(ValueError, match="does not fit"):
        encode_value(2 ** (bits - 1), oid)
    with pytest.raises(InvalidParameterValue, match="out of range"):
        decode_value(str(-(2 ** (bits - 1)) - 1).encode(), oid)


@settings(deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00")), st.sampled_from((0, 1)))
def test_text_round_trips(value: str, fmt: int) -> None:
    """Text values are UTF-8 in both formats."""
    data = encode_value(value, Oid.TEXT, fmt)
    assert data == value.encode()
    assert decode_value(data, Oid.TEXT, fmt) == value


@pytest.mark.parametrize("data", [b"\xff", b"a\x00b", b"\xed\xa0\x80"])
def test_text_refuses_invalid_utf8_and_nul(data: bytes) -> None:
    """PostgreSQL refuses what is not valid UTF-8, and NUL bytes, in text values."""
    with pytest.raises(InvalidParameterValue, match="invalid byte sequence"):
        decode_value(data, Oid.TEXT, 1)


def test_booleans() -> None:
    """t/f in text, one byte in binary where any non-zero byte is true."""
    assert [encode_value(v, Oid.BOOL, f) for v in (True, False) for f in (0, 1)] == [
        b"t", b"\x01", b"f", b"\x00"
    ]  # fmt: skip
    assert decode_value(b"\x02", Oid.BOOL, 1) is True
    with pytest.raises(InvalidParameterValue, match="boolean takes 1 bytes, got 2"):
        decode_value(b"\x00\x01", Oid.BOOL, 1)


@pytest.mark.parametrize(
    ("value", "oid", "error"),
    [
        (True, Oid.INT8, TypeError),
        ("1", Oid.INT4, TypeError),
        (1.5, Oid.NUMERIC, TypeError),
        (1, Oid.BOOL, TypeError),
        (b"x", Oid.TEXT, TypeError),
        ("a\x00", Oid.TEXT, ValueError),
        (Decimal("1"), Oid.FLOAT8, TypeError),
    ],
)
def test_encode_refuses_the_wrong_python_type(value: object, oid: Oid, error: type) -> None:
    """A result of the wrong type is a bug upstream, reported as such."""
    with pytest.raises(error):
        encode_value(value, oid)  # type: ignore[arg-type]


def test_null_and_lookup_errors() -> None:
    """None is NULL both ways; unknown types and format codes are refused."""
    assert encode_value(None, Oid.INT8, 1) is None
    assert decode_value(None, Oid.NUMERIC, 1) is None
    with pytest.raises(UnsupportedQuery, match="OID 1114"):
        decode_value(b"x", 1114)
    with pytest.raises(DpproxyError, match="unsupported format code: 2"):
        encode_value(1, Oid.INT8, 2)


def test_float8_input_edges() -> None:
    """Overflow and underflow are errors, denormals and explicit infinities are not."""
    assert math.isinf(parse_float8("-Infinity")) and parse_float8("4.9e-324") == 5e-324
    for text in ("1e400", "1e-400", "abc", ""):
        with pytest.raises(InvalidParameterValue):
            parse_float8(text)


def test_column_descriptions() -> None:
    """RowDescription fields carry PostgreSQL's typlen for each supported type."""
    sizes = {oid: column("c", oid).type_size for oid in Oid}
    assert sizes == {
        Oid.BOOL: 1, Oid.INT8: 8, Oid.INT4: 4, Oid.TEXT: -1, Oid.FLOAT8: 8, Oid.NUMERIC: -1
    }  # fmt: skip
    assert column("c", Oid.FLOAT8, 1).format == 1
