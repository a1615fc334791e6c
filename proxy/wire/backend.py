"""Typed backend (server to client) messages, to encode replies and to read a real server's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import ClassVar, Final, Self, TypeAlias, cast

from proxy.errors import DpproxyError, error_fields
from proxy.wire.auth import Authentication, read_authentication
from proxy.wire.copy import CopyData, CopyDone, CopyInResponse, CopyOutResponse
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
    "ParameterStatus",
    "BackendKeyData",
    "TransactionStatus",
    "ReadyForQuery",
    "FieldDescription",
    "RowDescription",
    "DataRow",
    "CommandComplete",
    "EmptyQueryResponse",
    "ErrorResponse",
    "NoticeResponse",
    "ParseComplete",
    "BindComplete",
    "CloseComplete",
    "NoData",
    "ParameterDescription",
    "PortalSuspended",
    "NegotiateProtocolVersion",
    "BackendMessage",
    "decode_backend",
]


@dataclass(frozen=True, slots=True)
class ParameterStatus(Message):
    """Reports a run-time parameter's value (server_version, client_encoding, ...)."""

    TYPE: ClassVar[bytes] = b"S"
    name: str
    value: str

    def __post_init__(self) -> None:
        require_cstring(self.name, "name")
        require_cstring(self.value, "value")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.name)
        writer.cstring(self.value)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.cstring(), reader.cstring())


@dataclass(frozen=True, slots=True)
class BackendKeyData(Message):
    """The key a client quotes in a CancelRequest: 4 secret bytes in 3.0, up to 256 in 3.2."""

    TYPE: ClassVar[bytes] = b"K"
    process_id: int
    secret_key: bytes

    def __post_init__(self) -> None:
        require_int(self.process_id, 32, "process id")
        if not 4 <= len(self.secret_key) <= 256:
            raise ValueError(f"secret key of {len(self.secret_key)} bytes is not 4 to 256")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.int32(self.process_id)
        writer.raw(self.secret_key)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.int32(), reader.rest())


class TransactionStatus(StrEnum):
    """The transaction state a ReadyForQuery reports."""

    IDLE = "I"
    IN_TRANSACTION = "T"
    FAILED = "E"


@dataclass(frozen=True, slots=True)
class ReadyForQuery(Message):
    """The server is ready for a new query cycle."""

    TYPE: ClassVar[bytes] = b"Z"
    status: TransactionStatus = TransactionStatus.IDLE

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", TransactionStatus(self.status))

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.byte(ord(self.status))

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        code = chr(reader.byte())
        if code not in ("I", "T", "E"):
            raise reader.fail(f"transaction status {code!r} is not I, T or E")
        return cls(TransactionStatus(code))


@dataclass(frozen=True, slots=True)
class FieldDescription:
    """One column of a RowDescription, fields in wire order.

    Args:
        name: the column name.
        table_oid: the source table's OID, or 0.
        column_number: the source column's attribute number, or 0.
        type_oid: the data type's OID.
        type_size: pg_type.typlen: bytes, or -1 for varlena (text, numeric).
        type_modifier: pg_attribute.atttypmod, -1 when none.
        format: 0 text, 1 binary; always 0 in a Describe reply (formats are not yet known).
    """

    name: str
    table_oid: int
    column_number: int
    type_oid: int
    type_size: int
    type_modifier: int
    format: int

    def __post_init__(self) -> None:
        require_cstring(self.name, "column name")
        require_int(self.table_oid, 32, "table OID", signed=False)
        require_int(self.column_number, 16, "column number")
        require_int(self.type_oid, 32, "type OID", signed=False)
        require_int(self.type_size, 16, "type size")
        require_int(self.type_modifier, 32, "type modifier")
        require_format(self.format, "format")

    def write(self, writer: Writer) -> None:
        """Append the field's seven values."""
        writer.cstring(self.name)
        writer.uint32(self.table_oid)
        writer.int16(self.column_number)
        writer.uint32(self.type_oid)
        writer.int16(self.type_size)
        writer.int32(self.type_modifier)
        writer.int16(self.format)

    @classmethod
    def read(cls, reader: Reader) -> Self:
        """Read the field's seven values."""
        name, table, column = reader.cstring(), reader.uint32(), reader.int16()
        type_oid, size, modifier = reader.uint32(), reader.int16(), reader.int32()
        return cls(name, table, column, type_oid, size, modifier, reader.int16())


