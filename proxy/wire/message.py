"""The base of every typed message, and the step from a framed payload to a typed message."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Self, TypeVar

from proxy.errors import ProtocolViolation
from proxy.wire.fields import Reader, Writer

__all__ = [
    "Message",
    "RawMessage",
    "decode_payload",
    "decode_raw",
    "encode_all",
    "reader_table",
    "type_name",
]

M = TypeVar("M")


class Message:
    """A typed message: `TYPE` is its type byte, `write`/`read` its payload fields.

    Subclasses are frozen dataclasses whose `__post_init__` raises ValueError for values the
    wire cannot carry; messages without fields inherit the empty `write` and `read`.
    """

    __slots__ = ()
    TYPE: ClassVar[bytes]

    def encode(self) -> bytes:
        """Return the framed message: type byte, Int32 length, payload."""
        writer = Writer()
        self.write(writer)
        return writer.frame(self.TYPE)

    def write(self, writer: Writer) -> None:
        """Append the payload fields (none by default)."""

    @classmethod
    def read(cls, reader: Reader) -> Self:
        """Read the payload fields (none by default) and build the message."""
        return cls()


def encode_all(messages: Iterable[Message]) -> bytes:
    r"""Encode several messages into one buffer, for a single socket write.

    >>> from proxy.wire.backend import ReadyForQuery
    >>> encode_all([ReadyForQuery(), ReadyForQuery()])
    b'Z\x00\x00\x00\x05IZ\x00\x00\x00\x05I'
    """
    return b"".join(message.encode() for message in messages)


@dataclass(frozen=True, slots=True)
class RawMessage:
    """One whole typed message as framed on the wire, not yet decoded.

    Args:
        type: the one-byte message type, e.g. ``b"Q"``.
        payload: the bytes after the length word.
        oversized: for a message dropped for being over its type's soft limit (see
            `MessageBuffer`), its length word; the payload is then empty.
    """

    type: bytes
    payload: bytes
    oversized: int = field(default=0, repr=False)


def type_name(type_byte: bytes) -> str:
    r"""Render a type byte for error messages, printable or not.

    >>> type_name(b"Q"), type_name(b"\x00")
    ("'Q'", '0x00')
    """
    return repr(type_byte.decode("latin-1")) if type_byte.isalnum() else f"0x{type_byte.hex()}"


def decode_payload(read: Callable[[Reader], M], payload: bytes, name: str) -> M:
    """Decode one payload with a message's reader, refusing leftovers and impossible values.

    Args:
        read: builds the message from a Reader (usually a `Message.read`).
        payload: the bytes after the length word.
        name: the message's name, for error messages.

    Returns:
        The message.

    Raises:
        ProtocolViolation: truncated, over-long, or holding values the message refuses.
    """
    reader = Reader(payload, name)
    try:
        message = read(reader)
    except ValueError as exc:  # a message's checks at birth; the frame itself was fine
        raise ProtocolViolation(f"invalid {name} message: {exc}") from None
    reader.finish()
    return message


def reader_table(*classes: type[Message]) -> dict[bytes, tuple[str, Callable[[Reader], Message]]]:
    """Index message classes by type byte, for `decode_raw`.

    Args:
        classes: the message classes, with distinct type bytes.

    Returns:
        Type byte to (message name, reader).
    """
    table: dict[bytes, tuple[str, Callable[[Reader], Message]]] = {}
    for cls in classes:
        if cls.TYPE in table:
            raise TypeError(f"{cls.__name__} reuses type {cls.TYPE!r} of {table[cls.TYPE][0]}")
        table[cls.TYPE] = (cls.__name__, cls.read)
    return table


def decode_raw(
    table: Mapping[bytes, tuple[str, Callable[[Reader], M]]], raw: RawMessage, side: str
) -> M:
    """Decode a framed message by looking its type byte up in a table of readers.

    Args:
        table: type byte to (message name, reader).
        raw: the framed message.
        side: "frontend" or "backend", for error messages.

    Returns:
        The typed message.

    Raises:
        ProtocolViolation: unknown type or malformed payload.
    """
    entry = table.get(raw.type)
    if entry is None:
        raise ProtocolViolation(f"invalid {side} message type {type_name(raw.type)}")
    name, read = entry
    return decode_payload(read, raw.payload, name)
