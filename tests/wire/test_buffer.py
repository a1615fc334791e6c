"""MessageBuffer: framing, waiting for partial messages, and refusing impossible lengths."""

from __future__ import annotations

import struct

import pytest

from proxy.errors import ProtocolViolation
from proxy.wire import (
    FRONTEND_LIMITS,
    MessageBuffer,
    Query,
    RawMessage,
    SSLRequest,
    StartupMessage,
    Sync,
    encode_all,
)
from proxy.wire.buffer import MAX_MESSAGE_LENGTH, MAX_STARTUP_LENGTH


def header(type_byte: bytes, length: int) -> bytes:
    """A type byte and a (possibly lying) signed length word."""
    return type_byte + struct.pack("!i", length)


@pytest.mark.parametrize("size", range(5))
def test_incomplete_header_waits(size: int) -> None:
    """Fewer than five bytes of a typed message is never a message yet."""
    buffer = MessageBuffer()
    buffer.feed(Query("x").encode()[:size])
    assert buffer.take_message() is None
    assert buffer.pending == size


def test_incomplete_body_waits_then_completes() -> None:
    """A body arriving in pieces is handed out once, whole, and the rest stays buffered."""
    data = Query("SELECT 1").encode() + Sync().encode()
    buffer = MessageBuffer()
    buffer.feed(data[:10])
    assert buffer.take_message() is None
    buffer.feed(data[10:16])
    assert buffer.take_message() == RawMessage(b"Q", b"SELECT 1\x00")
    assert buffer.take_message() is None
    buffer.feed(data[16:])
    assert buffer.take_message() == RawMessage(b"S", b"")
    assert buffer.pending == 0


@pytest.mark.parametrize("length", [0, 3, -1, -(2**31)])
def test_length_below_four_is_fatal(length: int) -> None:
    """A length word must count at least itself."""
    buffer = MessageBuffer()
    buffer.feed(header(b"Q", length))
    with pytest.raises(
        ProtocolViolation, match=f"invalid message length {length} for message type 'Q'"
    ):
        buffer.take_message()


def test_length_over_cap_fails_before_the_body_arrives() -> None:
    """An oversized length is refused from the header alone: no waiting for a gigabyte."""
    buffer = MessageBuffer()
    buffer.feed(header(b"Q", MAX_MESSAGE_LENGTH + 1))
    with pytest.raises(ProtocolViolation, match="over the limit of 1073741824"):
        buffer.take_message()


def test_custom_cap() -> None:
    """max_length is a cap on the length word, inclusive."""
    buffer = MessageBuffer(max_length=13)
    buffer.feed(Query("SELECT 1").encode())  # length word 13
    assert buffer.take_message() is not None
    buffer.feed(Query("SELECT 10").encode())
    with pytest.raises(ProtocolViolation, match="has length 14, over the limit of 13"):
        buffer.take_message()


def test_per_type_limit_for_small_messages() -> None:
    """With FRONTEND_LIMITS a Sync may not claim 10 kB, though a Query may."""
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    buffer.feed(header(b"Q", 20_000))
    assert buffer.take_message() is None  # plausible: wait for the body
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    buffer.feed(header(b"S", 20_000))
    with pytest.raises(ProtocolViolation, match="message type 'S' has length 20000"):
        buffer.take_message()


def test_unknown_type_fails_on_its_first_byte() -> None:
    """With limits, an unknown type byte is refused before its length is even read."""
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    buffer.feed(b"z")
    with pytest.raises(ProtocolViolation, match="invalid message type 'z'"):
        buffer.take_message()


def test_unprintable_type_is_named_in_hex() -> None:
    """Error messages stay readable for control bytes."""
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    buffer.feed(b"\x00")
    with pytest.raises(ProtocolViolation, match="invalid message type 0x00"):
        buffer.take_message()


