"""Malformed payloads are refused with a ProtocolViolation that says what is wrong.

Values the wire cannot carry are refused earlier, when a message is built.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable

import pytest

from proxy.errors import ProtocolViolation
from proxy.wire import (
    BackendKeyData,
    Bind,
    CancelRequest,
    Describe,
    ErrorResponse,
    Execute,
    FieldDescription,
    Parse,
    Query,
    RawMessage,
    StartupMessage,
    decode_backend,
    decode_frontend,
    decode_startup,
)
from proxy.wire.auth import decode_password, decode_sasl_initial_response

FRONTEND_CASES = [
    (b"Q", b"SELECT 1", "invalid Query message: String at offset 0 has no NUL terminator"),
    (b"Q", b"SELECT 1\x00x", "invalid Query message: 1 unexpected bytes after the last field"),
    (b"Q", b"\xff\x00", "invalid Query message: String at offset 0 is not valid UTF-8"),
    (b"P", b"s\x00q\x00\x03\xe8" + b"\x00" * 4, "1000 parameter types cannot fit in the 4 bytes"),
    (b"P", b"s\x00q\x00", "invalid Parse message: Int16 at offset 4 needs 2 bytes, 0 left"),
    (
        b"B",
        b"\x00\x00\x00\x02\x00\x00\x00\x00\x00\x03" + b"\xff\xff\xff\xff" * 3 + b"\x00\x00",
        "invalid Bind message: 2 parameter formats given for 3 parameters",
    ),
    (
        b"B",
        b"\x00\x00\x00\x01\x00\x02\x00\x00\x00\x00",
        "invalid Bind message: parameter format 2 is not 0 (text) or 1 (binary)",
    ),
    (b"B", b"\x00\x00\x00\x00\x00\x01\xff\xff\xff\xfe\x00\x00", "invalid value length -2"),
    (b"B", b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x64abc", "data at offset 10 needs 100 bytes, 3"),
    (b"D", b"X\x00", "invalid Describe message: target 0x58 is not 'S' (statement) or 'P'"),
    (b"C", b"", "invalid Close message: Byte1 at offset 0 needs 1 bytes, 0 left"),
    (b"E", b"\x00\x00\x00\x00", "invalid Execute message: Int32 at offset 1 needs 4 bytes, 3 left"),
    (b"S", b"\x00", "invalid Sync message: 1 unexpected bytes after the last field"),
    (b"F", b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x05", "result format 5 is not 0 (text)"),
    (b"f", b"oops", "invalid CopyFail message: String at offset 0 has no NUL terminator"),
    (b"z", b"", "invalid frontend message type 'z'"),
]


@pytest.mark.parametrize(("type_byte", "payload", "error"), FRONTEND_CASES)
def test_malformed_frontend_message(type_byte: bytes, payload: bytes, error: str) -> None:
    """Each defect is reported, naming the message and what is wrong."""
    with pytest.raises(ProtocolViolation, match=_literal(error)):
        decode_frontend(RawMessage(type_byte, payload))


BACKEND_CASES = [
    (b"Z", b"X", "invalid ReadyForQuery message: transaction status 'X' is not I, T or E"),
    (b"R", b"\x00\x00\x00\x07", "invalid Authentication message: unsupported authentication"),
    (b"R", b"\x00\x00\x00\x05ab", "data at offset 4 needs 4 bytes, 2 left"),
    (b"R", b"\x00\x00\x00\x0a\x00", "invalid Authentication message: no SASL mechanism offered"),
    (b"T", b"\x00\x05" + b"\x00" * 19, "5 fields cannot fit in the 19 bytes left"),
    (b"E", b"SERROR\x00", "invalid ErrorResponse message: Byte1 at offset 7 needs 1 bytes"),
    (b"E", b"\x80x\x00\x00", "field code '\\x80' is not one ASCII character"),
    (b"D", b"\x00\x02\x00\x00\x00\x00", "2 columns cannot fit in the 4 bytes left"),
    (b"H", b"\x00\x00\x01\x00\x01", "a textual COPY must have every column format 0"),
    (b"v", b"\x00\x03\x00\x00\xff\xff\xff\xff", "-1 options cannot fit"),
    (b"K", b"\x00\x00\x00\x01ab", "secret key of 2 bytes is not 4 to 256"),
    (b"A", b"", "invalid backend message type 'A'"),
]


@pytest.mark.parametrize(("type_byte", "payload", "error"), BACKEND_CASES)
def test_malformed_backend_message(type_byte: bytes, payload: bytes, error: str) -> None:
    """A relay reading a server gets the same precise refusals."""
    with pytest.raises(ProtocolViolation, match=_literal(error)):
        decode_backend(RawMessage(type_byte, payload))


STARTUP_CASES = [
    (b"\x00\x02\x00\x00user\x00u\x00\x00", "unsupported frontend protocol 2.0"),
    (b"\x00\x03\x00\x00user\x00u\x00", "String at offset 11 has no NUL terminator"),
    (b"\x00\x03\x00\x00user\x00", "String at offset 9 has no NUL terminator"),
    (b"\x00\x03\x00\x00", "String at offset 4 has no NUL terminator"),
    (b"\x00\x03\x00\x00\x00\x00", "1 unexpected bytes after the last field"),
    (bytes.fromhex("04d2162f00"), "1 unexpected bytes after the last field"),
    (bytes.fromhex("04d2163000000000"), "4 unexpected bytes after the last field"),
    (bytes.fromhex("04d2162e00000001") + b"abc", "secret key of 3 bytes is not 4 to 256"),
    (bytes.fromhex("04d2162e000000"), "Int32 at offset 4 needs 4 bytes, 3 left"),
    (b"\x00\x03", "Int32 at offset 0 needs 4 bytes, 2 left"),
]


@pytest.mark.parametrize(("payload", "error"), STARTUP_CASES)
def test_malformed_startup_packet(payload: bytes, error: str) -> None:
    """Startup packets are checked as strictly as PostgreSQL's ProcessStartupPacket."""
    with pytest.raises(ProtocolViolation, match=_literal("invalid startup message: " + error)):
        decode_startup(payload)


