"""Bytes that real software produced decode correctly, and our encodings reproduce them.

Sources: the layouts in the protocol documentation, streams sent by libpq (through psycopg)
and asyncpg to a fake server, and a PostgreSQL 16.2 server's replies (tests/wire/data).
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from proxy.wire import (
    FRONTEND_LIMITS,
    AuthenticationMD5Password,
    AuthenticationOk,
    AuthenticationSASL,
    AuthenticationSASLContinue,
    AuthenticationSASLFinal,
    AuthResponse,
    BackendKeyData,
    BackendMessage,
    Bind,
    BindComplete,
    CancelRequest,
    CloseComplete,
    CommandComplete,
    CopyData,
    CopyDone,
    CopyInResponse,
    CopyOutResponse,
    DataRow,
    Describe,
    EmptyQueryResponse,
    ErrorResponse,
    Execute,
    FieldDescription,
    Flush,
    FrontendMessage,
    GSSENCRequest,
    Message,
    MessageBuffer,
    NegotiateProtocolVersion,
    NoData,
    NoticeResponse,
    ParameterDescription,
    ParameterStatus,
    Parse,
    ParseComplete,
    PasswordMessage,
    PortalSuspended,
    Query,
    RawMessage,
    ReadyForQuery,
    RowDescription,
    SSLRequest,
    StartupMessage,
    Sync,
    Target,
    Terminate,
    TransactionStatus,
    decode_backend,
    decode_frontend,
    decode_startup,
)
from proxy.wire.types import Oid, decode_value

DATA = Path(__file__).parent / "data"

# Layouts from "Message Formats" in the PostgreSQL documentation, written out byte by byte.
DOCUMENTED = [
    ("510000000d53454c454354203100", Query("SELECT 1")),
    ("5300000004", Sync()),
    ("4800000004", Flush()),
    ("5800000004", Terminate()),
    ("45000000090000000000", Execute("", 0)),
    ("44000000065000", Describe(Target.PORTAL, "")),
    ("520000000800000000", AuthenticationOk()),
    ("520000000c0000000501020304", AuthenticationMD5Password(b"\x01\x02\x03\x04")),
    ("5a0000000549", ReadyForQuery(TransactionStatus.IDLE)),
    ("5a0000000545", ReadyForQuery(TransactionStatus.FAILED)),
    ("3100000004", ParseComplete()),
    ("3200000004", BindComplete()),
    ("3300000004", CloseComplete()),
    ("6e00000004", NoData()),
    ("7300000004", PortalSuspended()),
    ("4900000004", EmptyQueryResponse()),
    ("430000000d53454c454354203100", CommandComplete("SELECT 1")),
    ("440000000b00010000000131", DataRow((b"1",))),
    ("440000000a0001ffffffff", DataRow((None,))),
    (
        "54 00000021 0001 3f636f6c756d6e3f00 00000000 0000 00000017 0004 ffffffff 0000",
        RowDescription((FieldDescription("?column?", 0, 0, 23, 4, -1, 0),)),
    ),
    ("4b0000000c000004d2deadbeef", BackendKeyData(1234, bytes.fromhex("deadbeef"))),
]


@pytest.mark.parametrize(("hex_bytes", "message"), DOCUMENTED)
def test_documented_layouts(hex_bytes: str, message: Message) -> None:
    """Each message encodes to exactly the documented bytes and decodes back."""
    data = bytes.fromhex(hex_bytes)
    assert message.encode() == data
    raw = RawMessage(data[:1], data[5:])
    decode = decode_frontend if isinstance(message, FrontendMessage) else decode_backend
    assert decode(raw) == message


@pytest.mark.parametrize(
    ("hex_bytes", "packet"),
    [
        ("0000000804d2162f", SSLRequest()),
        ("0000000804d21630", GSSENCRequest()),
        ("0000001004d2162e000004d2deadbeef", CancelRequest(1234, bytes.fromhex("deadbeef"))),
        ("00000012000300007573657200616e6e0000", StartupMessage({"user": "ann"})),
    ],
)
def test_documented_startup_packets(hex_bytes: str, packet: SSLRequest | StartupMessage) -> None:
    """The special request codes 1234.5679, 1234.5680 and 1234.5678, and a StartupMessage."""
    data = bytes.fromhex(hex_bytes)
    assert packet.encode() == data
    assert decode_startup(data[4:]) == packet


def read_stream(data: bytes) -> tuple[list[object], list[FrontendMessage]]:
    """Split a client's byte stream into startup packets and typed messages."""
    buffer = MessageBuffer(limits=FRONTEND_LIMITS)
    buffer.feed(data)
    packets: list[object] = []
    while not packets or not isinstance(packets[-1], StartupMessage):
        payload = buffer.take_startup()
        assert payload is not None
        packets.append(decode_startup(payload))
    messages = []
    while (raw := buffer.take_message()) is not None:
        messages.append(decode_frontend(raw))
    assert buffer.pending == 0
    return packets, messages


