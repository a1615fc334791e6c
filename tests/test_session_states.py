"""A session's states driven with bytes in and bytes out, without sockets (issue 11, item 3).

The client and the backend are in-memory transports: the test writes what a client or the
PostgreSQL backend would send and reads what the session wrote to each, and checks the state
after every step. Everything else is real: the router, the memo, the SCRAM exchange, the codec.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from scramp import ScramClient

from proxy.auth import make_verifier, parse_verifier
from proxy.config import load_config
from proxy.dp.answering import DpService
from proxy.dp.memo import DpMemo
from proxy.dp.routing import Router
from proxy.server.address import UpstreamAddress
from proxy.server.connection import Connection
from proxy.server.context import SessionContext
from proxy.server.session import Session
from proxy.server.states import NEXT, State
from proxy.server.upstream import Upstream
from proxy.storage.reader import Reader
from proxy.wire import (
    AuthResponse,
    Bind,
    CommandComplete,
    CopyData,
    CopyDone,
    CopyInResponse,
    ErrorResponse,
    Execute,
    Message,
    MessageBuffer,
    Parse,
    Query,
    ReadyForQuery,
    StartupMessage,
    Sync,
    TransactionStatus,
    decode_backend,
)
from proxy.wire.startup import SSLRequest

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
PASSWORD = "s3cret"
# nothing listens here: the login to the backend fails without opening a socket
NOWHERE = UpstreamAddress("/nonexistent-dpproxy-test", 5432, "pt", None, "analysts")


class MemoryTransport:
    """One end of a connection in memory: keeps what is written."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes | bytearray) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def take(self) -> list[Message]:
        """The messages written since the last take, decoded."""
        buffer = MessageBuffer()
        buffer.feed(self.written)
        self.written.clear()
        messages = []
        while (raw := buffer.take_message()) is not None:
            messages.append(decode_backend(raw))
        assert buffer.pending == 0
        return messages


def connection() -> tuple[Connection, MemoryTransport]:
    transport = MemoryTransport()
    conn = Connection()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def encode(*messages: Message) -> bytes:
    return b"".join(m.encode() for m in messages)


def kinds(messages: list[Message]) -> list[str]:
    return [type(m).__name__ for m in messages]


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def context(upstream: UpstreamAddress = NOWHERE) -> SessionContext:
    router = Router(CONFIG.translator(), CONFIG.cubes)
    # no DP query is answered here: the service's reader is never asked
    service = DpService(CONFIG.cubes, Reader.__new__(Reader))
    return SessionContext(
        router=router,
        translator=CONFIG.translator(),
        service=service,
        memo=DpMemo(router, service),
        defaults=CONFIG.privacy.defaults,
        upstream=upstream,
        users={"alice": parse_verifier(make_verifier(PASSWORD, iterations=4096))},
        database="analysts",
    )


async def settle(until: Callable[[], bool] | None = None) -> None:
    """Let the session's task and callbacks run until they wait on something.

    Routing runs in a worker thread: a step that waits for it names the state it ends in.
    """
    for _ in range(20):
        await asyncio.sleep(0)
    async with asyncio.timeout(10):
        while until is not None and not until():
            await asyncio.sleep(0.001)


def run(loop: asyncio.AbstractEventLoop, test: Callable[[], Awaitable[None]]) -> None:
    loop.run_until_complete(asyncio.wait_for(test(), 30))


# -- the handshake ------------------------------------------------------------------------


