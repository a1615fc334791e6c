"""The fast relay's scan of backend bytes, with fake transports: chunks may split anywhere."""

from __future__ import annotations

import struct

import pytest

from proxy.errors import ConnectionFailure
from proxy.server.address import UpstreamAddress
from proxy.server.connection import Connection
from proxy.server.upstream import Upstream
from proxy.wire import TransactionStatus


class FakeTransport:
    """Keeps what is written; always reading, never closing."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.writes: list[bytes | bytearray] = []

    def write(self, data: bytes | bytearray) -> None:
        self.writes.append(data)
        self.written += data

    def is_closing(self) -> bool:
        return False

    def is_reading(self) -> bool:
        return True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


REPLY = (
    message(b"T", b"\x00\x01a\x00" + b"\x00" * 18)
    + message(b"D", b"\x00\x01\x00\x00\x00\x011")
    + message(b"C", b"SELECT 1\x00")
)
READY_T = message(b"Z", b"T")
NOTIFY = message(b"A", b"\x00\x00\x00\x07ch\x00x\x00")


def relay() -> tuple[Upstream, Connection, FakeTransport, list[tuple[object, int]]]:
    backend, client = Connection(), Connection()
    backend.connection_made(FakeTransport())  # type: ignore[arg-type]
    transport = FakeTransport()
    client.connection_made(transport)  # type: ignore[arg-type]
    upstream = Upstream(UpstreamAddress("127.0.0.1", 5432, "u", None, "d"), backend)
    return upstream, client, transport, []


@pytest.mark.parametrize("cut", range(len(REPLY + READY_T) + 1))
def test_a_reply_split_anywhere_is_relayed_whole_up_to_ready(cut: int) -> None:
    upstream, client, transport, done = relay()
    upstream.start_relay(client, lambda error, last: done.append((error, last)))
    data = REPLY + READY_T + NOTIFY  # the notification comes after the reply ends
    upstream.on_data(data[:cut])
    assert bool(done) == (cut == len(REPLY + READY_T))
    upstream.on_data(data[cut:])
    assert done == [(None, ord("Z"))]
    assert bytes(transport.written) == REPLY + READY_T
    assert upstream.status is TransactionStatus.IN_TRANSACTION
    # the notification waits for the next relay and goes out with its reply
    upstream.start_relay(client, lambda error, last: done.append((error, last)))
    upstream.on_data(message(b"Z", b"I"))
    assert bytes(transport.written) == REPLY + READY_T + NOTIFY + message(b"Z", b"I")
    assert upstream.status is TransactionStatus.IDLE and len(done) == 2


def test_a_whole_reply_in_one_chunk_is_written_as_it_came() -> None:
    upstream, client, transport, done = relay()
    upstream.start_relay(client, lambda error, last: done.append((error, last)))
    chunk = REPLY + message(b"Z", b"I")
    upstream.on_data(chunk)
    assert transport.writes == [chunk] and transport.writes[0] is chunk  # no copy
    assert done == [(None, ord("Z"))]


def test_copy_in_response_stops_the_relay() -> None:
    upstream, client, transport, done = relay()
    upstream.start_relay(client, lambda error, last: done.append((error, last)))
    copy_in = message(b"G", b"\x00\x00\x00")
    upstream.on_data(copy_in + NOTIFY)
    assert done == [(None, ord("G"))] and bytes(transport.written) == copy_in


@pytest.mark.parametrize(
    "bad",
    [message(b"Z", b"X"), b"D\x00\x00\x00\x02", REPLY + b"C\x00\x00\x00\x00"],
    ids=["unknown status", "short length", "short length after messages"],
)
def test_malformed_backend_bytes_end_the_relay_with_an_error(bad: bytes) -> None:
    upstream, client, transport, done = relay()
    upstream.start_relay(client, lambda error, last: done.append((error, last)))
    upstream.on_data(bad)
    assert len(done) == 1 and isinstance(done[0][0], ConnectionFailure)
    assert "PostgreSQL backend sent" in str(done[0][0])


def test_bytes_before_a_relay_wait_in_the_buffer() -> None:
    upstream, client, transport, done = relay()
    upstream.on_data(NOTIFY + REPLY[:3])
    assert not transport.written
    upstream.start_relay(client, lambda error, last: done.append((error, last)))
    assert bytes(transport.written) == NOTIFY and not done
    upstream.on_data(REPLY[3:] + message(b"Z", b"I"))
    assert bytes(transport.written) == NOTIFY + REPLY + message(b"Z", b"I")
    assert done == [(None, ord("Z"))]
