"""A read buffer that frames a byte stream into whole messages: feed bytes in, take messages out.

Framing only: the buffer checks each length word against its limits and hands out whole
payloads, without looking inside them. A `ProtocolViolation` raised here means the stream has
lost its framing, so the connection must close (PostgreSQL answers FATAL); the buffer stays
failed and raises again on every later take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, NoReturn

from proxy.errors import ProtocolViolation
from proxy.wire.framing import LENGTH
from proxy.wire.message import RawMessage, type_name

__all__ = ["MessageBuffer", "MAX_MESSAGE_LENGTH", "MAX_STARTUP_LENGTH"]

#: Default cap on a typed message's length word (which counts itself): 1 GiB, like PostgreSQL.
MAX_MESSAGE_LENGTH: Final = 1 << 30
#: Default cap on a startup packet's length word: PostgreSQL's MAX_STARTUP_PACKET_LENGTH (10000)
#: excludes the length word itself, which ours counts.
MAX_STARTUP_LENGTH: Final = 10_000 + 4

# Compact the buffer once this many consumed bytes sit in front of the unread ones.
_COMPACT_AFTER: Final = 64 * 1024


class MessageBuffer:
    r"""Accumulates bytes from a socket and cuts them into messages.

    Args:
        limits: optional cap per type byte (on the length word); a type missing from it is
            refused as soon as its type byte arrives. Pass `frontend.FRONTEND_LIMITS` when
            reading a client, so a client cannot make us buffer 1 GiB of "Sync".
        max_length: cap on any typed message's length word.
        max_startup_length: cap on a startup packet's length word.
        oversize: optional soft cap per type byte (on the length word): a longer message is
            not kept but dropped as its bytes arrive, and then taken as a `RawMessage` with an
            empty payload and ``oversized`` set, so that the session can refuse it and go on.

    >>> buf = MessageBuffer()
    >>> buf.feed(b"Q\x00\x00\x00\rSELECT")
    >>> buf.take_message() is None   # incomplete: wait for more bytes
    True
    >>> buf.feed(b" 1\x00Z")
    >>> buf.take_message()
    RawMessage(type=b'Q', payload=b'SELECT 1\x00')
    >>> buf.pending
    1
    >>> small = MessageBuffer(oversize={b"Q": 8})
    >>> small.feed(b"Q\x00\x00\x00\x0eSELECT")
    >>> small.take_message() is None, small.pending   # dropped as it arrives
    (True, 0)
    >>> small.feed(b" 12\x00S\x00\x00\x00\x04")
    >>> small.take_message().oversized, small.take_message()
    (14, RawMessage(type=b'S', payload=b''))
    """

    __slots__ = (
        "_buf",
        "_pos",
        "_limits",
        "_max_length",
        "_max_startup",
        "_failure",
        "_oversize",
        "_skip",
        "_dropped",
    )

    def __init__(
        self,
        *,
        limits: Mapping[bytes, int] | None = None,
        max_length: int = MAX_MESSAGE_LENGTH,
        max_startup_length: int = MAX_STARTUP_LENGTH,
        oversize: Mapping[bytes, int] | None = None,
    ) -> None:
        if max_length < 4 or max_startup_length < 8:
            raise ValueError("message limits must allow at least an empty message")
        self._buf = bytearray()
        self._pos = 0
        self._limits = limits
        self._max_length = max_length
        self._max_startup = max_startup_length
        self._failure: str | None = None
        self._oversize = oversize or {}
        self._skip = 0  # bytes of a dropped message still to come
        self._dropped: RawMessage | None = None  # a dropped message, taken once it has passed

    @property
    def pending(self) -> int:
        """Bytes received but not yet taken.

        After an SSLRequest or GSSENCRequest this must be 0 before the TLS handshake
        starts: bytes sent before encryption must not be read as if encrypted (CVE-2021-23214).
        """
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the socket."""
        if self._skip:
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = memoryview(data)[skipped:]
        self._buf += data

    def take_startup(self) -> bytes | None:
        """Take one untyped startup-phase packet (StartupMessage, SSLRequest, ...).

        Returns:
            The payload after the length word (starting with the Int32 request code), to pass
            to `startup.decode_startup`; None while the packet is incomplete.

        Raises:
            ProtocolViolation: the length word is impossible; the connection must close.
        """
        self._check_alive()
        if self.pending < 4:
            return None
        length = self._length_at(self._pos)
        if not 8 <= length <= self._max_startup:
            self._fail(f"invalid length of startup packet: {length}")
        if self.pending < length:
            return None
        return self._consume(self._pos + 4, self._pos + length)

    def take_message(self) -> RawMessage | None:
        """Take one typed message.

        Returns:
            The message's type byte and payload; None while the message is incomplete.

        Raises:
            ProtocolViolation: unknown type (when limits are set) or impossible length; the
                connection must close.
        """
        self._check_alive()
        if self._skip:
            return None
        if self._dropped is not None:
            dropped, self._dropped = self._dropped, None
            return dropped
        if self.pending < 1:
            return None
        type_byte = bytes(self._buf[self._pos : self._pos + 1])
        cap = self._cap(type_byte)
        if self.pending < 5:
            return None
        length = self._length_at(self._pos + 1)
        if length < 4:
            self._fail(f"invalid message length {length} for message type {type_name(type_byte)}")
        if length > cap:
            self._fail(
                f"message type {type_name(type_byte)} has length {length}, over the limit of {cap}"
            )
        soft = self._oversize.get(type_byte)
        if soft is not None and length > soft:
            return self._drop(type_byte, length)
        if self.pending < 1 + length:
            return None
        return RawMessage(type_byte, self._consume(self._pos + 5, self._pos + 1 + length))

    def _drop(self, type_byte: bytes, length: int) -> RawMessage | None:
        """Drop a message over its soft cap: what is here now, and the rest as it arrives."""
        here = min(self.pending, 1 + length)
        self._skip = 1 + length - here
        self._consume(self._pos, self._pos + here)
        dropped = RawMessage(type_byte, b"", oversized=length)
        if self._skip:
            self._dropped = dropped
            return None
        return dropped

    def _cap(self, type_byte: bytes) -> int:
        if self._limits is None:
            return self._max_length
        cap = self._limits.get(type_byte)
        if cap is None:
            self._fail(f"invalid message type {type_name(type_byte)}")
        return min(cap, self._max_length)

    def _length_at(self, offset: int) -> int:
        return int(LENGTH.unpack_from(self._buf, offset)[0])

    def _consume(self, start: int, end: int) -> bytes:
        payload = bytes(self._buf[start:end])
        self._pos = end
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif self._pos > _COMPACT_AFTER:
            del self._buf[: self._pos]
            self._pos = 0
        return payload

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise ProtocolViolation(self._failure)

    def _fail(self, reason: str) -> NoReturn:
        self._failure = reason
        raise ProtocolViolation(reason)