def test_startup_scram_then_a_failed_backend_login(loop: asyncio.AbstractEventLoop) -> None:
    async def test() -> None:
        conn, client = connection()
        session = Session(context(), conn)
        task = asyncio.ensure_future(session.run())
        await settle()
        assert session.state is State.STARTUP
        conn.data_received(SSLRequest().encode())
        await settle()
        assert bytes(client.written) == b"N" and session.state is State.STARTUP
        client.written.clear()
        startup = {"user": "alice", "database": "analysts", "options": "-c dp.confidence=0.9"}
        conn.data_received(StartupMessage(startup).encode())
        await settle()
        assert session.state is State.AUTHENTICATING and session.user == "alice"
        assert kinds(client.take()) == ["AuthenticationSASL"]
        scram = ScramClient(["SCRAM-SHA-256"], "alice", PASSWORD)
        first = scram.get_client_first().encode()
        initial = b"SCRAM-SHA-256\x00" + len(first).to_bytes(4, "big") + first
        conn.data_received(AuthResponse(initial).encode())
        await settle()
        (server_first,) = client.take()
        scram.set_server_first(server_first.data.decode())  # type: ignore[attr-defined]
        conn.data_received(AuthResponse(scram.get_client_final().encode()).encode())
        await task  # CONNECTING fails: nothing listens at NOWHERE
        messages = client.take()
        assert kinds(messages) == ["AuthenticationSASLFinal", "AuthenticationOk", "ErrorResponse"]
        error = messages[-1]
        assert isinstance(error, ErrorResponse)
        assert error.fields["S"] == "FATAL" and error.sqlstate == "08006"
        assert session.state is State.CLOSED and client.closed
        assert session.settings.confidence is not None

    run(loop, test)


def test_a_wrong_password_ends_in_closed(loop: asyncio.AbstractEventLoop) -> None:
    async def test() -> None:
        conn, client = connection()
        session = Session(context(), conn)
        task = asyncio.ensure_future(session.run())
        conn.data_received(StartupMessage({"user": "alice", "database": "analysts"}).encode())
        await settle()
        client.take()
        scram = ScramClient(["SCRAM-SHA-256"], "alice", "wrong")
        first = scram.get_client_first().encode()
        initial = b"SCRAM-SHA-256\x00" + len(first).to_bytes(4, "big") + first
        conn.data_received(AuthResponse(initial).encode())
        await settle()
        (server_first,) = client.take()
        scram.set_server_first(server_first.data.decode())  # type: ignore[attr-defined]
        conn.data_received(AuthResponse(scram.get_client_final().encode()).encode())
        await task
        (error,) = client.take()
        assert isinstance(error, ErrorResponse) and error.sqlstate == "28P01"
        assert session.state is State.CLOSED

    run(loop, test)


# -- after the handshake: a session with an in-memory backend ---------------------------


class Connected:
    """A session past its handshake, its client and its backend both in memory."""

    def __init__(self) -> None:
        self.conn, self.client = connection()
        backend_conn, self.backend = connection()
        self.upstream = Upstream(NOWHERE, backend_conn)
        self.session = Session(context(), self.conn)
        # what the handshake does, through the same interface
        self.session.identify("alice")
        self.session.enter(State.AUTHENTICATING)
        self.session.enter(State.CONNECTING)
        self.session.connected(self.upstream)
        self.session.enter(State.READY)
        self.task = asyncio.ensure_future(self.session._loop())

    def from_client(self, *messages: Message) -> None:
        self.conn.data_received(encode(*messages))

    def from_backend(self, *messages: Message) -> None:
        self.upstream.on_data(encode(*messages))

    def to_backend(self) -> bytes:
        sent = bytes(self.backend.written)
        self.backend.written.clear()
        return sent


Scenario = Callable[["Connected"], Awaitable[None]]


def drive(loop: asyncio.AbstractEventLoop, scenario: Scenario) -> None:
    """Run ``scenario`` on a connected session that has settled (IDLE), then stop its task."""

    async def test() -> None:
        s = Connected()
        await settle()
        assert s.session.state is State.IDLE
        try:
            await scenario(s)
        finally:
            s.task.cancel()

    run(loop, test)