@pytest.mark.parametrize(
    ("decode", "payload", "error"),
    [
        (decode_password, b"pw", "invalid PasswordMessage message: String at offset 0 has no"),
        (decode_password, b"pw\x00\x00", "1 unexpected bytes after the last field"),
        (decode_sasl_initial_response, b"SCRAM-SHA-256\x00\x00\x00\x00\x0aabc", "needs 10 bytes"),
        (decode_sasl_initial_response, b"M\x00\xff\xff\xff\xfe", "invalid value length -2"),
    ],
)
def test_malformed_password_forms(
    decode: Callable[[bytes], object], payload: bytes, error: str
) -> None:
    """The ``p`` decoders are as strict as the rest."""
    with pytest.raises(ProtocolViolation, match=_literal(error)):
        decode(payload)


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: Query("a\x00b"), "query contains a NUL character"),
        (lambda: Parse("", "q", (-1,)), "parameter type OID -1 does not fit"),
        (lambda: Bind("", "", (0, 1), (b"x",)), "2 parameter formats given for 1 parameters"),
        (lambda: Bind("", "", (), (), (2,)), "result format 2 is not 0"),
        (lambda: Bind("", "", (), (None,) * 65_536), "number of parameters 65536 does not fit"),
        (lambda: Execute("", 2**31), "max_rows 2147483648 does not fit"),
        (lambda: Describe("X", ""), "'X' is not a valid Target"),  # type: ignore[arg-type]
        (lambda: BackendKeyData(1, b"abc"), "secret key of 3 bytes is not 4 to 256"),
        (lambda: CancelRequest(1, b"a" * 257), "secret key of 257 bytes"),
        (lambda: FieldDescription("c", 0, 0, 23, 4, -1, 2), "format 2 is not 0"),
        (lambda: ErrorResponse({"MM": "x"}), "field code 'MM' is not one ASCII character"),
        (lambda: StartupMessage({"": "x"}), "a parameter name is empty"),
        (lambda: StartupMessage({"user": "a\x00"}), "parameter 'user' contains a NUL"),
    ],
)
def test_impossible_values_are_refused_at_birth(build: Callable[[], object], error: str) -> None:
    """A message that could not be encoded faithfully cannot be built."""
    with pytest.raises(ValueError, match=_literal(error)):
        build()


def test_bind_format_lookup() -> None:
    """Zero formats mean text, one applies to all, otherwise one each."""
    assert Bind("", "", (), (b"1", b"2")).param_format(1) == 0
    assert Bind("", "", (1,), (b"1", b"2")).param_format(1) == 1
    assert Bind("", "", (0, 1), (b"1", b"2")).param_format(1) == 1
    assert Bind("", "", (), (), (1,)).result_format(2, columns=3) == 1


def test_bind_result_format_count_is_checked_against_the_columns() -> None:
    """Two result formats for a three-column query is the client's protocol error."""
    with pytest.raises(ProtocolViolation, match="has 2 result formats but the query has 3"):
        Bind("", "", (), (), (0, 1)).result_format(0, columns=3)


def test_length_words_are_signed() -> None:
    """A DataRow value length of 0x80000000 is negative, not two gigabytes."""
    payload = b"\x00\x01" + struct.pack("!I", 0x80000000)
    with pytest.raises(ProtocolViolation, match="invalid value length -2147483648"):
        decode_backend(RawMessage(b"D", payload))


def _literal(text: str) -> str:
    """Escape a message for pytest.raises(match=...)."""
    return re.escape(text)
