"""One client session: start-up, SCRAM, the pass-through connection, and the query loop.

A session is one asyncio task that moves through named states (`State`); each state that reads
client messages has one handler. Statements are routed before anything runs
(`proxy.dp.routing`): DP queries are answered here, ``dp.*`` settings kept here, everything else
relayed to the session's own pass-through connection (`proxy.server.upstream`). The extended query
protocol lives in `proxy.server.extended`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import ssl
import struct
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from sqlglot import exp

from proxy.answering import DpResult, DpService
from proxy.auth import Verifier
from proxy.config import LimitsConfig
from proxy.dp.memo import DpMemo
from proxy.dp.results import TEXT_ONLY, Formats, data_rows, notices, row_description
from proxy.dp.routing import Route, Router, Statement
from proxy.dp.settings import DpSettings
from proxy.errors import (
    AdminShutdown,
    ConnectionFailure,
    DpproxyError,
    InFailedTransaction,
    InvalidAuthorization,
    ProgramLimitExceeded,
    ProtocolViolation,
    QueryCanceled,
    UnsupportedQuery,
)
from proxy.logs import event
from proxy.server.connection import Connection
from proxy.server.upstream import Action, Upstream, UpstreamAddress
from proxy.wire import (
    FRONTEND_LIMITS,
    CancelRequest,
    CommandComplete,
    DataRow,
    ErrorResponse,
    Message,
    MessageBuffer,
    Query,
    RawMessage,
    ReadyForQuery,
    RowDescription,
    TransactionStatus,
    decode_frontend,
    encode_all,
)
from proxy.wire.types import Oid, column
from sqlmap.accuracy import AccuracyDefaults
from sqlmap.translate import AnswerSpec, Translator

__all__ = ["State", "SessionContext", "Session", "CancelKey", "Fatal"]

#: Buffered client bytes past which a busy session stops reading its client.
_BUFFER_LIMIT: Final = 1 << 20
#: Messages a session handles in a row before it lets the other sessions run.
_BURST: Final = 16
#: How long a client may take from connecting to being authenticated (PostgreSQL's
#: authentication_timeout).
AUTH_TIMEOUT: Final = 60.0
# Message type bytes, as ints (RawMessage.type is one byte).
_COPY_IN: Final = ord("G")
_ERROR: Final = ord("E")
_READY: Final = ord("Z")
_QUERY: Final = ord("Q")


class State(Enum):
    """Where a session is; each value says what it waits for."""

    STARTUP = "startup"  # SSLRequest, GSSENCRequest, CancelRequest or StartupMessage
    AUTHENTICATING = "authenticating"  # the SCRAM exchange
    CONNECTING = "connecting"  # logging in to the backend as the pass-through role
    READY = "ready"  # any query-cycle message
    EXTENDED_ERROR = "extended error"  # after an extended-protocol error: discard until Sync
    COPY_IN = "copy in"  # the client streams COPY data to the backend
    CLOSED = "closed"  # done: the connection is closed


@dataclass(frozen=True, slots=True)
class CancelKey:
    """The BackendKeyData dpproxy gives a session (never the backend's own key)."""

    process_id: int
    secret_key: bytes


@dataclass(slots=True)
class SessionContext:
    """What every session of one server shares."""

    router: Router
    translator: Translator
    service: DpService
    memo: DpMemo
    defaults: AccuracyDefaults
    upstream: UpstreamAddress
    users: Mapping[str, Verifier]
    database: str
    max_connections: int = 100
    limits: LimitsConfig = LimitsConfig()
    tls: ssl.SSLContext | None = None
    mock_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    sessions: dict[int, Session] = field(default_factory=dict)
    shutting_down: bool = False

    def new_key(self) -> CancelKey:
        """A process id not in use and a random secret."""
        while True:
            pid = secrets.randbelow(2**31 - 2) + 1
            if pid not in self.sessions:
                return CancelKey(pid, secrets.token_bytes(4))

    async def cancel(self, request: CancelRequest) -> None:
        """Forward a CancelRequest to the session it names, if the key matches."""
        session = self.sessions.get(request.process_id)
        if (
            session is None
            or session.key is None
            or not hmac.compare_digest(session.key.secret_key, request.secret_key)
        ):
            event("cancel_ignored", process_id=request.process_id)
            return
        await session.cancel()


class Fatal(Exception):
    """Ends the session: send the error with severity FATAL, then close."""

    def __init__(self, error: DpproxyError) -> None:
        super().__init__(error.message)
        self.error = error


class Session:
    """One client connection, from its first byte to its close.

    Args:
        ctx: the server's shared state.
        conn: the client's connection.
    """

    def __init__(self, ctx: SessionContext, conn: Connection) -> None:
        self.ctx = ctx
        self.conn = conn
        self.state = State.STARTUP
        # a statement over the limit is dropped as it arrives, then refused (54000)
        statement = ctx.limits.max_statement_bytes + 4  # the length word counts itself
        self.buffer = MessageBuffer(
            limits=FRONTEND_LIMITS, oversize={b"Q": statement, b"P": statement}
        )
        self._whole_limit = statement + 1  # the longest Query `_relay_whole` takes
        self.user = ""
        self.settings = DpSettings()
        self.upstream: Upstream | None = None
        self.key: CancelKey | None = None
        self.peer = str(conn.get_extra_info("peername") or "unix")
        self._out = bytearray()
        self._idle = False
        self._shutdown = False
        self._dp_task: asyncio.Future[DpResult] | None = None
        # reading the client: the task waits on _waiter; while it is parked (_park), plain
        # pass-through queries are relayed from the connections' callbacks (_pump)
        self._waiter: asyncio.Future[None] | None = None
        self._fed = 0
        self._eof = False
        self._wanting = False
        self._parked = False
        self._pumping = False
        self._relaying = False
        self._held: RawMessage | None = None
        self._copy_pending = False
        self._error: BaseException | None = None
        # imported here: proxy.server.extended and proxy.server.handshake need this module's names
        from proxy.server.extended import ExtendedProtocol

        self.extended = ExtendedProtocol(self)
        self._handlers: dict[State, Callable[[RawMessage], Awaitable[None]]] = {
            State.READY: self._on_ready,
            State.EXTENDED_ERROR: self._on_extended_error,
        }
        conn.attach(self)

    # -- life cycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes; never raises (errors end the session)."""
        from proxy.server.handshake import handshake

        try:
            await asyncio.wait_for(handshake(self), AUTH_TIMEOUT)
            if self.state is not State.CLOSED:
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
            self._send_fatal(AdminShutdown("terminating connection due to administrator command"))
            raise
        except Exception:
            logging.getLogger("dpproxy").exception(
                "session failed", extra={"fields": {"user": self.user}}
            )
            self._send_fatal(DpproxyError("internal error in dpproxy"))
        finally:
            self._close()

    def _close(self) -> None:
        if self.key is not None and self.ctx.sessions.get(self.key.process_id) is self:
            del self.ctx.sessions[self.key.process_id]
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        if self.state is not State.CLOSED:
            self.state = State.CLOSED
            if self.user:
                event("session_closed", user=self.user, peer=self.peer)
        if not self.conn.is_closing():
            self.flush_client()
            self.conn.close()

    def _send_fatal(self, error: DpproxyError) -> None:
        if self.conn.is_closing():
            return
        self.send(ErrorResponse.from_error(error, "FATAL"))
        self.flush_client()
        if self.user or not isinstance(error, InvalidAuthorization):
            event(
                "session_fatal",
                logging.WARNING,
                user=self.user or None,
                peer=self.peer,
                sqlstate=error.sqlstate,
                message=error.message,
            )

    def request_shutdown(self) -> None:
        """Ask the session to close: now if it is idle, else after its current query cycle."""
        self._shutdown = True
        if (self._idle and not self._relaying) or self.state in (
            State.STARTUP,
            State.AUTHENTICATING,
        ):
            self._send_fatal(AdminShutdown("terminating connection due to administrator command"))
            self.state = State.CLOSED
            self.conn.close()

    async def cancel(self) -> None:
        """Cancel what the session runs: a DP answer here, or the backend's statement."""
        event("cancel", user=self.user)
        if self._dp_task is not None and not self._dp_task.done():
            self._dp_task.cancel()
        elif self.upstream is not None:
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
        """Client bytes: into the buffer; relayed at once when parked, else the task is woken."""
        if self._parked and self._relay_whole(data):
            return
        self.buffer.feed(data)
        self._fed += len(data)
        if self._parked:
            self._pump()
        else:
            self._wake()
        if (
            self.buffer.pending > _BUFFER_LIMIT
            and not self._wanting
            and (self._relaying or not self._parked)
        ):
            self.conn.pause_reading()  # busy: let the client wait rather than buffer without end

    def on_eof(self, error: Exception | None) -> None:
        """The client closed the connection (or it broke)."""
        self._eof = True
        self._wake()

    def on_writable(self, writable: bool) -> None:
        """The client fell behind reading (or caught up): hold the fast relay meanwhile."""
        if self._relaying and self.upstream is not None:
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

    async def _park(self) -> None:
        """Wait, between query cycles, for a message the task must handle.

        Meanwhile plain pass-through queries are relayed by `_pump`, from the connections'
        callbacks.
        """
        self.flush_client()
        await self.conn.drain()
        self._parked = True
        try:
            self._pump()
            while self._held is None and not (
                self._eof or self._copy_pending or self._shutdown or self._error
            ):
                await self._wait()
        finally:
            self._parked = False
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _pump(self) -> None:
        """Relay plain pass-through Query messages, one at a time, without the task.

        Any other message (or trouble) goes to the task.
        """
        if self._pumping:
            return  # a relay finished inside start_relay: the loop below goes on
        self._pumping = True
        try:
            while not self._relaying and self._held is None and self._error is None:
                if self._shutdown or self._copy_pending:
                    self._wake()
                    return
                raw = self.buffer.take_message()
                if raw is None:
                    self.conn.resume_reading()
                    if self._eof:
                        self._wake()
                    return
                if not self._plain_query(raw):
                    self._held = raw
                    self._wake()
                    return
                self._relay_query(_frame(raw))
        except Exception as e:  # ProtocolViolation, ConnectionFailure: the task reports it
            self._error = e
            self._wake()
        finally:
            self._pumping = False

    def _relay_whole(self, data: bytes) -> bool:
        """`_pump`'s common case, without the buffer: ``data`` is one whole plain Query.

        It must also be all there is: nothing buffered, held or being relayed. Then it goes
        to the backend as it came (no copy); False leaves everything to `_pump`.
        """
        if (
            self._relaying
            or self._pumping
            or self.buffer.pending
            or self._held is not None
            or self._error is not None
            or self._shutdown
            or self._copy_pending
        ):
            return False
        size = len(data)
        if size < 6 or size > self._whole_limit or data[0] != _QUERY:
            return False
        if _LENGTH.unpack_from(data, 1)[0] != size - 1:
            return False
        if not self._plain_payload(data[5:]):
            return False
        self._fed += size
        try:
            self._relay_query(data)
        except Exception as e:  # ConnectionFailure: the task reports it
            self._error = e
            self._wake()
        return True

    def _relay_query(self, frame: bytes) -> None:
        """Send one plain Query and relay its reply from the connections' callbacks."""
        self._relaying = True
        self.up.send(frame)
        self.up.start_relay(self.conn, self._relayed)

    def _relayed(self, error: ConnectionFailure | None, last: int) -> None:
        """The fast relay of one query finished (or stopped for COPY FROM STDIN)."""
        self._relaying = False
        if error is not None:
            self._error = error
        elif last == _COPY_IN:
            self._copy_pending = True
        if self._error is not None or self._copy_pending:
            self._wake()
        elif self._parked:
            self._pump()

    def _plain_query(self, raw: RawMessage) -> bool:
        """Whether the fast relay may take this message.

        It must be a Query, plainly pass-through, outside any extended batch, in a healthy
        session.
        """
        return raw.type == b"Q" and self._plain_payload(raw.payload)

    def _plain_payload(self, payload: bytes) -> bool:
        """`_plain_query` for a Query with this payload."""
        if self.state is not State.READY or self.upstream is None:
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
        while self.state is not State.CLOSED:
            if self._copy_pending:  # the fast relay met COPY FROM STDIN
                self._copy_pending = False
                await self.copy_in()
                await self._relay_cycle(stop_at_ready=Action.RELAY_STOP)
                continue
            raw, self._held = self._held, None
            if raw is None:
                raw = self.buffer.take_message()
            if raw is None:
                if self._shutdown:
                    raise Fatal(
                        AdminShutdown("terminating connection due to administrator command")
                    )
                if self._eof:
                    return
                self._idle = True
                try:
                    await self._park()
                finally:
                    self._idle = False
                burst = 0
                continue
            await self._handlers[self.state](raw)
            burst += 1
            if burst == _BURST:
                # a pipeline of messages answered from memos never waits on anything: let
                # the other sessions' callbacks run in between
                burst = 0
                await asyncio.sleep(0)

    async def _on_ready(self, raw: RawMessage) -> None:
        kind = raw.type
        if raw.oversized:
            await self._refuse_oversized(raw)
        elif kind == b"Q":
            await self._simple_query(raw)
        elif kind in b"PBDECSH":
            await self.extended.handle(raw)
        elif kind == b"X":
            self.state = State.CLOSED
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
            self.state = State.CLOSED
        # anything else is discarded until Sync

    def error(self, error: DpproxyError, offset: int = 0) -> None:
        """Send an ERROR; ``offset`` moves its position from a statement to the query string."""
        if offset and error.position is not None:
            error.position += offset
        self.send(ErrorResponse.from_error(error))
        event("statement_error", user=self.user, sqlstate=error.sqlstate, message=error.message)

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
            await self._forward_query(_frame(raw))
            return
        await self._mixed(statements)

    async def _forward_query(self, frame: bytes) -> None:
        """The fast path: the whole query string to the backend, its reply back unchanged."""
        self.flush_client()
        self.up.queue(frame)
        await self.up.flush()
        await self._relay_cycle(stop_at_ready=Action.RELAY_STOP)

    async def _relay_cycle(self, stop_at_ready: Action) -> bool:
        """Relay the backend's reply to one Query; True unless it reported an error."""
        failed = False
        copy_in = False

        def decide(kind: int, buf: bytearray, start: int, end: int) -> Action:
            nonlocal failed, copy_in
            if kind == _READY:
                return stop_at_ready
            if kind == _ERROR:
                failed = True
            elif kind == _COPY_IN:
                copy_in = True
                return Action.RELAY_STOP
            return Action.RELAY

        while True:
            await self.up.relay(self.conn, decide)
            if not copy_in:
                return not failed
            copy_in = False
            await self.copy_in()

    async def copy_in(self) -> None:
        """Pass the client's CopyData, then CopyDone or CopyFail, to the backend."""
        self.state = State.COPY_IN
        try:
            while True:
                raw = await self.read_typed()
                if raw is None:
                    raise ConnectionError("client closed during COPY")
                if raw.type in (b"d", b"c", b"f"):
                    self.up.queue(_frame(raw))
                    if raw.type != b"d":
                        await self.up.flush()
                        return
                    if not self.buffer.pending:
                        await self.up.flush()
                elif raw.type in (b"H", b"S"):
                    continue  # ignored during COPY, as PostgreSQL does
                else:
                    raise ProtocolViolation(
                        f"unexpected message type {raw.type!r} during COPY from stdin"
                    )
        finally:
            if self.state is State.COPY_IN:
                self.state = State.READY

    async def _mixed(self, statements: list[Statement]) -> None:
        """A query string mixing routes: one statement at a time, in order."""
        for statement in statements:
            if statement.route is Route.PASSTHROUGH:
                self.extended.forget(statement.text)
                self.flush_client()
                self.up.queue(Query(statement.text).encode())
                await self.up.flush()
                if not await self._relay_cycle(stop_at_ready=Action.DROP_STOP):
                    break
            elif not await self._run_local(statement):
                break
        self.send_ready()

    async def _run_local(self, statement: Statement) -> bool:
        """Answer a DP query or a dp.* setting in the simple protocol; False after an error."""
        try:
            self.refuse_in_failed_transaction()
            if statement.route is Route.SETTING:
                assert statement.setting is not None
                self.send(*self.apply_setting(statement.setting, TEXT_ONLY, describe=True))
                return True
            assert statement.parsed is not None
            result = await self.answer(statement.parsed, statement.text)
        except DpproxyError as e:
            self.error(e, statement.start)
            await self.poison_if_in_transaction()
            return False
        self.send(
            *notices(result),
            row_description(result.columns),
            *data_rows(result),
            CommandComplete(f"SELECT {len(result.rows)}"),
        )
        return True

    # -- shared by both protocols -----------------------------------------------------------

    def refuse_in_failed_transaction(self) -> None:
        """PostgreSQL runs nothing but the end of a failed transaction block."""
        if self.status is TransactionStatus.FAILED:
            raise InFailedTransaction(
                "current transaction is aborted, commands ignored until end of transaction block"
            )

    def apply_setting(
        self, setting: tuple[str, str, str | None], formats: Formats, describe: bool
    ) -> list[Message]:
        """SET / RESET / SHOW of a dp.* setting; the messages that answer it."""
        verb, name, value = setting
        if verb == "SHOW":
            text = self.settings.show(name, self.ctx.defaults)
            header = [self.setting_description(setting, formats)] if describe else []
            # text is the same bytes in both formats
            return [*header, DataRow((text.encode("utf-8"),)), CommandComplete("SHOW")]
        self.settings = self.settings.set(name, value)
        event("setting", user=self.user, setting=name, value=value)
        return [CommandComplete(verb)]

    @staticmethod
    def setting_description(setting: tuple[str, str, str | None], formats: Formats) -> Message:
        """The RowDescription of SHOW dp.x (a text column named after the setting)."""
        return RowDescription((column(setting[1], Oid.TEXT, formats(0, 1)),))

    async def translate(
        self, tree: exp.Expr, key: Hashable, bind: Callable[[], exp.Expr] | None = None
    ) -> tuple[AnswerSpec, Hashable]:
        """Translate with the session's accuracy settings, remembered under ``key``.

        ``key`` is the SQL text and any bound values; ``bind`` makes the tree to translate
        when the memo has none. Returns the spec and its full memo key.
        """
        defaults = self.settings.defaults(self.ctx.defaults)
        full_key = (key, defaults)

        def translate() -> AnswerSpec:
            return self.ctx.translator.translate_parsed(
                bind() if bind is not None else tree, defaults
            )

        return await self.ctx.memo.spec(full_key, translate), full_key

    async def answer(self, tree: exp.Expr, key: str) -> DpResult:
        """Translate and answer a DP query with the session's settings; cancellable."""
        spec, full_key = await self.translate(tree, key)
        return await self.answer_spec(spec, full_key, key)

    async def answer_spec(self, spec: AnswerSpec, key: Hashable, sql: str) -> DpResult:
        """Answer a translated query; a CancelRequest stops it with 57014.

        ``sql`` is the query's text, for the audit log.

        An answer the memo holds for ``key`` (given from the same history) is sent again
        without asking the engine.
        """
        table = spec.cube.qualified_name
        memo = self.ctx.memo
        kept = memo.answer(key, spec.cube)
        if kept is not None:
            await self.ctx.service.log_repeat(spec, kept, self.user, sql)
            _log_answer(self.user, table, kept, memo=True)
            return kept
        version = memo.version(spec.cube)
        task = asyncio.ensure_future(self.ctx.service.answer(spec, user=self.user, sql=sql))
        self._dp_task = task
        try:
            result = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():  # the session itself is cancelled
                task.cancel()
                raise
            raise QueryCanceled("canceling statement due to user request") from None
        finally:
            self._dp_task = None
        memo.remember(key, version, result)
        _log_answer(self.user, table, result)
        return result

    async def poison_if_in_transaction(self) -> None:
        """After a local error inside a transaction block, fail the backend's transaction too.

        The client then sees status E and must roll back, as with PostgreSQL.
        """
        if self.upstream is not None and self.status is TransactionStatus.IN_TRANSACTION:
            await self.extended.poison_now()


def _log_answer(user: str, table: str, result: DpResult, memo: bool = False) -> None:
    """Who asked, on which table, where the answer came from and what it cost; no values."""
    sources = sorted({r.source for r in result.replies})
    charged = max((float(r.budget_charged) for r in result.replies), default=0.0)
    remaining = min((float(r.budget_remaining) for r in result.replies), default=None)
    event(
        "dp_answer",
        user=user,
        table=table,
        values=len(result.replies),
        source=",".join(sources),
        memo=memo or None,
        budget_charged_max=f"{charged:.6g}",
        budget_remaining=None if remaining is None else f"{remaining:.6g}",
    )


def _query_text(raw: RawMessage) -> str:
    message = decode_frontend(raw)
    assert isinstance(message, Query)
    return message.sql


_LENGTH: Final = struct.Struct("!i")


def _frame(raw: RawMessage) -> bytes:
    """The message as it came over the wire, to forward it unchanged."""
    return raw.type + _LENGTH.pack(len(raw.payload) + 4) + raw.payload


def frame(raw: RawMessage) -> bytes:
    """Public alias of the framing helper, for `proxy.server.extended`."""
    return _frame(raw)