def test_failure_is_sticky() -> None:
    """Once framing is lost, every later take fails too, even after more bytes."""
    buffer = MessageBuffer()
    buffer.feed(header(b"Q", 2))
    with pytest.raises(ProtocolViolation):
        buffer.take_message()
    buffer.feed(Sync().encode())
    with pytest.raises(ProtocolViolation, match="invalid message length 2"):
        buffer.take_message()
    with pytest.raises(ProtocolViolation):
        buffer.take_startup()


def test_large_stream_in_small_chunks_is_compacted_and_exact() -> None:
    """Many messages fed 1000 bytes at a time come out in order (exercises compaction)."""
    messages = [Query(f"SELECT {i}" + " " * (i % 300)) for i in range(2_000)]
    data = encode_all(messages)
    buffer = MessageBuffer()
    taken = []
    for start in range(0, len(data), 1000):
        buffer.feed(data[start : start + 1000])
        while (raw := buffer.take_message()) is not None:
            taken.append(raw)
    assert [raw.payload[:-1].decode() for raw in taken] == [m.sql for m in messages]
    assert buffer.pending == 0


def test_feed_accepts_memoryview_and_bytearray() -> None:
    """Whatever the socket layer hands over is accepted."""
    data = Sync().encode()
    buffer = MessageBuffer()
    buffer.feed(memoryview(data)[:2])
    buffer.feed(bytearray(data[2:]))
    assert buffer.take_message() == RawMessage(b"S", b"")


def test_limits_must_admit_an_empty_message() -> None:
    """A cap below the smallest legal message is a configuration mistake."""
    with pytest.raises(ValueError):
        MessageBuffer(max_length=3)


@pytest.mark.parametrize("length", [0, 4, 7, -8, MAX_STARTUP_LENGTH + 1])
def test_startup_length_bounds(length: int) -> None:
    """A startup packet holds at least its code and at most PostgreSQL's 10000 bytes."""
    buffer = MessageBuffer()
    buffer.feed(struct.pack("!i", length) + b"\x00" * 8)
    with pytest.raises(ProtocolViolation, match=f"invalid length of startup packet: {length}"):
        buffer.take_startup()


def test_startup_at_the_cap_is_accepted() -> None:
    """Exactly MAX_STARTUP_LENGTH is still fine, and waits until complete."""
    packet = StartupMessage({"user": "u", "options": "x" * 9_979}).encode()
    assert len(packet) == MAX_STARTUP_LENGTH
    buffer = MessageBuffer()
    buffer.feed(packet[:-1])
    assert buffer.take_startup() is None
    buffer.feed(packet[-1:])
    assert buffer.take_startup() == packet[4:]


def test_bytes_after_sslrequest_are_visible() -> None:
    """A server must see plaintext pipelined after SSLRequest before starting TLS."""
    buffer = MessageBuffer()
    buffer.feed(SSLRequest().encode() + Query("injected").encode())
    assert buffer.take_startup() == bytes.fromhex("04d2162f")
    assert buffer.pending == len(Query("injected").encode())


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_oversized_message_is_dropped_as_it_arrives(chunk: int) -> None:
    big = Query("x" * 10_000).encode()
    stream = big + Query("SELECT 1").encode() + big[:5]
    buf = MessageBuffer(oversize={b"Q": 1000})
    taken = []
    for i in range(0, len(stream), chunk):
        buf.feed(stream[i : i + chunk])
        assert buf.pending <= max(chunk, 1000)  # never the whole statement
        while (raw := buf.take_message()) is not None:
            taken.append(raw)
    assert [(r.type, r.payload, r.oversized) for r in taken] == [
        (b"Q", b"", len(big) - 1),
        (b"Q", b"SELECT 1\x00", 0),
    ]
    assert buf.take_message() is None  # the third has only begun: still dropping it


def test_message_at_the_soft_cap_is_kept() -> None:
    message = Query("x" * 995).encode()  # length word 1000
    buf = MessageBuffer(oversize={b"Q": 1000})
    buf.feed(message)
    raw = buf.take_message()
    assert raw is not None and raw.oversized == 0 and len(raw.payload) == 996