def _clients() -> dict[str, str]:
    return json.loads((DATA / "clients.json").read_text())  # type: ignore[no-any-return]


def test_libpq_stream() -> None:
    """Psycopg on libpq 18: SSLRequest, StartupMessage with options, password, both protocols."""
    packets, messages = read_stream(bytes.fromhex(_clients()["libpq"]))
    assert packets == [
        SSLRequest(),
        StartupMessage(
            {"user": "ann", "database": "db", "options": "-c dp.x=1", "application_name": "chk"}
        ),
    ]
    password, *rest = messages
    assert isinstance(password, AuthResponse)
    assert password.as_password() == PasswordMessage("pw")
    float_2_5 = bytes.fromhex("4004000000000000")
    float_1e300 = bytes.fromhex("7e37e43c8800759c")
    extended = [Describe(Target.PORTAL, ""), Execute("", 0), Sync()]
    assert rest == [
        Query("SELECT x"),
        Parse("", "SELECT $1, $2", (Oid.NUMERIC, Oid.FLOAT8)),
        Bind("", "", (0, 1), (b"-12.50", float_2_5), (0,)),
        *extended,
        Parse("", "SELECT $1, $2, $3, $4", (Oid.NUMERIC, Oid.FLOAT8, 0, Oid.BOOL)),
        Bind("", "", (0, 1, 0, 1), (b"0.00001", float_1e300, b"txt", b"\x01"), (1,)),
        *extended,
        Terminate(),
    ]
    assert decode_value(float_1e300, Oid.FLOAT8, 1) == 1e300


def test_asyncpg_stream() -> None:
    """asyncpg: SCRAM exchange, then a named prepared statement with binary parameters."""
    packets, messages = read_stream(bytes.fromhex(_clients()["asyncpg"]))
    assert packets == [
        StartupMessage({"client_encoding": "'utf-8'", "user": "ann", "database": "db"})
    ]
    first, final, *rest = messages
    assert isinstance(first, AuthResponse) and isinstance(final, AuthResponse)
    initial = first.as_sasl_initial_response()
    assert initial.mechanism == "SCRAM-SHA-256"
    assert initial.data is not None and initial.data.startswith(b"n,,n=ann,r=")
    assert final.as_sasl_response().data.startswith(b"c=biws,r=")
    statement = "__asyncpg_stmt_1__"
    assert rest[:3] == [
        Parse(statement, "SELECT $1::numeric, $2::float8", ()),
        Describe(Target.STATEMENT, statement),
        Flush(),
    ]
    bind = rest[3]
    assert isinstance(bind, Bind) and bind.param_formats == (1, 1)
    assert decode_value(bind.params[0], Oid.NUMERIC, 1) == Decimal("-1.5")
    assert decode_value(bind.params[1], Oid.FLOAT8, 1) == 1e-5
    assert rest[4:] == [Execute("", 0), Sync(), Terminate()]


def _session() -> dict[str, list[str]]:
    return json.loads((DATA / "pg16_session.json").read_text())  # type: ignore[no-any-return]


def replay(chunks: list[str]) -> list[BackendMessage]:
    """Decode a recorded server stream chunk by chunk, checking bytes survive re-encoding."""
    buffer = MessageBuffer()
    messages: list[BackendMessage] = []
    for chunk in chunks:
        buffer.feed(bytes.fromhex(chunk))
        while (raw := buffer.take_message()) is not None:
            message = decode_backend(raw)
            assert (
                message.encode()
                == raw.type + (len(raw.payload) + 4).to_bytes(4, "big") + raw.payload
            )
            messages.append(message)
    assert buffer.pending == 0
    return messages


