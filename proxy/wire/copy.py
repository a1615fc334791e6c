"""COPY sub-protocol messages: CopyData and CopyDone travel both ways, the rest one way each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from proxy.wire.fields import (
    Reader,
    Writer,
    require_count,
    require_cstring,
    require_format,
)
from proxy.wire.message import Message

__all__ = ["CopyData", "CopyDone", "CopyFail", "CopyInResponse", "CopyOutResponse"]


@dataclass(frozen=True, slots=True)
class CopyData(Message):
    """A chunk of COPY data stream (frontend or backend)."""

    TYPE: ClassVar[bytes] = b"d"
    data: bytes

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.raw(self.data)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.rest())


@dataclass(frozen=True, slots=True)
class CopyDone(Message):
    """The COPY data stream is complete (frontend or backend)."""

    TYPE: ClassVar[bytes] = b"c"


@dataclass(frozen=True, slots=True)
class CopyFail(Message):
    """The client aborts a COPY FROM STDIN, with a reason (frontend)."""

    TYPE: ClassVar[bytes] = b"f"
    message: str

    def __post_init__(self) -> None:
        require_cstring(self.message, "message")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.message)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.cstring())


@dataclass(frozen=True, slots=True)
class _CopyResponse(Message):
    """Shared layout: Int8 overall format, Int16 count, Int16 format per column."""

    overall_format: int
    column_formats: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "column_formats", tuple(self.column_formats))
        require_format(self.overall_format, "overall format")
        require_count(self.column_formats, "column formats")
        for code in self.column_formats:
            require_format(code, "column format")
        if self.overall_format == 0 and any(self.column_formats):
            raise ValueError("a textual COPY must have every column format 0")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.byte(self.overall_format)
        writer.uint16(len(self.column_formats))
        for code in self.column_formats:
            writer.int16(code)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        overall = reader.byte()
        count = reader.count(2, "column formats")
        return cls(overall, tuple(reader.int16() for _ in range(count)))


@dataclass(frozen=True, slots=True)
class CopyInResponse(_CopyResponse):
    """The server is ready to receive COPY FROM STDIN data (backend)."""

    TYPE: ClassVar[bytes] = b"G"


@dataclass(frozen=True, slots=True)
class CopyOutResponse(_CopyResponse):
    """The server is about to send COPY TO STDOUT data (backend)."""

    TYPE: ClassVar[bytes] = b"H"
