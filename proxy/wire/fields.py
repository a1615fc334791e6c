"""Bounds-checked readers and writers for the protocol's field types (Int16, Int32, String...)."""

from __future__ import annotations

import struct
from typing import Final

from proxy.errors import ProtocolViolation

__all__ = [
    "Reader",
    "Writer",
    "require_int",
    "require_cstring",
    "require_format",
    "require_count",
]

_INT16: Final = struct.Struct("!h")
_UINT16: Final = struct.Struct("!H")
_INT32: Final = struct.Struct("!i")
_UINT32: Final = struct.Struct("!I")

#: Largest payload a frame can carry: the length word is a signed Int32 that counts itself.
MAX_PAYLOAD: Final = 0x7FFFFFFF - 4


class Reader:
    r"""Reads the fields of one message payload; every overrun is a `ProtocolViolation`.

    Args:
        data: the payload, without type byte and length word.
        what: the message's name, used in error messages.

    >>> r = Reader(b"\x00\x02ab\x00", "Demo")
    >>> r.uint16(), r.cstring(), r.remaining
    (2, 'ab', 0)
    >>> r.int32()
    Traceback (most recent call last):
    proxy.errors.ProtocolViolation: invalid Demo message: Int32 at offset 5 needs 4 bytes, 0 left
    """

    __slots__ = ("_data", "_pos", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._pos = 0
        self._what = what

    @property
    def remaining(self) -> int:
        """Bytes not yet read."""
        return len(self._data) - self._pos

    def fail(self, reason: str) -> ProtocolViolation:
        """Build (not raise) the error for a malformed field, naming the message.

        Args:
            reason: what is wrong, in a few words.

        Returns:
            The error for the caller to raise.
        """
        return ProtocolViolation(f"invalid {self._what} message: {reason}")

    def _take(self, size: int, field: str) -> int:
        start = self._pos
        if not 0 <= size <= len(self._data) - start:
            left = len(self._data) - start
            raise self.fail(f"{field} at offset {start} needs {size} bytes, {left} left")
        self._pos = start + size
        return start

    def byte(self) -> int:
        """Read an Int8/Byte1 as an unsigned value."""
        return self._data[self._take(1, "Byte1")]

    def int16(self) -> int:
        """Read a signed Int16."""
        return int(_INT16.unpack_from(self._data, self._take(2, "Int16"))[0])

    def uint16(self) -> int:
        """Read an Int16 as unsigned (counts, which PostgreSQL reads with pq_getmsgint)."""
        return int(_UINT16.unpack_from(self._data, self._take(2, "Int16"))[0])

    def int32(self) -> int:
        """Read a signed Int32."""
        return int(_INT32.unpack_from(self._data, self._take(4, "Int32"))[0])

    def uint32(self) -> int:
        """Read an Int32 as unsigned (OIDs)."""
        return int(_UINT32.unpack_from(self._data, self._take(4, "Int32"))[0])

    def raw(self, size: int) -> bytes:
        """Read exactly `size` bytes."""
        start = self._take(size, "data")
        return self._data[start : self._pos]

    def rest(self) -> bytes:
        """Read every remaining byte."""
        return self.raw(self.remaining)

    def sized(self) -> bytes | None:
        """Read an Int32 length then that many bytes; length -1 means NULL."""
        size = self.int32()
        if size == -1:
            return None
        if size < 0:
            raise self.fail(f"invalid value length {size}")
        return self.raw(size)

    def cstring(self) -> str:
        """Read a NUL-terminated UTF-8 String."""
        end = self._data.find(b"\x00", self._pos)
        if end < 0:
            raise self.fail(f"String at offset {self._pos} has no NUL terminator")
        start, self._pos = self._pos, end + 1
        try:
            return self._data[start:end].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"String at offset {start} is not valid UTF-8 ({exc.reason})") from None

    def count(self, item_size: int, field: str, *, wide: bool = False) -> int:
        """Read a count of items, refusing one the rest of the payload cannot hold.

        Args:
            item_size: the least number of bytes each counted item occupies.
            field: what is counted, for the error message.
            wide: the count is a signed Int32 rather than an unsigned Int16.

        Returns:
            The count.
        """
        count = self.int32() if wide else self.uint16()
        if count < 0 or count * item_size > self.remaining:
            raise self.fail(f"{count} {field} cannot fit in the {self.remaining} bytes left")
        return count

    def finish(self) -> None:
        """Refuse bytes left over after the last field."""
        if self._pos != len(self._data):
            raise self.fail(f"{self.remaining} unexpected bytes after the last field")


