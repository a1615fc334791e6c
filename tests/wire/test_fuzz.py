"""Hostile bytes: the codec waits, yields messages, or raises ProtocolViolation; nothing else.

Values decode or raise InvalidParameterValue. No other exception escapes and nothing hangs.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.errors import InvalidParameterValue, ProtocolViolation
from proxy.wire import (
    FRONTEND_LIMITS,
    BackendMessage,
    FrontendMessage,
    MessageBuffer,
    RawMessage,
    decode_backend,
    decode_frontend,
    decode_startup,
    encode_all,
)
from proxy.wire.auth import (
    decode_password,
    decode_sasl_initial_response,
    decode_sasl_response,
)
from proxy.wire.types import CODECS, decode_value

from .strategies import backend_messages, frontend_messages

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Payload pieces that look like fields, so fuzzing reaches past the first length check.
_pieces = st.one_of(
    st.binary(max_size=6),
    st.just(b"\x00"),
    st.integers(0, 6).map(lambda n: struct.pack("!H", n)),
    st.integers(-2, 8).map(lambda n: struct.pack("!i", n)),
    st.sampled_from([b"S", b"P", b"I", b"SCRAM-SHA-256\x00", b"user\x00", b"\xff\xff"]),
)
payloads = st.lists(_pieces, max_size=12).map(b"".join)
frontend_types = st.sampled_from(sorted(FRONTEND_LIMITS))
backend_types = st.sampled_from([bytes([c]) for c in b"RSKZTDCIEN123ntsvGHdc"])
chunk_sizes = st.lists(st.integers(1, 64), min_size=1, max_size=8)


def drain(buffer: MessageBuffer, startup: bool) -> tuple[list[bytes | RawMessage], bool]:
    """Take until the buffer waits; report whether framing failed."""
    taken: list[bytes | RawMessage] = []
    for _ in range(10_000):  # more than the bytes fed: a loop that never ends is a bug
        try:
            item = buffer.take_startup() if startup else buffer.take_message()
        except ProtocolViolation:
            return taken, True
        if item is None:
            return taken, False
        taken.append(item)
    raise AssertionError("buffer keeps yielding without consuming")


def decode_quietly(item: bytes | RawMessage, side: str) -> None:
    """Decode, allowing only ProtocolViolation; whatever decodes must re-encode and decode."""
    try:
        if isinstance(item, bytes):
            packet = decode_startup(item)
            assert decode_startup(packet.encode()[4:]) == packet
            return
        decode = decode_frontend if side == "frontend" else decode_backend
        message = decode(item)
    except ProtocolViolation:
        return
    data = message.encode()
    assert decode(RawMessage(data[:1], data[5:])) == message


@FUZZ
@given(st.binary(max_size=300), chunk_sizes, st.booleans())
def test_random_bytes_into_a_client_buffer(data: bytes, sizes: list[int], startup: bool) -> None:
    """Random bytes, in random chunks, from the startup phase or later."""
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    position, turn = 0, 0
    while position < len(data):
        size = sizes[turn % len(sizes)]
        buffer.feed(data[position : position + size])
        position, turn = position + size, turn + 1
        taken, failed = drain(buffer, startup)
        for item in taken:
            decode_quietly(item, "frontend")
        if failed:
            break


@FUZZ
@given(st.lists(st.tuples(frontend_types, payloads), max_size=6), chunk_sizes)
def test_plausible_frames_with_garbage_payloads(
    frames: list[tuple[bytes, bytes]], sizes: list[int]
) -> None:
    """Correctly framed messages whose payloads are nonsense fail one by one, cleanly."""
    data = b"".join(t + struct.pack("!i", len(p) + 4) + p for t, p in frames)
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    taken: list[bytes | RawMessage] = []
    for start in range(0, len(data), sizes[0]):
        buffer.feed(data[start : start + sizes[0]])
        more, failed = drain(buffer, startup=False)
        assert not failed
        taken += more
    assert [(raw.type, raw.payload) for raw in taken] == frames  # type: ignore[union-attr]
    for raw in taken:
        decode_quietly(raw, "frontend")


@FUZZ
@given(backend_types, payloads)
def test_garbage_backend_payloads(type_byte: bytes, payload: bytes) -> None:
    """A relay reading a broken server only ever sees ProtocolViolation."""
    decode_quietly(RawMessage(type_byte, payload), "backend")


@FUZZ
@given(payloads, st.sampled_from([b"", b"\x00\x03\x00\x00", bytes.fromhex("04d2162e")]))
def test_garbage_startup_payloads(payload: bytes, prefix: bytes) -> None:
    """Startup packets with valid or random codes and random bodies."""
    decode_quietly(prefix + payload, "frontend")


@FUZZ
@given(payloads)
def test_garbage_password_payloads(payload: bytes) -> None:
    """Each ``p`` decoder refuses garbage with ProtocolViolation only."""
    for decode in (decode_password, decode_sasl_initial_response, decode_sasl_response):
        try:
            decode(payload)
        except ProtocolViolation:
            pass


@FUZZ
@given(st.lists(frontend_messages, min_size=1, max_size=5), st.data())
def test_truncated_streams_wait(messages: list[FrontendMessage], data: st.DataObject) -> None:
    """Any prefix of a valid stream yields exactly the complete messages, then waits."""
    encoded = [message.encode() for message in messages]
    stream = b"".join(encoded)
    cut = data.draw(st.integers(0, len(stream)))
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    buffer.feed(stream[:cut])
    taken, failed = drain(buffer, startup=False)
    assert not failed
    complete, end = 0, 0
    while complete < len(encoded) and end + len(encoded[complete]) <= cut:
        end += len(encoded[complete])
        complete += 1
    assert [decode_frontend(raw) for raw in taken] == messages[:complete]  # type: ignore[arg-type]
    assert buffer.pending == cut - end


@FUZZ
@given(st.lists(backend_messages, min_size=1, max_size=4), st.data())
def test_mutated_streams(messages: list[BackendMessage], data: st.DataObject) -> None:
    """Valid backend streams with a few bytes overwritten never escape ProtocolViolation."""
    stream = bytearray(encode_all(messages))
    for _ in range(data.draw(st.integers(1, 3))):
        stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    buffer = MessageBuffer(max_length=1 << 16)
    buffer.feed(bytes(stream))
    taken, _ = drain(buffer, startup=False)
    for raw in taken:
        decode_quietly(raw, "backend")


@FUZZ
@given(st.sampled_from(sorted(CODECS)), st.sampled_from((0, 1)), st.binary(max_size=24))
def test_garbage_values(oid: int, format_code: int, data: bytes) -> None:
    """Bind parameters of any bytes decode or raise InvalidParameterValue, nothing else."""
    try:
        decode_value(data, oid, format_code)
    except InvalidParameterValue:
        pass