def _kinds(messages: list[BackendMessage]) -> list[str]:
    return [type(message).__name__ for message in messages]


def test_postgres_session_authentication() -> None:
    """PostgreSQL's SCRAM exchange and session start decode as expected."""
    messages = replay(_session()["received"])
    assert messages[0] == AuthenticationSASL(("SCRAM-SHA-256",))
    assert isinstance(messages[1], AuthenticationSASLContinue)
    assert isinstance(messages[2], AuthenticationSASLFinal)
    assert messages[2].data.startswith(b"v=")
    assert messages[3] == AuthenticationOk()
    start = messages[: messages.index(ReadyForQuery()) + 1]
    assert ParameterStatus("server_version", "16.2") in start
    assert ParameterStatus("client_encoding", "UTF8") in start
    assert _kinds(start)[-2:] == ["BackendKeyData", "ReadyForQuery"]


def test_postgres_session_simple_protocol() -> None:
    """Rows, an error with position, an empty query, a notice, COPY in and out."""
    messages = replay(_session()["received"])
    row_description = next(m for m in messages if isinstance(m, RowDescription))
    types = [field.type_oid for field in row_description.fields]
    assert types == [Oid.INT8, Oid.FLOAT8, Oid.NUMERIC, Oid.TEXT, Oid.BOOL]
    row = next(m for m in messages if isinstance(m, DataRow))
    assert [decode_value(v, t) for v, t in zip(row.values, types, strict=True)] == [
        1, 0.1, Decimal("-1.5"), "hé", True
    ]  # fmt: skip
    error = next(m for m in messages if isinstance(m, ErrorResponse))
    assert (error.sqlstate, error.message, error.fields["P"]) == (
        "42703", 'column "nope" does not exist', "8"
    )  # fmt: skip
    assert EmptyQueryResponse() in messages
    notice = next(m for m in messages if isinstance(m, NoticeResponse))
    assert (notice.fields["S"], notice.message) == ("NOTICE", "hi")
    assert CopyInResponse(0, (0, 0)) in messages
    out = messages.index(CopyOutResponse(0, (0, 0)))
    assert messages[out + 1 : out + 4] == [
        CopyData(b"1\tone\n"), CopyData(b"2\t\\N\n"), CopyDone()
    ]  # fmt: skip


def test_postgres_session_extended_protocol() -> None:
    """Describe, binary rows split by a row limit, NoData and Close, as PostgreSQL sends them."""
    messages = replay(_session()["received"])
    assert ParameterDescription((Oid.INT4,)) in messages
    suspended = messages.index(PortalSuspended())
    first, second = messages[suspended - 1], messages[suspended + 1]
    assert isinstance(first, DataRow) and isinstance(second, DataRow)
    decoded = [
        (decode_value(r.values[0], Oid.NUMERIC, 1), decode_value(r.values[1], Oid.FLOAT8, 1))
        for r in (first, second)
    ]
    assert decoded == [(Decimal(1), 1 / 3), (Decimal(2), 2 / 3)]
    tail = _kinds(messages[-6:])
    assert tail == [
        "ParseComplete", "BindComplete", "NoData", "CommandComplete", "CloseComplete",
        "ReadyForQuery",
    ]  # fmt: skip


def test_postgres_session_client_side() -> None:
    """What our encoder sent PostgreSQL decodes back to a sensible conversation."""
    packets, messages = read_stream(bytes.fromhex("".join(_session()["sent"])))
    assert packets == [StartupMessage({"user": "ann", "database": "postgres"})]
    assert Execute("p1", 1) in messages and messages[-1] == Terminate()


def test_postgres_negotiates_protocol_version() -> None:
    """Asked for 3.9 and an unknown option, PostgreSQL answers with its full version number."""
    packets, _ = read_stream(bytes.fromhex("".join(_session()["negotiate_sent"])))
    assert isinstance(packets[0], StartupMessage)
    assert (packets[0].minor, packets[0].protocol_options) == (9, ("_pq_.dpproxy_test",))
    messages = replay(_session()["negotiate_received"])
    assert messages[0] == NegotiateProtocolVersion(3 << 16, ("_pq_.dpproxy_test",))
    assert messages[1] == AuthenticationOk()