# A field with an empty name: NUL, then 4 + 2 + 4 + 2 + 4 + 2 bytes.
_MIN_FIELD_SIZE: Final = 19


@dataclass(frozen=True, slots=True)
class RowDescription(Message):
    """The columns of the rows to come."""

    TYPE: ClassVar[bytes] = b"T"
    fields: tuple[FieldDescription, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        require_count(self.fields, "fields")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.uint16(len(self.fields))
        for field in self.fields:
            field.write(writer)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        count = reader.count(_MIN_FIELD_SIZE, "fields")
        return cls(tuple(FieldDescription.read(reader) for _ in range(count)))


@dataclass(frozen=True, slots=True)
class DataRow(Message):
    """One row: each column's bytes in its format, None for NULL."""

    TYPE: ClassVar[bytes] = b"D"
    values: tuple[bytes | None, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        require_count(self.values, "columns")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.uint16(len(self.values))
        for value in self.values:
            writer.sized(value)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        count = reader.count(4, "columns")
        return cls(tuple(reader.sized() for _ in range(count)))


@dataclass(frozen=True, slots=True)
class CommandComplete(Message):
    """A statement finished; `tag` is e.g. ``"SELECT 3"``."""

    TYPE: ClassVar[bytes] = b"C"
    tag: str

    def __post_init__(self) -> None:
        require_cstring(self.tag, "command tag")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.tag)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.cstring())


@dataclass(frozen=True, slots=True)
class EmptyQueryResponse(Message):
    """Stands in for CommandComplete when the query string was empty."""

    TYPE: ClassVar[bytes] = b"I"


@dataclass(frozen=True, slots=True)
class _Report(Message):
    """Shared layout of ErrorResponse and NoticeResponse: (code byte, String)*, then NUL."""

    fields: Mapping[str, str]

    def __post_init__(self) -> None:
        for code, value in self.fields.items():
            if len(code) != 1 or not code.isascii() or code == "\x00":
                raise ValueError(f"field code {code!r} is not one ASCII character")
            require_cstring(value, f"field {code}")
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    @classmethod
    def from_error(cls, error: DpproxyError, severity: str = "ERROR") -> Self:
        """Build the message from an error; use severity FATAL only when closing."""
        return cls(error_fields(error, severity))

    @property
    def sqlstate(self) -> str | None:
        """The ``C`` field."""
        return self.fields.get("C")

    @property
    def message(self) -> str | None:
        """The ``M`` field."""
        return self.fields.get("M")

    def write(self, writer: Writer) -> None:  # noqa: D102
        for code, value in self.fields.items():
            writer.byte(ord(code))
            writer.cstring(value)
        writer.byte(0)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        fields: dict[str, str] = {}
        while (code := reader.byte()) != 0:
            fields[chr(code)] = reader.cstring()
        return cls(fields)


@dataclass(frozen=True, slots=True)
class ErrorResponse(_Report):
    """An error, field code to value (S severity, C SQLSTATE, M message, P position...)."""

    TYPE: ClassVar[bytes] = b"E"


@dataclass(frozen=True, slots=True)
class NoticeResponse(_Report):
    """A notice or warning, with the same fields as ErrorResponse."""

    TYPE: ClassVar[bytes] = b"N"


@dataclass(frozen=True, slots=True)
class ParseComplete(Message):
    """Parse succeeded."""

    TYPE: ClassVar[bytes] = b"1"