class Writer:
    r"""Accumulates the fields of one message payload and frames it.

    >>> w = Writer()
    >>> w.cstring("SELECT 1")
    >>> w.frame(b"Q")
    b'Q\x00\x00\x00\rSELECT 1\x00'
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def byte(self, value: int) -> None:
        """Append one byte."""
        self._buf.append(value)

    def int16(self, value: int) -> None:
        """Append a signed Int16."""
        self._buf += _INT16.pack(value)

    def uint16(self, value: int) -> None:
        """Append an unsigned Int16 (counts)."""
        self._buf += _UINT16.pack(value)

    def int32(self, value: int) -> None:
        """Append a signed Int32."""
        self._buf += _INT32.pack(value)

    def uint32(self, value: int) -> None:
        """Append an unsigned Int32 (OIDs)."""
        self._buf += _UINT32.pack(value)

    def raw(self, value: bytes) -> None:
        """Append bytes as they are."""
        self._buf += value

    def sized(self, value: bytes | None) -> None:
        """Append an Int32 length and the bytes; None is written as length -1."""
        if value is None:
            self.int32(-1)
        else:
            self.int32(len(value))
            self._buf += value

    def cstring(self, value: str) -> None:
        """Append a NUL-terminated UTF-8 String (callers have refused embedded NULs)."""
        self._buf += value.encode("utf-8")
        self._buf.append(0)

    def frame(self, type_byte: bytes) -> bytes:
        """Return the type byte, the Int32 length (counting itself) and the payload.

        Args:
            type_byte: the one-byte message type; empty for the untyped startup packets.

        Returns:
            The message's bytes, ready for the socket.

        Raises:
            ValueError: the payload is longer than the length word can express.
        """
        if len(self._buf) > MAX_PAYLOAD:
            raise ValueError(f"payload of {len(self._buf)} bytes cannot be framed")
        return type_byte + _INT32.pack(len(self._buf) + 4) + self._buf


def require_int(value: int, bits: int, field: str, *, signed: bool = True) -> None:
    """Refuse an integer that its wire field cannot hold.

    Args:
        value: the integer.
        bits: the field width (8, 16 or 32).
        field: the field's name, for the error message.
        signed: whether the field is two's complement.

    Raises:
        ValueError: out of range.

    >>> require_int(70000, 16, "count", signed=False)
    Traceback (most recent call last):
    ValueError: count 70000 does not fit in an unsigned 16-bit field
    """
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        kind = "a signed" if signed else "an unsigned"
        raise ValueError(f"{field} {value} does not fit in {kind} {bits}-bit field")


def require_cstring(value: str, field: str) -> None:
    r"""Refuse a string that cannot travel as a NUL-terminated String.

    Args:
        value: the string.
        field: the field's name, for the error message.

    Raises:
        ValueError: it contains NUL.

    >>> require_cstring("a\x00b", "query")
    Traceback (most recent call last):
    ValueError: query contains a NUL character
    """
    if "\x00" in value:
        raise ValueError(f"{field} contains a NUL character")


def require_format(code: int, field: str) -> None:
    """Refuse a format code other than 0 (text) or 1 (binary).

    Args:
        code: the format code.
        field: the field's name, for the error message.

    Raises:
        ValueError: not 0 or 1.
    """
    if code not in (0, 1):
        raise ValueError(f"{field} {code} is not 0 (text) or 1 (binary)")


def require_count(items: tuple[object, ...], field: str) -> None:
    """Refuse a list longer than an unsigned Int16 count can announce.

    Args:
        items: the items to be counted.
        field: what is counted, for the error message.

    Raises:
        ValueError: more than 65535 items.
    """
    require_int(len(items), 16, f"number of {field}", signed=False)
