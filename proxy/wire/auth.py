"""Authentication exchange: the server's Authentication requests and the client's ``p`` replies.

Every client reply shares the type byte ``p``; which layout it has depends on what the server
asked for, so a session decodes it with the matching `decode_*` function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final, Self

from proxy.wire.fields import Reader, Writer, require_count, require_cstring
from proxy.wire.message import Message, decode_payload

__all__ = [
    "PasswordMessage",
    "SASLInitialResponse",
    "SASLResponse",
    "decode_password",
    "decode_sasl_initial_response",
    "decode_sasl_response",
    "Authentication",
    "AuthenticationOk",
    "AuthenticationCleartextPassword",
    "AuthenticationMD5Password",
    "AuthenticationSASL",
    "AuthenticationSASLContinue",
    "AuthenticationSASLFinal",
    "read_authentication",
]


@dataclass(frozen=True, slots=True)
class PasswordMessage(Message):
    """A cleartext password, or ``"md5"`` + hex digest after AuthenticationMD5Password."""

    TYPE: ClassVar[bytes] = b"p"
    password: str

    def __post_init__(self) -> None:
        require_cstring(self.password, "password")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.password)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.cstring())


@dataclass(frozen=True, slots=True)
class SASLInitialResponse(Message):
    """The client's chosen SASL mechanism and its first message (None: none sent)."""

    TYPE: ClassVar[bytes] = b"p"
    mechanism: str
    data: bytes | None

    def __post_init__(self) -> None:
        require_cstring(self.mechanism, "mechanism")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.cstring(self.mechanism)
        writer.sized(self.data)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.cstring(), reader.sized())


@dataclass(frozen=True, slots=True)
class SASLResponse(Message):
    """A later SASL message from the client, e.g. SCRAM's client-final-message."""

    TYPE: ClassVar[bytes] = b"p"
    data: bytes

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.raw(self.data)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.rest())


def decode_password(payload: bytes) -> PasswordMessage:
    r"""Decode a ``p`` payload as a PasswordMessage.

    >>> decode_password(b"secret\x00")
    PasswordMessage(password='secret')
    """
    return decode_payload(PasswordMessage.read, payload, "PasswordMessage")


def decode_sasl_initial_response(payload: bytes) -> SASLInitialResponse:
    r"""Decode a ``p`` payload as a SASLInitialResponse.

    >>> decode_sasl_initial_response(b"SCRAM-SHA-256\x00\xff\xff\xff\xff")
    SASLInitialResponse(mechanism='SCRAM-SHA-256', data=None)
    """
    return decode_payload(SASLInitialResponse.read, payload, "SASLInitialResponse")


def decode_sasl_response(payload: bytes) -> SASLResponse:
    """Decode a ``p`` payload as a SASLResponse (all of it is the SASL data)."""
    return decode_payload(SASLResponse.read, payload, "SASLResponse")


class Authentication(Message):
    """Base of the server's ``R`` messages: an Int32 request code, then the request's body."""

    __slots__ = ()
    TYPE: ClassVar[bytes] = b"R"
    CODE: ClassVar[int]

    def encode(self) -> bytes:
        """Return the framed message: type, length, code, body."""
        writer = Writer()
        writer.int32(self.CODE)
        self.write(writer)
        return writer.frame(self.TYPE)


@dataclass(frozen=True, slots=True)
class AuthenticationOk(Authentication):
    """Authentication succeeded."""

    CODE: ClassVar[int] = 0


@dataclass(frozen=True, slots=True)
class AuthenticationCleartextPassword(Authentication):
    """Send the password in clear (only over TLS, please)."""

    CODE: ClassVar[int] = 3


@dataclass(frozen=True, slots=True)
class AuthenticationMD5Password(Authentication):
    """Send md5(md5(password + user) + salt) as a PasswordMessage."""

    CODE: ClassVar[int] = 5
    salt: bytes

    def __post_init__(self) -> None:
        if len(self.salt) != 4:
            raise ValueError(f"MD5 salt has {len(self.salt)} bytes, not 4")

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.raw(self.salt)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.raw(4))


@dataclass(frozen=True, slots=True)
class AuthenticationSASL(Authentication):
    """Start SASL: the mechanisms the server offers, most preferred first."""

    CODE: ClassVar[int] = 10
    mechanisms: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "mechanisms", tuple(self.mechanisms))
        if not self.mechanisms:
            raise ValueError("no SASL mechanism offered")
        require_count(self.mechanisms, "mechanisms")
        for name in self.mechanisms:
            require_cstring(name, "mechanism")
            if not name:
                raise ValueError("a SASL mechanism name is empty")

    def write(self, writer: Writer) -> None:  # noqa: D102
        for name in self.mechanisms:
            writer.cstring(name)
        writer.byte(0)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        names: list[str] = []
        while (name := reader.cstring()) != "":
            names.append(name)
        return cls(tuple(names))


@dataclass(frozen=True, slots=True)
class _SASLData(Authentication):
    """Shared layout: the rest of the message is the SASL mechanism's data."""

    data: bytes

    def write(self, writer: Writer) -> None:  # noqa: D102
        writer.raw(self.data)

    @classmethod
    def read(cls, reader: Reader) -> Self:  # noqa: D102
        return cls(reader.rest())


@dataclass(frozen=True, slots=True)
class AuthenticationSASLContinue(_SASLData):
    """A SASL challenge, e.g. SCRAM's server-first-message."""

    CODE: ClassVar[int] = 11


@dataclass(frozen=True, slots=True)
class AuthenticationSASLFinal(_SASLData):
    """SASL outcome data, e.g. SCRAM's server-final-message; AuthenticationOk follows."""

    CODE: ClassVar[int] = 12


_BY_CODE: Final[dict[int, type[Authentication]]] = {
    cls.CODE: cls
    for cls in (
        AuthenticationOk,
        AuthenticationCleartextPassword,
        AuthenticationMD5Password,
        AuthenticationSASL,
        AuthenticationSASLContinue,
        AuthenticationSASLFinal,
    )
}


def read_authentication(reader: Reader) -> Authentication:
    """Read an ``R`` payload: the request code picks the message.

    Args:
        reader: positioned at the code.

    Returns:
        The request.

    Raises:
        ProtocolViolation: a code we do not speak (GSSAPI, SSPI, Kerberos) or a bad body.
    """
    code = reader.int32()
    cls = _BY_CODE.get(code)
    if cls is None:
        raise reader.fail(f"unsupported authentication request code {code}")
    return cls.read(reader)
