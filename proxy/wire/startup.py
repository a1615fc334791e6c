"""The untyped startup-phase packets: StartupMessage, SSLRequest, GSSENCRequest, CancelRequest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, TypeAlias

from proxy.wire.fields import Reader, Writer, require_cstring, require_int
from proxy.wire.message import decode_payload

__all__ = [
    "StartupMessage",
    "SSLRequest",
    "GSSENCRequest",
    "CancelRequest",
    "StartupPacket",
    "decode_startup",
    "split_options",
    "SSL_REQUEST_CODE",
    "GSSENC_REQUEST_CODE",
    "CANCEL_REQUEST_CODE",
    "ENCRYPTION_REFUSED",
]

SSL_REQUEST_CODE: Final = 80877103  # 1234 << 16 | 5679
GSSENC_REQUEST_CODE: Final = 80877104  # 1234 << 16 | 5680
CANCEL_REQUEST_CODE: Final = 80877102  # 1234 << 16 | 5678
#: The single byte (not a message) that refuses an SSLRequest or GSSENCRequest.
ENCRYPTION_REFUSED: Final = b"N"
# Protocol 3.2 lets the cancel key grow from 4 bytes up to 256.
_MAX_SECRET_KEY: Final = 256


@dataclass(frozen=True, slots=True)
class StartupMessage:
    """The first packet of a session: protocol version and run-time parameters.

    Args:
        parameters: name to value in the client's order (``user``, ``database``,
            ``options``, ``application_name``, ``_pq_.*`` protocol options, ...).
        major: protocol major version; only 3 can be parsed.
        minor: protocol minor version, possibly newer than ours (answer with
            NegotiateProtocolVersion).
    """

    parameters: Mapping[str, str]
    major: int = 3
    minor: int = 0

    def __post_init__(self) -> None:
        require_int(self.major, 16, "major version", signed=False)
        require_int(self.minor, 16, "minor version", signed=False)
        for name, value in self.parameters.items():
            require_cstring(name, "parameter name")
            require_cstring(value, f"parameter {name!r}")
            if not name:
                raise ValueError("a parameter name is empty")
        object.__setattr__(self, "parameters", MappingProxyType(dict(self.parameters)))

    @property
    def protocol_options(self) -> tuple[str, ...]:
        """Names of the ``_pq_.`` protocol options requested, in order."""
        return tuple(name for name in self.parameters if name.startswith("_pq_."))

    def encode(self) -> bytes:
        """Return the packet: Int32 length, Int32 version, name/value Strings, a final NUL."""
        writer = Writer()
        writer.int32(self.major << 16 | self.minor)
        for name, value in self.parameters.items():
            writer.cstring(name)
            writer.cstring(value)
        writer.byte(0)
        return writer.frame(b"")

    @classmethod
    def read(cls, reader: Reader, major: int, minor: int) -> StartupMessage:
        """Read the parameter list that follows the version word."""
        if major != 3:
            raise reader.fail(
                f"unsupported frontend protocol {major}.{minor}: server supports 3.0 to 3.x"
            )
        parameters: dict[str, str] = {}
        while (name := reader.cstring()) != "":
            parameters[name] = reader.cstring()  # a repeated name overrides, as in PostgreSQL
        return cls(parameters, major, minor)


@dataclass(frozen=True, slots=True)
class SSLRequest:
    """Asks whether the server will speak TLS; the answer is one byte, ``S`` or ``N``."""

    def encode(self) -> bytes:
        """Return the 8-byte packet."""
        writer = Writer()
        writer.int32(SSL_REQUEST_CODE)
        return writer.frame(b"")


@dataclass(frozen=True, slots=True)
class GSSENCRequest:
    """Asks whether the server will speak GSSAPI encryption; the answer is ``G`` or ``N``."""

    def encode(self) -> bytes:
        """Return the 8-byte packet."""
        writer = Writer()
        writer.int32(GSSENC_REQUEST_CODE)
        return writer.frame(b"")


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """Asks, on a fresh connection, to cancel the query running in another session.

    Args:
        process_id: the target's process id from its BackendKeyData.
        secret_key: the target's secret key: 4 bytes in protocol 3.0, up to 256 in 3.2.
    """

    process_id: int
    secret_key: bytes

    def __post_init__(self) -> None:
        require_int(self.process_id, 32, "process id")
        if not 4 <= len(self.secret_key) <= _MAX_SECRET_KEY:
            raise ValueError(f"secret key of {len(self.secret_key)} bytes is not 4 to 256")

    def encode(self) -> bytes:
        """Return the packet: length, code, process id, secret key."""
        writer = Writer()
        writer.int32(CANCEL_REQUEST_CODE)
        writer.int32(self.process_id)
        writer.raw(self.secret_key)
        return writer.frame(b"")

    @classmethod
    def read(cls, reader: Reader) -> CancelRequest:
        """Read process id and secret key."""
        return cls(reader.int32(), reader.rest())


StartupPacket: TypeAlias = StartupMessage | SSLRequest | GSSENCRequest | CancelRequest


def _read_startup(reader: Reader) -> StartupPacket:
    code = reader.int32()
    if code == SSL_REQUEST_CODE:
        return SSLRequest()
    if code == GSSENC_REQUEST_CODE:
        return GSSENCRequest()
    if code == CANCEL_REQUEST_CODE:
        return CancelRequest.read(reader)
    return StartupMessage.read(reader, code >> 16 & 0xFFFF, code & 0xFFFF)


def decode_startup(payload: bytes) -> StartupPacket:
    r"""Decode a packet taken with `MessageBuffer.take_startup`.

    Args:
        payload: the bytes after the length word.

    Returns:
        The packet.

    Raises:
        ProtocolViolation: malformed, or a protocol major version other than 3.

    >>> decode_startup(bytes.fromhex("04d2162f"))
    SSLRequest()
    >>> decode_startup(b"\x00\x03\x00\x00user\x00ann\x00\x00").parameters["user"]
    'ann'
    """
    return decode_payload(_read_startup, payload, "startup")


_SPACE: Final = frozenset(" \t\n\v\f\r")


def split_options(options: str) -> list[str]:
    r"""Split the ``options`` startup parameter into arguments, as PostgreSQL's pg_split_opts.

    Arguments are separated by whitespace; a backslash makes the next character literal.

    Args:
        options: the parameter's value.

    Returns:
        The arguments, e.g. ``["-c", "search_path=a b"]``.

    >>> split_options(r"-c search_path=a\ b  -cgeqo=off")
    ['-c', 'search_path=a b', '-cgeqo=off']
    """
    args: list[str] = []
    current: list[str] | None = None
    escaped = False
    for char in options:
        if char in _SPACE and not escaped:
            if current is not None:
                args.append("".join(current))
            current = None
            continue
        if current is None:
            current = []
        if char == "\\" and not escaped:
            escaped = True
        else:
            escaped = False
            current.append(char)
    if current is not None:
        args.append("".join(current))
    return args