def test_the_fast_relay_goes_idle_relaying_idle(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario(s: Connected) -> None:
        s.from_client(Query("SELECT 1"))
        assert s.session.state is State.RELAYING  # sent from the callback, the task asleep
        assert s.to_backend() == Query("SELECT 1").encode()
        s.from_backend(CommandComplete("SELECT 1"), ReadyForQuery(TransactionStatus.IN_TRANSACTION))
        assert s.session.state is State.IDLE
        assert kinds(s.client.take()) == ["CommandComplete", "ReadyForQuery"]
        assert s.session.status is TransactionStatus.IN_TRANSACTION
        s.from_client(Query("SELECT 2"), Query("SELECT 3"))  # pipelined: one at a time
        assert s.to_backend() == Query("SELECT 2").encode()
        s.from_backend(CommandComplete("SELECT 1"), ReadyForQuery(TransactionStatus.IDLE))
        assert s.to_backend() == Query("SELECT 3").encode()
        assert s.session.state is State.RELAYING

    drive(loop, scenario)


def test_copy_from_stdin_hands_the_relay_to_the_task(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario(s: Connected) -> None:
        s.from_client(Query("COPY t FROM STDIN"))
        s.to_backend()
        s.from_backend(CopyInResponse(0, (0,)))
        assert s.session.state is State.COPY_IN
        assert kinds(s.client.take()) == ["CopyInResponse"]
        s.from_client(CopyData(b"1\n"))
        await settle()
        assert s.session.state is State.COPY_IN
        assert s.to_backend() == CopyData(b"1\n").encode()
        s.from_client(Sync(), CopyDone())  # Sync is ignored during COPY
        await settle()
        assert s.session.state is State.READY  # the task relays the rest of the reply
        assert s.to_backend() == CopyDone().encode()
        s.from_backend(CommandComplete("COPY 1"), ReadyForQuery(TransactionStatus.IDLE))
        await settle()
        assert kinds(s.client.take()) == ["CommandComplete", "ReadyForQuery"]
        assert s.session.state is State.IDLE

    drive(loop, scenario)


def test_an_extended_error_discards_until_sync(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario(s: Connected) -> None:
        s.from_client(Parse("", "SELECT age FROM adult"))  # refused before anything runs
        await settle(until=lambda: s.session.state is State.EXTENDED_ERROR)
        assert s.session.state is State.EXTENDED_ERROR
        s.from_client(Bind("", ""), Execute(""))
        await settle()
        assert s.session.state is State.EXTENDED_ERROR
        s.from_client(Sync())
        await settle(until=lambda: s.session.state is State.IDLE)
        messages = s.client.take()
        assert kinds(messages) == ["ErrorResponse", "ReadyForQuery"]
        assert isinstance(messages[0], ErrorResponse) and messages[0].sqlstate == "42501"
        assert s.to_backend() == b""  # the backend saw none of it
        assert s.session.state is State.IDLE

    drive(loop, scenario)


def test_an_error_from_the_backend_in_a_batch(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario(s: Connected) -> None:
        s.from_client(Parse("", "SELECT nonsense"), Sync())
        await settle()
        assert s.to_backend() == Parse("", "SELECT nonsense").encode() + Sync().encode()
        assert s.session.state is State.READY  # the task relays the batch's reply
        s.from_backend(ErrorResponse({"S": "ERROR", "C": "42703", "M": "no such column"}))
        await settle()
        assert s.session.state is State.EXTENDED_ERROR
        s.from_backend(ReadyForQuery(TransactionStatus.IDLE))
        await settle()
        assert kinds(s.client.take()) == ["ErrorResponse", "ReadyForQuery"]
        assert s.session.state is State.IDLE

    drive(loop, scenario)


def test_shutdown_closes_an_idle_session_at_once(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario(s: Connected) -> None:
        s.session.request_shutdown()
        assert s.session.state is State.CLOSED and s.client.closed
        (error,) = s.client.take()
        assert isinstance(error, ErrorResponse) and error.sqlstate == "57P01"

    drive(loop, scenario)


def test_terminate_closes(loop: asyncio.AbstractEventLoop) -> None:
    async def scenario(s: Connected) -> None:
        s.from_client(Query("SHOW dp.confidence"))
        await settle(until=lambda: s.session.state is State.IDLE)
        assert kinds(s.client.take()) == [
            "RowDescription",
            "DataRow",
            "CommandComplete",
            "ReadyForQuery",
        ]
        s.conn.data_received(b"X\x00\x00\x00\x04")
        await s.task
        assert s.session.state is State.CLOSED

    drive(loop, scenario)


def test_every_move_goes_through_enter_and_the_table(loop: asyncio.AbstractEventLoop) -> None:
    assert set(NEXT) == set(State)
    conn, _ = connection()
    session = Session(context(), conn)
    with pytest.raises(RuntimeError, match="from STARTUP to READY"):
        session.enter(State.READY)
    session.enter(State.CLOSED)
    session.enter(State.READY)  # CLOSED is final: a late step moves nothing
    assert session.state is State.CLOSED