@dataclass(frozen=True, slots=True)
class BindComplete(Message):
    """Bind succeeded."""

    TYPE: ClassVar[bytes] = b"2"


@dataclass(frozen=True, slots=True)
class CloseComplete(Message):
    """Close succeeded."""

    TYPE: ClassVar[bytes] = b"3"


@dataclass(frozen=True, slots=True)
class NoData(Message):
    """The described statement or portal returns no rows."""

    TYPE: ClassVar[bytes] = b"n"


@dataclass(frozen=True, slots=True)
class ParameterDescription(Message):
    """The parameter type OIDs of a described statement."""

    TYPE: ClassVar[bytes] = b"t"
    type_oids: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "type_oids", tuple(self.type_oids))
        require_count(self.type_oids, "parameters")
        for oid in self.type_oids:
            require_int(oid, 32, "type OID", signed=False)

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.uint16(len(self.type_oids))
        for oid in self.type_oids:
            writer.uint32(oid)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        count = reader.count(4, "parameters")
        return cls(tuple(reader.uint32() for _ in range(count)))


@dataclass(frozen=True, slots=True)
class PortalSuspended(Message):
    """Execute stopped at its row limit; the portal can be executed again."""

    TYPE: ClassVar[bytes] = b"s"


@dataclass(frozen=True, slots=True)
class NegotiateProtocolVersion(Message):
    """Answers a StartupMessage asking for a newer minor version or unknown ``_pq_.`` options.

    Args:
        newest_version: the newest protocol version we support for the requested major, as
            ``major << 16 | minor``. The documentation calls this field the "newest minor
            version", but PostgreSQL (16.2 checked) sends the full number: 196608 for 3.0.
        unrecognized: the protocol options we did not recognize.
    """

    TYPE: ClassVar[bytes] = b"v"
    newest_version: int
    unrecognized: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "unrecognized", tuple(self.unrecognized))
        require_int(self.newest_version, 32, "newest version")
        require_int(len(self.unrecognized), 32, "number of options")
        for name in self.unrecognized:
            require_cstring(name, "option name")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.int32(self.newest_version)
        writer.int32(len(self.unrecognized))
        for name in self.unrecognized:
            writer.cstring(name)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        version = reader.int32()
        count = reader.count(1, "options", wide=True)
        return cls(version, tuple(reader.cstring() for _ in range(count)))


BackendMessage: TypeAlias = (
    Authentication | ParameterStatus | BackendKeyData | ReadyForQuery | RowDescription
    | DataRow | CommandComplete | EmptyQueryResponse | ErrorResponse | NoticeResponse
    | ParseComplete | BindComplete | CloseComplete | NoData | ParameterDescription
    | PortalSuspended | NegotiateProtocolVersion | CopyInResponse | CopyOutResponse
    | CopyData | CopyDone
)  # fmt: skip

_BACKEND: Final = reader_table(
    ParameterStatus, BackendKeyData, ReadyForQuery, RowDescription, DataRow,
    CommandComplete, EmptyQueryResponse, ErrorResponse, NoticeResponse, ParseComplete,
    BindComplete, CloseComplete, NoData, ParameterDescription, PortalSuspended,
    NegotiateProtocolVersion, CopyInResponse, CopyOutResponse, CopyData, CopyDone,
)  # fmt: skip
_BACKEND[Authentication.TYPE] = ("Authentication", read_authentication)


def decode_backend(raw: RawMessage) -> BackendMessage:
    """Decode a message read from a server (for relays and tests).

    Args:
        raw: the framed message.

    Returns:
        The typed message.

    Raises:
        ProtocolViolation: a type or authentication request we do not speak, or a
            malformed payload.

    >>> decode_backend(RawMessage(b"Z", b"I"))
    ReadyForQuery(status=<TransactionStatus.IDLE: 'I'>)
    """
    return cast(BackendMessage, decode_raw(_BACKEND, raw, "backend"))
