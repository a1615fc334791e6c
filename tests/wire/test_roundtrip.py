"""Every message type survives encode, framing in arbitrary chunks, and decode unchanged."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.wire import (
    FRONTEND_LIMITS,
    AuthResponse,
    BackendMessage,
    FrontendMessage,
    MessageBuffer,
    PasswordMessage,
    RawMessage,
    SASLInitialResponse,
    SASLResponse,
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

from .strategies import (
    backend_messages,
    frontend_messages,
    password_messages,
    startup_packets,
)


def take_all(buffer: MessageBuffer) -> list[RawMessage]:
    """Every whole message the buffer holds."""
    taken = []
    while (raw := buffer.take_message()) is not None:
        taken.append(raw)
    return taken


def feed_in_chunks(buffer: MessageBuffer, data: bytes, cuts: list[int]) -> list[RawMessage]:
    """Feed `data` split at `cuts`, taking messages after every chunk."""
    taken: list[RawMessage] = []
    edges = [0, *sorted(cut % (len(data) + 1) for cut in cuts), len(data)]
    for start, end in zip(edges, edges[1:], strict=False):
        buffer.feed(data[start:end])
        taken += take_all(buffer)
    return taken


@settings(deadline=None)
@given(st.lists(frontend_messages, max_size=8), st.lists(st.integers(0, 10**6), max_size=6))
def test_frontend_stream_round_trips(messages: list[FrontendMessage], cuts: list[int]) -> None:
    """A stream of frontend messages, cut anywhere, decodes to the same messages."""
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    raws = feed_in_chunks(buffer, encode_all(messages), cuts)
    assert [decode_frontend(raw) for raw in raws] == messages
    assert buffer.pending == 0


@settings(deadline=None)
@given(st.lists(backend_messages, max_size=8), st.lists(st.integers(0, 10**6), max_size=6))
def test_backend_stream_round_trips(messages: list[BackendMessage], cuts: list[int]) -> None:
    """A stream of backend messages, cut anywhere, decodes to the same messages."""
    raws = feed_in_chunks(MessageBuffer(), encode_all(messages), cuts)
    assert [decode_backend(raw) for raw in raws] == messages


@settings(deadline=None)
@given(backend_messages)
def test_backend_encoding_is_canonical(message: object) -> None:
    """Re-encoding a decoded message gives back the very same bytes."""
    data = message.encode()  # type: ignore[attr-defined]
    assert decode_backend(RawMessage(data[:1], data[5:])).encode() == data


@settings(deadline=None)
@given(startup_packets, st.integers(0, 64))
def test_startup_packets_round_trip(packet: object, cut: int) -> None:
    """Startup-phase packets frame without a type byte and decode unchanged."""
    data = packet.encode()  # type: ignore[attr-defined]
    buffer = MessageBuffer()
    buffer.feed(data[:cut])
    if cut < len(data):
        assert buffer.take_startup() is None
        buffer.feed(data[cut:])
    payload = buffer.take_startup()
    assert payload is not None
    assert decode_startup(payload) == packet
    assert buffer.pending == 0


_DECODERS = {
    PasswordMessage: (decode_password, AuthResponse.as_password),
    SASLInitialResponse: (decode_sasl_initial_response, AuthResponse.as_sasl_initial_response),
    SASLResponse: (decode_sasl_response, AuthResponse.as_sasl_response),
}


@settings(deadline=None)
@given(password_messages)
def test_password_forms_round_trip(
    message: PasswordMessage | SASLInitialResponse | SASLResponse,
) -> None:
    """Each ``p`` layout decodes back through its function and through AuthResponse."""
    data = message.encode()
    raw = RawMessage(data[:1], data[5:])
    function, method = _DECODERS[type(message)]
    response = decode_frontend(raw)
    assert isinstance(response, AuthResponse)
    assert function(raw.payload) == message
    assert method(response) == message


@settings(max_examples=25, deadline=None)
@given(st.lists(frontend_messages, min_size=1, max_size=3))
def test_one_byte_at_a_time(messages: list[FrontendMessage]) -> None:
    """Feeding single bytes yields nothing until each message's last byte arrives."""
    data = encode_all(messages)
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    boundaries, offset = set(), 0
    for message in messages:
        offset += len(message.encode())
        boundaries.add(offset)
    taken = []
    for index in range(len(data)):
        buffer.feed(data[index : index + 1])
        raw = buffer.take_message()
        assert (raw is not None) == (index + 1 in boundaries)
        taken += [raw] if raw else []
    assert [decode_frontend(raw) for raw in taken] == messages
