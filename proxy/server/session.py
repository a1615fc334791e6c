"""One client session: its states, its client connection, the fast relay and the query loop.

A session is one asyncio task that moves through the named states of `proxy.server.states`,
each with one handler, every move through `Session.enter`. The start-up and SCRAM are
`proxy.server.handshake`; statements are routed before anything runs (`proxy.dp.routing`): DP
queries and ``dp.*`` settings are answered by `proxy.server.answers`, everything else relayed to
the session's own pass-through connection (`proxy.server.upstream`) by the one relay loop,
`Session.relay`. The extended query protocol lives in `proxy.server.extended`; handshake and
extended see the session through the narrow interfaces they declare (`Handshaking`,
`ExtendedHost`).

Over ~400 lines because the fast relay (IDLE, RELAYING), the task's loop and the simple
protocol share the client buffer, the handoff and the state: split, each part would reach into
the others' fields.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Final

from proxy.dp.results import TEXT_ONLY, data_rows, notices, row_description
from proxy.dp.routing import Route, Statement
from proxy.dp.settings import DpSettings
from proxy.errors import (
    AdminShutdown,
    ConnectionFailure,
    DpproxyError,
    InFailedTransaction,
    InvalidAuthorization,
    ProgramLimitExceeded,
    ProtocolViolation,
    UnsupportedQuery,
)
from proxy.logs import event
from proxy.server.answers import LocalAnswers
from proxy.server.connection import Connection
from proxy.server.context import CancelKey, SessionContext
from proxy.server.extended import ExtendedProtocol, relocated_error
from proxy.server.handshake import handshake
from proxy.server.states import NEXT, Fatal, State
from proxy.server.upstream import Action, Decide, Replace, Upstream
from proxy.wire import (
    FRONTEND_LIMITS,
    CommandComplete,
    ErrorResponse,
    Message,
    MessageBuffer,
    Query,
    RawMessage,
    ReadyForQuery,
    TransactionStatus,
    decode_frontend,
    encode_all,
)
from proxy.wire.framing import (
    COPY_DATA,
    COPY_IN_RESPONSE,
    ERROR_RESPONSE,
    QUERY,
    READY_FOR_QUERY,
    one_frame,
    reframe,
)

__all__ = ["Session", "AUTH_TIMEOUT"]

#: Buffered client bytes past which a busy session stops reading its client.
_BUFFER_LIMIT: Final = 1 << 20
#: Messages a session handles in a row before it lets the other sessions run.
_BURST: Final = 16
#: How long a client may take from connecting to being authenticated (PostgreSQL's
#: authentication_timeout).
AUTH_TIMEOUT: Final = 60.0
_SHUTDOWN: Final = "terminating connection due to administrator command"


class Session:
    """One client connection, from its first byte to its close.

    Args:
        ctx: the server's shared state.
        conn: the client's connection.
    """

    def __init__(self, ctx: SessionContext, conn: Connection) -> None:
        self.ctx = ctx
        self.conn = conn
        self._state = State.STARTUP
        # a statement over the limit is dropped as it arrives, then refused (54000)
        statement = ctx.limits.max_statement_bytes + 4  # the length word counts itself
        self.buffer = MessageBuffer(
            limits=FRONTEND_LIMITS, oversize={b"Q": statement, b"P": statement}
        )
        self._whole_limit = statement + 1  # the longest Query `_relay_whole` takes
        self._user = ""
        self.answers = LocalAnswers(ctx)
        self.upstream: Upstream | None = None
        self._key: CancelKey | None = None
        self._peer = str(conn.get_extra_info("peername") or "unix")
        self._out = bytearray()
        # what the client did that the task must see
        self._waiter: asyncio.Future[None] | None = None
        self._fed = 0
        self._eof = False
        self._shutdown = False
        self._wanting = False  # the task waits in `fill` for client bytes
        # IDLE and RELAYING: what the callbacks hand the task (the first message they may not
        # relay, or the failure that stopped them); `_pumping` guards `_pump` against itself
        self._handoff: RawMessage | Exception | None = None
        self._pumping = False
        self.extended = ExtendedProtocol(self)
        self._handlers: dict[State, Callable[[RawMessage], Awaitable[None]]] = {
            State.READY: self._on_ready,
            State.EXTENDED_ERROR: self._on_extended_error,
            State.COPY_IN: self._on_copy_in,
        }
        conn.attach(self)

    # -- state ------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        """Where the session is; `enter` moves it."""
        return self._state

    def enter(self, state: State) -> None:
        """Move to ``state``: the one place the state changes.

        CLOSED is final: a step still under way when a shutdown closed the session moves
        nothing.

        Raises:
            RuntimeError: `proxy.server.states.NEXT` does not allow the move (a bug).
        """
        current = self._state
        if state is current or current is State.CLOSED:
            return
        if state not in NEXT[current]:
            raise RuntimeError(f"a session cannot move from {current.name} to {state.name}")
        self._state = state

    @property
    def user(self) -> str:
        """The user the startup packet named ("" before)."""
        return self._user

    @property
    def peer(self) -> str:
        """The client's address, for the log."""
        return self._peer

    @property
    def key(self) -> CancelKey | None:
        """The BackendKeyData this session gave its client, once connected."""
        return self._key

    @property
    def tls(self) -> bool:
        """The client connection is encrypted."""
        return self.conn.get_extra_info("sslcontext") is not None

    # -- what the handshake hands over (`proxy.server.handshake.Handshaking`) ----------------

    def identify(self, user: str) -> None:
        """The startup packet named ``user``."""
        self._user = user

    def use_settings(self, settings: DpSettings) -> None:
        """Start with these ``dp.*`` settings."""
        self.answers = LocalAnswers(self.ctx, self._user, settings)

    @property
    def settings(self) -> DpSettings:
        """The session's ``dp.*`` settings now."""
        return self.answers.settings

    def connected(self, upstream: Upstream) -> CancelKey:
        """Keep the pass-through connection; register and return the session's cancel key."""
        self.upstream = upstream
        self._key = self.ctx.new_key()
        self.ctx.sessions[self._key.process_id] = self
        return self._key

    def write_now(self, data: bytes) -> None:
        """Write bytes to the client at once."""
        self.conn.write(data)

    async def start_tls(self, context: ssl.SSLContext) -> None:
        """Continue the client connection over TLS."""
        await self.conn.start_tls(context, server_side=True)

    def unread(self) -> int:
        """Client bytes received and not yet taken."""
        return self.buffer.pending

    async def read_startup(self) -> bytes | None:
        """The next startup packet's payload; None at end of stream."""
        while (payload := self.buffer.take_startup()) is None:
            if not await self.fill():
                return None
        return payload

    # -- life cycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes; never raises (errors end the session)."""
        try:
            await asyncio.wait_for(handshake(self), AUTH_TIMEOUT)
            if self._state is not State.CLOSED:
                await self._loop()
        except Fatal as fatal:
            self._send_fatal(fatal.error)
        except ConnectionFailure as e:
            self._send_fatal(e)
        except ProtocolViolation as e:  # framing lost
            self._send_fatal(e)
        except TimeoutError:
            self._send_fatal(InvalidAuthorization("canceling authentication due to timeout"))
        except (ConnectionError, ssl.SSLError):
            pass  # the client went away
        except asyncio.CancelledError:
            self._send_fatal(AdminShutdown(_SHUTDOWN))
            raise
        except Exception:
            logging.getLogger("dpproxy").exception(
                "session failed", extra={"fields": {"user": self._user}}
            )
            self._send_fatal(DpproxyError("internal error in dpproxy"))
        finally:
            self._close()

    def _close(self) -> None:
        if self._key is not None and self.ctx.sessions.get(self._key.process_id) is self:
            del self.ctx.sessions[self._key.process_id]
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        self.enter(State.CLOSED)  # a Terminate or a shutdown may have entered it already
        if self._user:
            event("session_closed", user=self._user, peer=self._peer)
        if not self.conn.is_closing():
            self.flush_client()
            self.conn.close()

    def _send_fatal(self, error: DpproxyError) -> None:
        if self.conn.is_closing():
            return
        self.send(ErrorResponse.from_error(error, "FATAL"))
        self.flush_client()
        if self._user or not isinstance(error, InvalidAuthorization):
            event(
                "session_fatal",
                logging.WARNING,
                user=self._user or None,
                peer=self._peer,
                sqlstate=error.sqlstate,
                message=error.message,
            )

    def request_shutdown(self) -> None:
        """Ask the session to close: now if it is idle, else after its current query cycle."""
        self._shutdown = True
        waiting_for_sync = self._state is State.EXTENDED_ERROR and self._wanting
        if waiting_for_sync or self._state in (State.IDLE, State.STARTUP, State.AUTHENTICATING):
            self._send_fatal(AdminShutdown(_SHUTDOWN))
            self.enter(State.CLOSED)
            self.conn.close()

    async def cancel(self) -> None:
        """Cancel what the session runs: a DP answer here, or the backend's statement."""
        event("cancel", user=self._user)
        if not self.answers.cancel() and self.upstream is not None:
            await self.upstream.cancel()

    # -- client I/O -------------------------------------------------------------------------

    def send(self, *messages: Message) -> None:
        """Queue messages for the client; `flush_client` writes them."""
        self._out += encode_all(messages)

    def flush_client(self) -> None:
        """Write the queued messages."""
        if self._out:
            self.conn.write(bytes(self._out))
            self._out.clear()

    async def relieve_output(self, limit: int) -> None:
        """Write the queued replies once they pass ``limit`` bytes; wait while the client lags."""
        if len(self._out) >= limit:
            self.flush_client()
            await self.conn.drain()

    # The connection's callbacks (see proxy.server.connection.Listener).

    def on_data(self, data: bytes) -> None:
        """Client bytes: into the buffer; relayed at once when IDLE, else the task is woken."""
        idle = self._state is State.IDLE
        if idle and self._relay_whole(data):
            return
        self.buffer.feed(data)
        self._fed += len(data)
        if idle:
            self._pump()
        else:
            self._wake()
        if (
            self.buffer.pending > _BUFFER_LIMIT
            and not self._wanting
            and self._state is not State.IDLE
        ):
            self.conn.pause_reading()  # busy: let the client wait rather than buffer without end

    def on_eof(self, error: Exception | None) -> None:
        """The client closed the connection (or it broke)."""
        self._eof = True
        self._wake()

    def on_writable(self, writable: bool) -> None:
        """The client fell behind reading (or caught up): hold the fast relay meanwhile."""
        if self._state is State.RELAYING and self.upstream is not None:
            self.upstream.pause(not writable)

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    async def fill(self) -> bool:
        """Wait for more client bytes; False at end of stream."""
        self.flush_client()
        await self.conn.drain()
        if self._eof:
            return False
        before = self._fed
        self.conn.resume_reading()
        self._wanting = True
        try:
            while self._fed == before and not self._eof:
                await self._wait()
        finally:
            self._wanting = False
        return self._fed > before

    # -- IDLE and RELAYING: the fast relay --------------------------------------------------

    async def _idle(self) -> None:
        """IDLE: wait, between query cycles, for a message the task must handle.

        Meanwhile plain pass-through queries are relayed by `_pump`, from the connections'
        callbacks (RELAYING while a reply is under way). The task wakes in READY with a
        message handed over, in COPY_IN if a relayed query began COPY FROM STDIN, at end of
        stream, on a shutdown, or to raise the failure that stopped the relay.
        """
        self.flush_client()
        await self.conn.drain()
        self.enter(State.IDLE)
        self._pump()
        while self._handoff is None and not self._eof:
            if self._state is State.IDLE and self._shutdown:
                break
            if self._state is not State.IDLE and self._state is not State.RELAYING:
                break
            await self._wait()
        if self._state is State.IDLE:
            self.enter(State.READY)
        if isinstance(self._handoff, Exception):
            error, self._handoff = self._handoff, None
            raise error

    def _pump(self) -> None:
        """Relay plain pass-through Query messages, one at a time, without the task.

        Any other message (or trouble) goes to the task.
        """
        if self._pumping:
            return  # a relay finished inside start_relay: the loop below goes on
        self._pumping = True
        try:
            while self._state is State.IDLE and self._handoff is None:
                if self._shutdown:
                    self._wake()
                    return
                raw = self.buffer.take_message()
                if raw is None:
                    self.conn.resume_reading()
                    if self._eof:
                        self._wake()
                    return
                if not self._plain_query(raw):
                    self._hand_over(raw)
                    return
                self._relay_query(reframe(raw))
        except Exception as e:  # ProtocolViolation, ConnectionFailure: the task reports it
            self._hand_over(e)
        finally:
            self._pumping = False

    def _hand_over(self, what: RawMessage | Exception) -> None:
        self._handoff = what
        self._wake()

    def _relay_whole(self, data: bytes) -> bool:
        """`_pump`'s common case, without the buffer: ``data`` is one whole plain Query.

        It must also be all there is: nothing buffered or handed over. Then it goes to the
        backend as it came (no copy); False leaves everything to `_pump`.
        """
        if self._handoff is not None or self.buffer.pending or self._shutdown:
            return False
        if len(data) > self._whole_limit or not one_frame(data, QUERY):
            return False
        if not self._plain_payload(data[5:]):
            return False
        self._fed += len(data)
        try:
            self._relay_query(data)
        except Exception as e:  # ConnectionFailure: the task reports it
            self._hand_over(e)
        return True

    def _relay_query(self, frame: bytes) -> None:
        """Send one plain Query and relay its reply from the connections' callbacks."""
        self.enter(State.RELAYING)
        self.up.send(frame)
        self.up.start_relay(self.conn, self._relayed)

    def _relayed(self, error: ConnectionFailure | None, last: int) -> None:
        """The fast relay of one query finished (or stopped for COPY FROM STDIN)."""
        if error is None and last == COPY_IN_RESPONSE:
            self.enter(State.COPY_IN)
            self._wake()
            return
        self.enter(State.IDLE)
        if error is not None:
            self._hand_over(error)
        else:
            self._pump()

    def _plain_query(self, raw: RawMessage) -> bool:
        """Whether the fast relay may take this message.

        It must be a Query, plainly pass-through, outside any extended batch, in a healthy
        session.
        """
        return raw.type == b"Q" and self._plain_payload(raw.payload)

    def _plain_payload(self, payload: bytes) -> bool:
        """`_plain_query` for a Query with this payload."""
        if self.upstream is None:
            return False
        if self.extended.pending or self.extended.batch_upstream or self.upstream.queued:
            return False
        if not payload.endswith(b"\x00") or payload.find(b"\x00") != len(payload) - 1:
            return False
        try:
            sql = payload[:-1].decode("utf-8")
        except UnicodeDecodeError:
            return False
        if not self.ctx.router.plainly_passthrough(sql):
            return False
        if self.extended.statements:
            self.extended.forget(sql)
        return True

    async def read_typed(self) -> RawMessage | None:
        """The next typed client message; None at end of stream."""
        while (raw := self.buffer.take_message()) is None:
            if not await self.fill():
                return None
        return raw

    # -- the query loop ---------------------------------------------------------------------

    def send_ready(self) -> None:
        """End a query cycle with ReadyForQuery, in the backend's transaction status."""
        self.send(ReadyForQuery(self.status))

    @property
    def status(self) -> TransactionStatus:
        """The transaction status, as the pass-through connection last reported it."""
        return self.upstream.status if self.upstream is not None else TransactionStatus.IDLE

    @property
    def up(self) -> Upstream:
        """The pass-through connection (present once the session is READY)."""
        assert self.upstream is not None
        return self.upstream

    async def _loop(self) -> None:
        burst = 0  # messages handled since the task last let other sessions run
        while self._state is not State.CLOSED:
            if self._state is State.COPY_IN:  # the fast relay met COPY FROM STDIN
                await self.copy_in()
                await self._relay_cycle(stop_at_ready=Action.RELAY_STOP)
                continue
            raw = self._take()
            if raw is None:
                if self._shutdown:
                    raise Fatal(AdminShutdown(_SHUTDOWN))
                if self._eof:
                    return
                if self._state is State.EXTENDED_ERROR:  # nothing is relayed before the Sync
                    await self.fill()
                    continue
                await self._idle()
                if self._state is State.RELAYING:  # the client left while a reply was relayed
                    return
                burst = 0
                continue
            await self._handlers[self._state](raw)
            burst += 1
            if burst == _BURST:
                # a pipeline of messages answered from memos never waits on anything: let
                # the other sessions' callbacks run in between
                burst = 0
                await asyncio.sleep(0)

    def _take(self) -> RawMessage | None:
        """The message the fast relay handed over, else the next buffered one."""
        handoff, self._handoff = self._handoff, None
        if isinstance(handoff, RawMessage):
            return handoff
        return self.buffer.take_message()

    async def _on_ready(self, raw: RawMessage) -> None:
        kind = raw.type
        if raw.oversized:
            await self._refuse_oversized(raw)
        elif kind == b"Q":
            await self._simple_query(raw)
        elif kind in b"PBDECSH":
            await self.extended.handle(raw)
        elif kind == b"X":
            self.enter(State.CLOSED)
        elif kind == b"F":
            self.error(UnsupportedQuery("fast-path function calls are not supported by dpproxy"))
            self.send_ready()
        elif kind in (b"d", b"c", b"f"):
            pass  # COPY messages outside COPY are ignored, as PostgreSQL does
        else:
            raise ProtocolViolation(f"unexpected message type {kind!r}")

    async def _refuse_oversized(self, raw: RawMessage) -> None:
        """A Query or Parse over ``limits.max_statement_bytes``: refused, never buffered."""
        limit = self.ctx.limits.max_statement_bytes
        error = ProgramLimitExceeded(
            f"statement of {raw.oversized - 4} bytes is over the limit of {limit} bytes",
            hint="send smaller statements (the DBA sets limits.max_statement_bytes)",
        )
        if raw.type == b"P":
            await self.extended.fail(error)
            return
        self.error(error)
        await self.poison_if_in_transaction()
        self.send_ready()

    async def _on_extended_error(self, raw: RawMessage) -> None:
        if raw.type == b"S":
            await self.extended.handle(raw)
        elif raw.type == b"X":
            self.enter(State.CLOSED)
        # anything else is discarded until Sync

    async def _on_copy_in(self, raw: RawMessage) -> None:
        """COPY_IN: CopyData to the backend; CopyDone or CopyFail ends it, back in READY."""
        if raw.type in (b"d", b"c", b"f"):
            self.up.queue(reframe(raw))
            if raw.type[0] != COPY_DATA:
                await self.up.flush()
                self.enter(State.READY)
            elif not self.buffer.pending:
                await self.up.flush()
        elif raw.type not in (b"H", b"S"):  # Flush and Sync are ignored, as PostgreSQL does
            raise ProtocolViolation(f"unexpected message type {raw.type!r} during COPY from stdin")

    def error(self, error: DpproxyError, offset: int = 0) -> None:
        """Send an ERROR; ``offset`` moves its position from a statement to the query string."""
        if offset and error.position is not None:
            error.position += offset
        self.send(ErrorResponse.from_error(error))
        event("statement_error", user=self._user, sqlstate=error.sqlstate, message=error.message)

    # -- the one relay loop -----------------------------------------------------------------

    async def relay(self, decide: Decide) -> None:
        """Relay the backend's replies to the client as ``decide`` says, until it says stop.

        This serves both protocols. A CopyInResponse on the way is relayed, then the client's
        COPY data is streamed to the backend (COPY_IN) before the relay goes on.
        """
        copy_in = False

        def decide_or_copy(kind: int, buf: bytearray, start: int, end: int) -> Action | Replace:
            nonlocal copy_in
            if kind == COPY_IN_RESPONSE:
                copy_in = True
                return Action.RELAY_STOP
            return decide(kind, buf, start, end)

        self.flush_client()
        await self.up.flush()
        while True:
            await self.up.relay(self.conn, decide_or_copy)
            if not copy_in:
                return
            copy_in = False
            await self.copy_in()

    async def copy_in(self) -> None:
        """COPY_IN until the client's CopyDone or CopyFail has gone to the backend."""
        self.enter(State.COPY_IN)
        try:
            while self._state is State.COPY_IN:
                raw = await self.read_typed()
                if raw is None:
                    raise ConnectionError("client closed during COPY")
                await self._on_copy_in(raw)
        finally:
            if self._state is State.COPY_IN:
                self.enter(State.READY)

    async def _relay_cycle(
        self, stop_at_ready: Action, relocate: Callable[[bytes], bytes] | None = None
    ) -> bool:
        """Relay the backend's reply to one Query; True unless it reported an error.

        ``relocate`` rewrites an ErrorResponse's payload (a wrapper's, `relocated_error`).
        """
        failed = False

        def decide(kind: int, buf: bytearray, start: int, end: int) -> Action | Replace:
            nonlocal failed
            if kind == READY_FOR_QUERY:
                return stop_at_ready
            if kind == ERROR_RESPONSE:
                failed = True
                if relocate is not None:
                    return Replace(relocate(bytes(buf[start:end])))
            return Action.RELAY

        await self.relay(decide)
        return not failed

    # -- simple query protocol --------------------------------------------------------------

    async def _simple_query(self, raw: RawMessage) -> None:
        try:
            sql = _query_text(raw)
            statements = (
                None if self.ctx.router.plainly_passthrough(sql) else await self.ctx.memo.route(sql)
            )
        except DpproxyError as e:
            self.error(e)
            self.send_ready()
            return
        if statements is None or all(s.route is Route.PASSTHROUGH for s in statements):
            # an empty string is forwarded too: the backend answers EmptyQueryResponse
            if self.extended.statements:
                self.extended.forget(sql)
            self.up.queue(reframe(raw))
            ran = await self._relay_cycle(stop_at_ready=Action.RELAY_STOP)
            if ran and statements and any(s.resets_settings for s in statements):
                self.answers.reset_settings()
            return
        await self._mixed(statements)

    async def _mixed(self, statements: list[Statement]) -> None:
        """A query string mixing routes: one statement at a time, in order."""
        for statement in statements:
            if statement.route is Route.PASSTHROUGH:
                self.extended.forget(statement.text)
                self.up.queue(Query(statement.text).encode())
                if not await self._relay_cycle(stop_at_ready=Action.DROP_STOP):
                    break
                if statement.resets_settings:
                    self.answers.reset_settings()
            elif not await self._run_local(statement):
                break
        self.send_ready()

    async def _run_local(self, statement: Statement) -> bool:
        """Answer a DP query or a dp.* setting in the simple protocol; False after an error."""
        try:
            self.refuse_in_failed_transaction()
            if statement.route is Route.SETTING:
                assert statement.setting is not None
                self.send(*self.answers.apply_setting(statement.setting, TEXT_ONLY, describe=True))
                return True
            if statement.explain:
                result = await self.answers.explain(statement)
            elif statement.wrapped is not None:
                answered = await self.answers.answer_wrapped(statement.wrapped, statement.text)
            else:
                assert statement.parsed is not None
                result = await self.answers.answer(statement.parsed, statement.text)
        except DpproxyError as e:
            self.error(e, statement.start)
            await self.poison_if_in_transaction()
            return False
        if statement.wrapped is not None and not statement.explain:
            # the released rows go through the wrapper in PostgreSQL, as the pass-through role
            self.send(
                *(
                    n
                    for r in answered.results
                    for n in notices(r, self.answers.settings.notices_per_row)
                )
            )
            self.up.queue(Query(answered.sql).encode())
            return await self._relay_cycle(
                stop_at_ready=Action.DROP_STOP,
                relocate=lambda e: relocated_error(
                    e, answered.sql, statement.text, statement.start
                ),
            )
        self.send(
            *notices(result, self.answers.settings.notices_per_row),
            row_description(result.columns),
            *data_rows(result),
            CommandComplete(result.command_tag),
        )
        return True

    # -- shared by both protocols -----------------------------------------------------------

    def refuse_in_failed_transaction(self) -> None:
        """PostgreSQL runs nothing but the end of a failed transaction block."""
        if self.status is TransactionStatus.FAILED:
            raise InFailedTransaction(
                "current transaction is aborted, commands ignored until end of transaction block"
            )

    async def poison_if_in_transaction(self) -> None:
        """After a local error inside a transaction block, fail the backend's transaction too.

        The client then sees status E and must roll back, as with PostgreSQL.
        """
        if self.upstream is not None and self.status is TransactionStatus.IN_TRANSACTION:
            await self.extended.poison_now()


def _query_text(raw: RawMessage) -> str:
    message = decode_frontend(raw)
    assert isinstance(message, Query)
    return message.sql
