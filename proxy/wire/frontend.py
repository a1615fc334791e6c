"""Typed frontend (client to server) messages of the simple and extended query protocols.

Decoding errors raised here concern one message whose frame was intact: PostgreSQL answers
them with an ERROR and, in the extended protocol, discards messages until Sync.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import ClassVar, Final, Self, TypeAlias, cast

from proxy.errors import ProtocolViolation
from proxy.wire.auth import (
    PasswordMessage,
    SASLInitialResponse,
    SASLResponse,
    decode_password,
    decode_sasl_initial_response,
    decode_sasl_response,
)
from proxy.wire.buffer import MAX_MESSAGE_LENGTH
from proxy.wire.copy import CopyData, CopyDone, CopyFail
from proxy.wire.fields import (
    Reader,
    Writer,
    require_count,
    require_cstring,
    require_format,
    require_int,
)
from proxy.wire.message import Message, RawMessage, decode_raw, reader_table

__all__ = [
    "Query",
    "Parse",
    "Bind",
    "Target",
    "Describe",
    "Execute",
    "Close",
    "Sync",
    "Flush",
    "Terminate",
    "FunctionCall",
    "AuthResponse",
    "FrontendMessage",
    "FRONTEND_LIMITS",
    "decode_frontend",
]


@dataclass(frozen=True, slots=True)
class Query(Message):
    """A simple-protocol query string, possibly several statements."""

    TYPE: ClassVar[bytes] = b"Q"
    sql: str

    def __post_init__(self) -> None:
        require_cstring(self.sql, "query")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.sql)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.cstring())


@dataclass(frozen=True, slots=True)
class Parse(Message):
    """Prepare a statement.

    Args:
        name: the statement's name; "" is the unnamed statement.
        sql: the query text, with $1, $2... placeholders.
        param_types: parameter type OIDs the client fixes; 0 leaves one to the server.
    """

    TYPE: ClassVar[bytes] = b"P"
    name: str
    sql: str
    param_types: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        require_cstring(self.name, "statement name")
        require_cstring(self.sql, "query")
        object.__setattr__(self, "param_types", tuple(self.param_types))
        require_count(self.param_types, "parameter types")
        for oid in self.param_types:
            require_int(oid, 32, "parameter type OID", signed=False)

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.name)
        writer.cstring(self.sql)
        writer.uint16(len(self.param_types))
        for oid in self.param_types:
            writer.uint32(oid)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        name, sql = reader.cstring(), reader.cstring()
        count = reader.count(4, "parameter types")
        return cls(name, sql, tuple(reader.uint32() for _ in range(count)))


def _require_formats(formats: tuple[int, ...], field: str) -> None:
    require_count(formats, f"{field}s")
    for code in formats:
        require_format(code, field)


def _require_format_count(formats: tuple[int, ...], values: int, kind: str, what: str) -> None:
    if len(formats) not in (0, 1, values):
        raise ValueError(f"{len(formats)} {kind} formats given for {values} {what}")


def _format_for(formats: tuple[int, ...], index: int) -> int:
    # none: all text; one: applies to all; otherwise one each.
    if not formats:
        return 0
    return formats[0] if len(formats) == 1 else formats[index]


def _write_values(
    writer: Writer, formats: tuple[int, ...], values: tuple[bytes | None, ...]
) -> None:
    writer.uint16(len(formats))
    for code in formats:
        writer.int16(code)
    writer.uint16(len(values))
    for value in values:
        writer.sized(value)


def _read_formats(reader: Reader, field: str) -> tuple[int, ...]:
    return tuple(reader.int16() for _ in range(reader.count(2, field)))


def _read_values(reader: Reader, field: str) -> tuple[bytes | None, ...]:
    return tuple(reader.sized() for _ in range(reader.count(4, field)))


@dataclass(frozen=True, slots=True)
class Bind(Message):
    """Bind parameter values to a prepared statement, making a portal.

    Args:
        portal: the portal's name; "" is the unnamed portal.
        statement: the prepared statement's name.
        param_formats: none (all text), one (for all) or one per parameter; 0 text, 1 binary.
        params: the values as sent; None is SQL NULL.
        result_formats: the same rule, per result column.
    """

    TYPE: ClassVar[bytes] = b"B"
    portal: str
    statement: str
    param_formats: tuple[int, ...] = ()
    params: tuple[bytes | None, ...] = ()
    result_formats: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        require_cstring(self.portal, "portal name")
        require_cstring(self.statement, "statement name")
        for field in ("param_formats", "params", "result_formats"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        _require_formats(self.param_formats, "parameter format")
        _require_formats(self.result_formats, "result format")
        require_count(self.params, "parameters")
        _require_format_count(self.param_formats, len(self.params), "parameter", "parameters")

    def param_format(self, index: int) -> int:
        """The format code (0 text, 1 binary) of the 0-based parameter `index`."""
        return _format_for(self.param_formats, index)

    def result_format(self, index: int, columns: int) -> int:
        """The format code requested for result column `index` of `columns`.

        Raises:
            ProtocolViolation: the number of result formats is not 0, 1 or `columns`.
        """
        if len(self.result_formats) not in (0, 1, columns):
            raise ProtocolViolation(
                f"Bind message has {len(self.result_formats)} result formats "
                f"but the query has {columns} columns"
            )
        return _format_for(self.result_formats, index)

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.portal)
        writer.cstring(self.statement)
        _write_values(writer, self.param_formats, self.params)
        writer.uint16(len(self.result_formats))
        for code in self.result_formats:
            writer.int16(code)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        portal, statement = reader.cstring(), reader.cstring()
        param_formats = _read_formats(reader, "parameter formats")
        params = _read_values(reader, "parameters")
        return cls(
            portal, statement, param_formats, params, _read_formats(reader, "result formats")
        )


class Target(StrEnum):
    """What a Describe or Close names."""

    STATEMENT = "S"
    PORTAL = "P"


def _read_target(reader: Reader) -> Target:
    code = reader.byte()
    if code not in (ord("S"), ord("P")):
        raise reader.fail(f"target {code:#04x} is not 'S' (statement) or 'P' (portal)")
    return Target(chr(code))


@dataclass(frozen=True, slots=True)
class _Targeted(Message):
    """Shared layout: Byte1 'S' (statement) or 'P' (portal), then the name."""

    target: Target
    name: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", Target(self.target))
        require_cstring(self.name, "name")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.byte(ord(self.target))
        writer.cstring(self.name)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(_read_target(reader), reader.cstring())


@dataclass(frozen=True, slots=True)
class Describe(_Targeted):
    """Ask for the parameter and row description of a statement or portal."""

    TYPE: ClassVar[bytes] = b"D"


@dataclass(frozen=True, slots=True)
class Execute(Message):
    """Run a portal; `max_rows` of 0 (or negative, as PostgreSQL reads it) means no limit."""

    TYPE: ClassVar[bytes] = b"E"
    portal: str
    max_rows: int = 0

    def __post_init__(self) -> None:
        require_cstring(self.portal, "portal name")
        require_int(self.max_rows, 32, "max_rows")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.portal)
        writer.int32(self.max_rows)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.cstring(), reader.int32())


@dataclass(frozen=True, slots=True)
class Close(_Targeted):
    """Close a prepared statement or portal."""

    TYPE: ClassVar[bytes] = b"C"


@dataclass(frozen=True, slots=True)
class Sync(Message):
    """End an extended-protocol batch: commit or roll back, then ReadyForQuery."""

    TYPE: ClassVar[bytes] = b"S"


@dataclass(frozen=True, slots=True)
class Flush(Message):
    """Ask the server to send what it has buffered."""

    TYPE: ClassVar[bytes] = b"H"


@dataclass(frozen=True, slots=True)
class Terminate(Message):
    """The client is closing the connection."""

    TYPE: ClassVar[bytes] = b"X"


@dataclass(frozen=True, slots=True)
class FunctionCall(Message):
    """The legacy fast-path function call, parsed only so it can be refused cleanly."""

    TYPE: ClassVar[bytes] = b"F"
    function_oid: int
    arg_formats: tuple[int, ...] = ()
    args: tuple[bytes | None, ...] = ()
    result_format: int = 0

    def __post_init__(self) -> None:
        require_int(self.function_oid, 32, "function OID", signed=False)
        object.__setattr__(self, "arg_formats", tuple(self.arg_formats))
        object.__setattr__(self, "args", tuple(self.args))
        _require_formats(self.arg_formats, "argument format")
        require_count(self.args, "arguments")
        _require_format_count(self.arg_formats, len(self.args), "argument", "arguments")
        require_format(self.result_format, "result format")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.uint32(self.function_oid)
        _write_values(writer, self.arg_formats, self.args)
        writer.int16(self.result_format)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        oid = reader.uint32()
        formats = _read_formats(reader, "argument formats")
        return cls(oid, formats, _read_values(reader, "arguments"), reader.int16())


@dataclass(frozen=True, slots=True)
class AuthResponse(Message):
    """A ``p`` message, whose layout depends on what the server asked for.

    Decode `data` with the method matching the authentication request sent.
    """

    TYPE: ClassVar[bytes] = b"p"
    data: bytes

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.raw(self.data)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.rest())

    def as_password(self) -> PasswordMessage:
        """Decode as a PasswordMessage (after AuthenticationCleartextPassword or MD5Password)."""
        return decode_password(self.data)

    def as_sasl_initial_response(self) -> SASLInitialResponse:
        """Decode as a SASLInitialResponse (after AuthenticationSASL)."""
        return decode_sasl_initial_response(self.data)

    def as_sasl_response(self) -> SASLResponse:
        """Decode as a SASLResponse (after AuthenticationSASLContinue)."""
        return decode_sasl_response(self.data)


FrontendMessage: TypeAlias = (
    Query
    | Parse
    | Bind
    | Describe
    | Execute
    | Close
    | Sync
    | Flush
    | Terminate
    | FunctionCall
    | AuthResponse
    | CopyData
    | CopyDone
    | CopyFail
)

_LARGE: Final = MAX_MESSAGE_LENGTH
_SMALL: Final = 10_000  # PostgreSQL's PQ_SMALL_MESSAGE_LIMIT
_AUTH: Final = 65_535  # PostgreSQL's PG_MAX_AUTH_TOKEN_LENGTH

#: Cap on each frontend message type's length word, as PostgreSQL's SocketBackend applies them;
#: pass to `MessageBuffer(limits=...)` so unknown types fail on their first byte.
FRONTEND_LIMITS: Final[Mapping[bytes, int]] = MappingProxyType({
    b"Q": _LARGE, b"P": _LARGE, b"B": _LARGE, b"F": _LARGE, b"d": _LARGE,
    b"D": _SMALL, b"E": _SMALL, b"C": _SMALL, b"S": _SMALL, b"H": _SMALL, b"X": _SMALL,
    b"c": _SMALL, b"f": _SMALL, b"p": _AUTH,
})  # fmt: skip

_FRONTEND: Final = reader_table(
    Query, Parse, Bind, Describe, Execute, Close, Sync, Flush, Terminate,
    FunctionCall, AuthResponse, CopyData, CopyDone, CopyFail,
)  # fmt: skip


def decode_frontend(raw: RawMessage) -> FrontendMessage:
    r"""Decode a message taken from a client's `MessageBuffer`.

    Args:
        raw: the framed message.

    Returns:
        The typed message.

    Raises:
        ProtocolViolation: unknown type or malformed payload.

    >>> decode_frontend(RawMessage(b"E", b"\x00\x00\x00\x00\x00"))
    Execute(portal='', max_rows=0)
    """
    return cast(FrontendMessage, decode_raw(_FRONTEND, raw, "frontend"))
