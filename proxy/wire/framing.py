r"""Framing: where typed messages start and end in a byte stream, and their type bytes.

A typed message is one type byte, a length word that counts itself, and the payload. This is the
one place that reads that header: the client's `MessageBuffer`, the pass-through connection's
reader and its relays iterate frames with `frames`, and a message passed on unchanged is framed
again with `reframe`. Type bytes are ints here, as indexing ``bytes`` gives them.

>>> stream = b"C\x00\x00\x00\x0bSELECT\x00Z\x00\x00\x00\x05IT\x00"
>>> [(chr(kind), stream[start:end]) for kind, start, end in frames(stream)]
[('C', b'SELECT\x00'), ('Z', b'I')]
>>> reframe(RawMessage(b"Q", b"SELECT 1\x00")) == b"Q\x00\x00\x00\x0dSELECT 1\x00"
True
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from proxy.wire.message import RawMessage

__all__ = [
    "LENGTH",
    "FramingLost",
    "frames",
    "reframe",
    "one_frame",
    "QUERY",
    "COPY_DATA",
    "COPY_DONE",
    "COPY_FAIL",
    "READY_FOR_QUERY",
    "ERROR_RESPONSE",
    "COPY_IN_RESPONSE",
    "PARSE_COMPLETE",
    "BIND_COMPLETE",
    "CLOSE_COMPLETE",
    "ROW_DESCRIPTION",
    "NO_DATA",
    "COMMAND_COMPLETE",
    "PORTAL_SUSPENDED",
    "EMPTY_QUERY_RESPONSE",
]

#: The length word after the type byte (it counts itself, not the type byte).
LENGTH: Final = struct.Struct("!i")

# Frontend types the server looks at before decoding.
QUERY: Final = ord("Q")
COPY_DATA: Final = ord("d")
COPY_DONE: Final = ord("c")
COPY_FAIL: Final = ord("f")
# Backend types the relays decide on.
READY_FOR_QUERY: Final = ord("Z")
ERROR_RESPONSE: Final = ord("E")
COPY_IN_RESPONSE: Final = ord("G")
PARSE_COMPLETE: Final = ord("1")
BIND_COMPLETE: Final = ord("2")
CLOSE_COMPLETE: Final = ord("3")
ROW_DESCRIPTION: Final = ord("T")
NO_DATA: Final = ord("n")
COMMAND_COMPLETE: Final = ord("C")
PORTAL_SUSPENDED: Final = ord("s")
EMPTY_QUERY_RESPONSE: Final = ord("I")


class FramingLost(ValueError):
    """A length word below 4: nothing after it can be framed; the connection must close."""

    def __init__(self, kind: int, length: int) -> None:
        super().__init__(f"invalid message length {length} for message type {chr(kind)!r}")
        self.kind = kind
        self.length = length


def frames(buf: bytes | bytearray, pos: int = 0) -> Iterator[tuple[int, int, int]]:
    r"""The whole messages in ``buf`` from ``pos``: (type, payload start, end) each.

    Stops before an incomplete message; its bytes are the caller's to keep.

    Raises:
        FramingLost: a length word below 4.

    >>> list(frames(b"Z\x00\x00\x00\x05IZ\x00\x00"))
    [(90, 5, 6)]
    >>> list(frames(b"Z\x00\x00\x00\x03"))
    Traceback (most recent call last):
    proxy.wire.framing.FramingLost: invalid message length 3 for message type 'Z'
    """
    size = len(buf)
    unpack = LENGTH.unpack_from
    while size - pos >= 5:
        length = unpack(buf, pos + 1)[0]
        if length < 4:
            raise FramingLost(buf[pos], length)
        end = pos + 1 + length
        if end > size:
            return
        yield buf[pos], pos + 5, end
        pos = end


def one_frame(data: bytes, kind: int) -> bool:
    r"""Whether ``data`` is exactly one whole message of type ``kind``, nothing more or less.

    >>> one_frame(b"Q\x00\x00\x00\x05\x00", QUERY), one_frame(b"Q\x00\x00\x00\x05\x00S", QUERY)
    (True, False)
    """
    return len(data) >= 5 and data[0] == kind and LENGTH.unpack_from(data, 1)[0] == len(data) - 1


def reframe(raw: RawMessage) -> bytes:
    """The message as it came over the wire, to pass it on unchanged."""
    return raw.type + LENGTH.pack(len(raw.payload) + 4) + raw.payload
