"""Value codecs for the types dpproxy returns and accepts as parameters, in text and binary.

Encoding (our results) takes Python values: bool, int, float, Decimal, str. Decoding
(clients' Bind parameters) follows PostgreSQL's input functions; a value the type refuses
raises InvalidParameterValue.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import IntEnum
from types import MappingProxyType
from typing import Final, TypeAlias

from proxy.errors import InvalidParameterValue, UnsupportedQuery
from proxy.wire.backend import FieldDescription
from proxy.wire.float8 import format_float8, parse_float8
from proxy.wire.integers import parse_integer_syntax
from proxy.wire.numeric import format_numeric, numeric_from_binary, numeric_to_binary, parse_numeric

__all__ = [
    "Oid",
    "Value",
    "TypeCodec",
    "CODECS",
    "codec_for",
    "encode_value",
    "decode_value",
    "column",
    "TEXT_FORMAT",
    "BINARY_FORMAT",
]

TEXT_FORMAT: Final = 0
BINARY_FORMAT: Final = 1

Value: TypeAlias = bool | int | float | Decimal | str


class Oid(IntEnum):
    """pg_type OIDs of the supported types."""

    BOOL = 16
    INT8 = 20
    INT4 = 23
    TEXT = 25
    FLOAT8 = 701
    NUMERIC = 1700


@dataclass(frozen=True, slots=True)
class TypeCodec:
    """How one type travels in each format.

    Args:
        oid: the type's OID.
        name: its SQL name, as PostgreSQL's error messages spell it.
        size: pg_type.typlen for RowDescription (-1: variable length).
        to_text: value to text format.
        to_binary: value to binary format.
        from_text: text format (already UTF-8 decoded) to value.
        from_binary: binary format to value.
    """

    oid: Oid
    name: str
    size: int
    to_text: Callable[[object], str]
    to_binary: Callable[[object], bytes]
    from_text: Callable[[str], Value]
    from_binary: Callable[[bytes], Value]


def _integer(value: object, bits: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected int, got {type(value).__name__}")
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ValueError(f"{value} does not fit in int{bits // 8}")
    return value


def _parse_integer(text: str, bits: int, name: str) -> int:
    """Read an integer as PostgreSQL's int4in/int8in do.

    >>> _parse_integer(" -0x_7f ", 32, "integer"), _parse_integer("1_000", 64, "bigint")
    (-127, 1000)
    """
    value = parse_integer_syntax(text)
    if value is None:
        raise InvalidParameterValue(f'invalid input syntax for type {name}: "{text}"')
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise InvalidParameterValue(f'value "{text}" is out of range for type {name}')
    return value


def _unpack(fmt: struct.Struct, data: bytes, name: str) -> Value:
    if len(data) != fmt.size:
        raise InvalidParameterValue(
            f"incorrect binary data format: {name} takes {fmt.size} bytes, got {len(data)}"
        )
    return fmt.unpack(data)[0]  # type: ignore[no-any-return]


def _float(value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"expected float, got {type(value).__name__}")
    return float(value)


def _decimal(value: object) -> Decimal:
    # float is refused: which decimal a float stands for is the caller's decision.
    if isinstance(value, Decimal):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    raise TypeError(f"expected Decimal or int, got {type(value).__name__}")


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    if "\x00" in value:
        raise ValueError("text cannot contain NUL")
    return value


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidParameterValue(
            f'invalid byte sequence for encoding "UTF8": 0x{data[exc.start : exc.start + 1].hex()}'
        ) from None


def _parse_text(text: str) -> str:
    if "\x00" in text:
        raise InvalidParameterValue('invalid byte sequence for encoding "UTF8": 0x00')
    return text


_BOOL_WORDS: Final = {True: ("true", "yes", "on", "1"), False: ("false", "no", "off", "0")}


def _parse_bool(text: str) -> bool:
    """Read a boolean as PostgreSQL's boolin: words, unique prefixes, any case.

    >>> [_parse_bool(s) for s in (" t", "YES", "of", "0", "tr")]
    [True, True, False, False, True]
    """
    word = text.strip(" \t\n\v\f\r").lower()
    if len(word) >= (1 if word[:1] != "o" else 2):  # "o" alone is ambiguous
        for result, words in _BOOL_WORDS.items():
            if any(candidate.startswith(word) for candidate in words):
                return result
    raise InvalidParameterValue(f'invalid input syntax for type boolean: "{text}"')


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected bool, got {type(value).__name__}")
    return value


def _bool_from_binary(data: bytes) -> bool:
    return bool(_unpack(_BYTE, data, "boolean"))  # boolrecv: any non-zero byte is true


_INT8: Final = struct.Struct("!q")
_INT4: Final = struct.Struct("!i")
_FLOAT8: Final = struct.Struct("!d")
_BYTE: Final = struct.Struct("!B")


def _int_codec(oid: Oid, name: str, packer: struct.Struct) -> TypeCodec:
    bits = packer.size * 8
    return TypeCodec(
        oid,
        name,
        packer.size,
        to_text=lambda value: str(_integer(value, bits)),
        to_binary=lambda value: packer.pack(_integer(value, bits)),
        from_text=lambda text: _parse_integer(text, bits, name),
        from_binary=lambda data: _unpack(packer, data, name),
    )


_ALL: Final = (
    _int_codec(Oid.INT8, "bigint", _INT8),
    _int_codec(Oid.INT4, "integer", _INT4),
    TypeCodec(
        Oid.FLOAT8,
        "double precision",
        8,
        to_text=lambda value: format_float8(_float(value)),
        to_binary=lambda value: _FLOAT8.pack(_float(value)),
        from_text=parse_float8,
        from_binary=lambda data: _unpack(_FLOAT8, data, "double precision"),
    ),
    TypeCodec(
        Oid.NUMERIC,
        "numeric",
        -1,
        to_text=lambda value: format_numeric(_decimal(value)),
        to_binary=lambda value: numeric_to_binary(_decimal(value)),
        from_text=parse_numeric,
        from_binary=numeric_from_binary,
    ),
    TypeCodec(
        Oid.TEXT,
        "text",
        -1,
        to_text=_text,
        to_binary=lambda value: _text(value).encode("utf-8"),
        from_text=_parse_text,
        from_binary=lambda data: _parse_text(_utf8(data)),
    ),
    TypeCodec(
        Oid.BOOL,
        "boolean",
        1,
        to_text=lambda value: "t" if _bool(value) else "f",
        to_binary=lambda value: b"\x01" if _bool(value) else b"\x00",
        from_text=_parse_bool,
        from_binary=_bool_from_binary,
    ),
)

#: Type OID to codec.
CODECS: Final[Mapping[int, TypeCodec]] = MappingProxyType({codec.oid: codec for codec in _ALL})


def codec_for(oid: int) -> TypeCodec:
    """Look a type up by OID.

    Raises:
        UnsupportedQuery: dpproxy does not handle this type.
    """
    codec = CODECS.get(oid)
    if codec is None:
        raise UnsupportedQuery(f"data type with OID {oid} is not supported")
    return codec


def _check_format(format_code: int) -> None:
    if format_code not in (TEXT_FORMAT, BINARY_FORMAT):
        raise InvalidParameterValue(f"unsupported format code: {format_code}")


def encode_value(value: Value | None, oid: int, format_code: int = TEXT_FORMAT) -> bytes | None:
    r"""Encode a result value for a DataRow.

    Args:
        value: the value; None is NULL.
        oid: the column's type OID.
        format_code: 0 text, 1 binary.

    Returns:
        The bytes, or None for NULL.

    Raises:
        TypeError: the value is not of the type's Python type.
        ValueError: the value does not fit the type.

    >>> encode_value(0.1, Oid.FLOAT8), encode_value(7, Oid.INT4, 1)
    (b'0.1', b'\x00\x00\x00\x07')
    """
    codec = codec_for(oid)
    _check_format(format_code)
    if value is None:
        return None
    if format_code == BINARY_FORMAT:
        return codec.to_binary(value)
    return codec.to_text(value).encode("utf-8")


def decode_value(data: bytes | None, oid: int, format_code: int = TEXT_FORMAT) -> Value | None:
    r"""Decode a Bind parameter (or a server's column value) as PostgreSQL's input functions do.

    Args:
        data: the bytes as sent; None is NULL.
        oid: the parameter's type OID.
        format_code: 0 text, 1 binary.

    Returns:
        The value, or None for NULL.

    Raises:
        InvalidParameterValue: the bytes are not a valid value of the type.
        UnsupportedQuery: an unsupported type.

    >>> decode_value(b" 42 ", Oid.INT8), decode_value(b"\x01", Oid.BOOL, 1)
    (42, True)
    """
    codec = codec_for(oid)
    _check_format(format_code)
    if data is None:
        return None
    if format_code == BINARY_FORMAT:
        return codec.from_binary(data)
    return codec.from_text(_utf8(data))


def column(name: str, oid: int, format_code: int = TEXT_FORMAT) -> FieldDescription:
    """Describe a computed result column (no source table) of a supported type.

    >>> column("count", Oid.INT8)
    FieldDescription(name='count', table_oid=0, column_number=0, type_oid=20, type_size=8,
                     type_modifier=-1, format=0)
    """
    codec = codec_for(oid)
    return FieldDescription(name, 0, 0, int(codec.oid), codec.size, -1, format_code)
