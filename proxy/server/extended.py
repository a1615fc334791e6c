"""The extended query protocol of one session: Parse, Bind, Describe, Execute, Close, Flush, Sync.

Each Parse is routed like a simple query. Statements and portals of pass-through SQL live in the
backend: their messages are forwarded as they come and queued until the client's Flush or
Sync. DP statements and ``dp.*`` settings live here and are answered here. A DP query with
post-processing (`sqlmap.postprocess`) lives in the backend too: Parse prepares its wrapper
over empty relations (so Describe needs no answer), Bind answers its cores and binds the portal
to the wrapper over the released rows, and Execute (row limits included), Describe and Close of
the portal pass through. Replies must reach
the client in the order of its messages, so before any local reply the backend is asked
(Flush) for the replies to everything forwarded so far, which are relayed first; a batch without
local messages is simply relayed until ReadyForQuery.

After an error, both sides discard messages until Sync. An error raised here inside a
transaction (or after pass-through messages in the same batch) is mirrored in the backend with
a Bind that cannot succeed, so that it rolls back just as PostgreSQL would.

Over ~400 lines because the seven messages' handlers share the statements, the portals and the
queue of replies still due from the backend: they are one protocol's state, kept in one place.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from sqlglot import exp

from proxy.dp.answering import DpResult, described, result_columns
from proxy.dp.parameters import bind as bind_parameters
from proxy.dp.parameters import parameter_types
from proxy.dp.results import TEXT_ONLY, Formats, data_rows, notices, row_description
from proxy.dp.routing import Route
from proxy.dp.settings import SettingCommand, Verb
from proxy.errors import (
    DpproxyError,
    DuplicateCursor,
    DuplicatePreparedStatement,
    ProtocolViolation,
    SqlSyntaxError,
    UnsupportedQuery,
)
from proxy.server.answers import LocalAnswers
from proxy.server.context import SessionContext
from proxy.server.states import State
from proxy.server.upstream import Action, Decide, Replace, Upstream
from proxy.wire import (
    Bind,
    BindComplete,
    Close,
    CloseComplete,
    CommandComplete,
    Describe,
    ErrorResponse,
    Execute,
    Flush,
    Message,
    NoData,
    ParameterDescription,
    Parse,
    ParseComplete,
    PortalSuspended,
    RawMessage,
    Sync,
    Target,
    TransactionStatus,
    decode_frontend,
)
from proxy.wire.framing import (
    BIND_COMPLETE,
    CLOSE_COMPLETE,
    COMMAND_COMPLETE,
    EMPTY_QUERY_RESPONSE,
    ERROR_RESPONSE,
    NO_DATA,
    PARSE_COMPLETE,
    PORTAL_SUSPENDED,
    READY_FOR_QUERY,
    ROW_DESCRIPTION,
    reframe,
)
from proxy.wire.message import decode_payload
from sqlmap.cube import Cube
from sqlmap.postprocess import Wrapped, original_position, split
from sqlmap.translate import AnswerSpec

__all__ = ["ExtendedProtocol", "ExtendedHost", "Prepared", "Portal"]

# Replies that complete each forwarded message (ErrorResponse completes any of them).
_PARSED: Final = frozenset({PARSE_COMPLETE})
_BOUND: Final = frozenset({BIND_COMPLETE})
_CLOSED: Final = frozenset({CLOSE_COMPLETE})
# ParameterDescription comes first for a statement
_DESCRIBED: Final = frozenset({ROW_DESCRIPTION, NO_DATA})
_EXECUTED: Final = frozenset({COMMAND_COMPLETE, PORTAL_SUSPENDED, EMPTY_QUERY_RESPONSE})
_FLUSH: Final = Flush().encode()
_DEALLOCATE: Final = re.compile(
    r"\b(?:deallocate\s+(?:prepare\s+)?(?P<name>\"[^\"]+\"|\w+)|discard\s+all\b)", re.IGNORECASE
)
_SYNC: Final = Sync().encode()

K = TypeVar("K")
V = TypeVar("V")
P = TypeVar("P", "Prepared", "Portal")


@dataclass(slots=True)
class Prepared:
    """A prepared statement: where it runs, and for local ones what they need."""

    route: Route
    tree: exp.Expr | None = None
    setting: SettingCommand | None = None
    param_types: tuple[int, ...] = ()
    spec: AnswerSpec | None = None  # a DP query without parameters, translated at Parse
    text: str = ""
    wrapped: Wrapped | None = None  # a DP query with post-processing: it lives in the backend
    resets_settings: bool = False  # RESET ALL / DISCARD ALL (routing.Statement)
    #: a wrapper's parameter types in the backend: 0 leaves one the post-processing alone uses
    #: to PostgreSQL, which infers it (its value is then bound in as an untyped literal)
    upstream_types: tuple[int, ...] = ()

    @property
    def upstream(self) -> bool:
        """Whether the backend holds this statement (pass-through, or a wrapper)."""
        return self.route is Route.PASSTHROUGH or self.wrapped is not None


@dataclass(slots=True)
class Portal:
    """A bound statement; a DP portal keeps its answer until every row is fetched."""

    route: Route
    spec: AnswerSpec | None = None
    key: Hashable = None  # the spec's memo key
    text: str = ""
    setting: SettingCommand | None = None
    formats: Formats = TEXT_ONLY
    result: DpResult | None = None
    sent: int = 0
    resets_settings: bool = False  # RESET ALL / DISCARD ALL (routing.Statement)


@dataclass(slots=True)
class _Pending:
    """A message forwarded to the backend whose reply has not come back yet."""

    completes: frozenset[int]
    undo: Callable[[], None] | None = None
    poison: bool = False
    hidden: bool = False  # dpproxy's own message: its reply is not the client's
    relocate: Callable[[bytes], bytes] | None = None  # rewrites its ErrorResponse's payload


def _restore(table: dict[K, V], key: K, previous: V | None) -> Callable[[], None]:
    def undo() -> None:
        if previous is None:
            table.pop(key, None)
        else:
            table[key] = previous

    return undo


class ExtendedHost(Protocol):
    """What the extended protocol needs of its session (`proxy.server.session.Session`)."""

    @property
    def ctx(self) -> SessionContext:
        """The server's shared state."""

    @property
    def state(self) -> State:
        """Where the session is."""

    @property
    def up(self) -> Upstream:
        """The pass-through connection."""

    @property
    def status(self) -> TransactionStatus:
        """The backend's transaction status."""

    def enter(self, state: State) -> None:
        """Move to ``state``."""

    def send(self, *messages: Message) -> None:
        """Queue messages for the client."""

    def flush_client(self) -> None:
        """Write the queued messages."""

    async def relieve_output(self, limit: int) -> None:
        """Write the queued messages once past ``limit`` bytes."""

    def error(self, error: DpproxyError, offset: int = 0) -> None:
        """Send an ERROR."""

    def send_ready(self) -> None:
        """Send ReadyForQuery."""

    async def relay(self, decide: Decide) -> None:
        """Relay the backend's replies as ``decide`` says (COPY FROM STDIN included)."""

    def refuse_in_failed_transaction(self) -> None:
        """Raise if the transaction block has failed."""

    @property
    def answers(self) -> LocalAnswers:
        """DP queries and ``dp.*`` settings, answered here."""


class ExtendedProtocol:
    """The named statements and portals of one session and the handlers of their messages."""

    def __init__(self, session: ExtendedHost) -> None:
        self.session = session
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.pending: list[_Pending] = []
        self.batch_upstream = False  # messages went to the backend since the last Sync
        self.local_failure = False  # an error raised here since the last Sync
        self._forwarded = 0  # bytes forwarded since the backend last replied to all of them
        self._poison = Bind("", f"dpproxy_rollback_{secrets.token_hex(8)}").encode()
        self._wrapper_prefix = f"dpproxy_wrapper_{secrets.token_hex(8)}_"
        # each message's handler, by its class (Sync, which ends an error state, comes first)
        self._handlers: dict[type[Message], Callable[[Any, RawMessage], Awaitable[None]]] = {
            Parse: self.parse,
            Bind: self.bind,
            Describe: self.describe,
            Execute: self.execute,
            Close: self.close,
            Flush: self.flush,
        }

    # -- dispatch ---------------------------------------------------------------------------

    async def handle(self, raw: RawMessage) -> None:
        """Handle one extended-protocol message."""
        if raw.type == b"S":
            await self.sync()
            return
        try:
            message = decode_frontend(raw)
            await self._handlers[type(message)](message, raw)
        except DpproxyError as e:
            await self.fail(e)
        await self._relieve()

    async def _relieve(self) -> None:
        """Backpressure inside a batch: a client may pipeline without end before its Sync.

        Past ``limits.max_pipeline_messages`` forwarded messages (or ``max_pipeline_bytes``),
        the backend is asked for its replies so far and they go to the client, as a Flush would;
        while the client does not read them, the session stops reading it. Local replies are
        written once they pass ``max_pipeline_bytes``.
        """
        limits = self.session.ctx.limits
        if (
            len(self.pending) >= limits.max_pipeline_messages
            or self._forwarded >= limits.max_pipeline_bytes
        ):
            await self.drain()
        await self.session.relieve_output(limits.max_pipeline_bytes)

    async def fail(self, error: DpproxyError) -> None:
        """Report an error (after the replies before it) and discard until Sync."""
        if await self.drain():
            self.session.error(error)
            self.session.enter(State.EXTENDED_ERROR)
            self.local_failure = True

    def forward(
        self, raw: RawMessage, completes: frozenset[int], undo: Callable[[], None] | None = None
    ) -> None:
        """Queue a message for the backend; its reply is relayed in order later."""
        self.forward_bytes(reframe(raw), completes, undo)

    def forward_bytes(
        self,
        data: bytes,
        completes: frozenset[int],
        undo: Callable[[], None] | None = None,
        hidden: bool = False,
        relocate: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """Queue an encoded message for the backend; ``hidden`` drops its reply."""
        self.session.up.queue(data)
        self._forwarded += len(data)
        self.pending.append(_Pending(completes, undo, hidden=hidden, relocate=relocate))
        self.batch_upstream = True

    async def drain(self) -> bool:
        """Relay the backend's replies to everything forwarded so far; False if one failed."""
        session = self.session
        if self.pending:
            session.up.queue(_FLUSH)
            await self._relay(stop_when_drained=True)
        self._forwarded = 0
        return session.state is not State.EXTENDED_ERROR

    def send(self, *messages: Message) -> None:
        """Queue replies for the client (the session's output)."""
        self.session.send(*messages)

    # -- the messages -----------------------------------------------------------------------

    async def parse(self, message: Parse, raw: RawMessage) -> None:
        """Parse: route the statement; forward it or keep it here."""
        prepared, described_sql = await self._prepare(message)
        existing = self.statements.get(message.name)
        both_upstream = existing is not None and existing.upstream and prepared.upstream
        if message.name and existing is not None and not both_upstream:
            raise DuplicatePreparedStatement(f'prepared statement "{message.name}" already exists')
        if prepared.upstream:  # the backend refuses a name it already has
            undo = _restore(self.statements, message.name, self.statements.get(message.name))
            self.statements[message.name] = prepared
            if described_sql is None:
                self.forward(raw, _PARSED, undo)
            else:
                described_parse = Parse(message.name, described_sql, prepared.upstream_types)
                self.forward_bytes(
                    described_parse.encode(),
                    _PARSED,
                    undo,
                    relocate=lambda e: relocated_error(e, described_sql, message.sql, 0),
                )
            return
        if await self.drain():
            self.statements[message.name] = prepared
            self.send(ParseComplete())

    async def _prepare(self, message: Parse) -> tuple[Prepared, str | None]:
        """The statement, and for a wrapper the SQL the backend prepares in its place."""
        ctx = self.session.ctx
        if ctx.router.plainly_passthrough(message.sql):
            return Prepared(Route.PASSTHROUGH), None
        statements = await ctx.memo.route(message.sql)
        if len(statements) > 1:
            if all(s.route is Route.PASSTHROUGH for s in statements):
                # the backend refuses it with its own words
                return Prepared(Route.PASSTHROUGH), None
            raise SqlSyntaxError("cannot insert multiple commands into a prepared statement")
        if not statements or statements[0].route is Route.PASSTHROUGH:
            resets = bool(statements) and statements[0].resets_settings
            return Prepared(Route.PASSTHROUGH, resets_settings=resets), None
        statement = statements[0]
        if statement.route is Route.SETTING:
            return Prepared(Route.SETTING, setting=statement.setting), None
        if statement.explain:
            # the extended protocol answers DP queries at Execute; a preview has no path there
            raise UnsupportedQuery(
                "EXPLAIN of a DP query is answered in the simple query protocol only",
                hint="send it as a plain query (psql does; in psycopg, without parameters)",
            )
        tree = statement.parsed
        assert tree is not None
        if statement.wrapped is not None:
            wrapped = statement.wrapped
            types: tuple[int, ...] = ()
            cores: Wrapped | None = wrapped
            if message.param_types or tree.find(exp.Parameter) is not None:
                # the values come at Bind; the cores' columns do not depend on them: translate
                # them with every parameter NULL, and let the backend type the wrapper's own
                types = parameter_types(tree, self._cube_of(wrapped), message.param_types)
                n = len(types)
                nulls = bind_parameters(tree, types, [None] * n, [0] * n)
                cores = split(nulls, ctx.translator, wrapped.prefix)
            if cores is None or len(cores.cores) != len(wrapped.cores):
                raise UnsupportedQuery(
                    "a parameter here changes which DP queries the statement holds",
                    hint="bind the values into the SQL text",
                )
            # translated now, to refuse what cannot be answered and to type the empty rows
            specs = await self.session.answers.translate_cores(
                cores, (message.sql, (None,) * len(types)) if types else message.sql
            )
            prepared = Prepared(
                Route.DP,
                tree=tree,
                text=message.sql,
                wrapped=wrapped,
                param_types=types,
                upstream_types=_upstream_types(wrapped, types, message.param_types),
            )
            return prepared, described(wrapped, specs)
        source = tree.args["from_"].this
        types = parameter_types(tree, ctx.translator.cube_for(source), message.param_types)
        # refuse what cannot be answered now
        spec = None if types else (await self.session.answers.translate(tree, message.sql))[0]
        return Prepared(Route.DP, tree=tree, param_types=types, spec=spec, text=message.sql), None

    def _cube_of(self, wrapped: Wrapped) -> Cube:
        """The protected table of a statement's first core: its dimensions type parameters."""
        source = wrapped.cores[0].select.args["from_"].this
        return self.session.ctx.translator.cube_for(source)

    async def bind(self, message: Bind, raw: RawMessage) -> None:
        """Bind: a portal here for a local statement, else forwarded."""
        prepared = self.statements.get(message.statement)
        current = self.portals.get(message.portal)
        if message.portal and current is not None and current.route is not Route.PASSTHROUGH:
            raise DuplicateCursor(f'cursor "{message.portal}" already exists')
        if prepared is None or prepared.route is Route.PASSTHROUGH:
            undo = _restore(self.portals, message.portal, current)
            resets = prepared is not None and prepared.resets_settings
            self.portals[message.portal] = Portal(Route.PASSTHROUGH, resets_settings=resets)
            self.forward(raw, _BOUND, undo)
            return
        if not await self.drain():
            return
        self.session.refuse_in_failed_transaction()
        if prepared.wrapped is not None:
            await self._bind_wrapper(prepared, prepared.wrapped, message, current)
            return
        portal = await self._bind_local(prepared, message)
        self.portals[message.portal] = portal
        self.send(BindComplete())

    async def _bind_wrapper(
        self, prepared: Prepared, wrapped: Wrapped, message: Bind, current: Portal | None
    ) -> None:
        """Answer the cores, then bind the portal to the wrapper over the released rows.

        The wrapper is prepared in the backend under a name of dpproxy's own, one per portal
        (closing it first: the portal it served, if any, is replaced anyway); the backend's
        replies to that Close and Parse are not the client's, its BindComplete is.
        """
        key: Hashable = None
        if len(message.params) != len(prepared.param_types):
            raise ProtocolViolation(
                f"bind message supplies {len(message.params)} parameters, "
                f"but prepared statement requires {len(prepared.param_types)}"
            )
        if prepared.param_types:
            # the values as constants, split again: the cores and wrapper the SQL would be
            # with them written in
            assert prepared.tree is not None
            formats = tuple(message.param_format(i) for i in range(len(message.params)))
            for i, (upstream, fmt) in enumerate(zip(prepared.upstream_types, formats)):
                if upstream == 0 and fmt == 1:
                    raise UnsupportedQuery(
                        f"parameter ${i + 1} of the post-processing has no declared type: "
                        "send it in text format",
                        hint="or declare its type in Parse, or write the value in the SQL",
                    )
            bound = bind_parameters(prepared.tree, prepared.param_types, message.params, formats)
            rewrapped = split(bound, self.session.ctx.translator, wrapped.prefix)
            if rewrapped is None or len(rewrapped.cores) != len(wrapped.cores):
                raise UnsupportedQuery(
                    "a parameter here changes which DP queries the statement holds",
                    hint="bind the values into the SQL text",
                )
            wrapped, key = rewrapped, (prepared.text, message.params, formats)
        answered = await self.session.answers.answer_wrapped(wrapped, prepared.text, key)
        self.send(
            *(
                n
                for r in answered.results
                for n in notices(r, self.session.answers.settings.notices_per_row)
            )
        )
        name = self._wrapper_prefix + message.portal
        self.forward_bytes(Close(Target.STATEMENT, name).encode(), _CLOSED, hidden=True)
        self.forward_bytes(
            Parse(name, answered.sql).encode(),
            _PARSED,
            hidden=True,
            relocate=lambda e: relocated_error(e, answered.sql, prepared.text, 0),
        )
        bind = Bind(message.portal, name, result_formats=message.result_formats)
        undo = _restore(self.portals, message.portal, current)
        self.portals[message.portal] = Portal(Route.PASSTHROUGH)
        self.forward_bytes(bind.encode(), _BOUND, undo)

    async def _bind_local(self, prepared: Prepared, message: Bind) -> Portal:
        if len(message.params) != len(prepared.param_types):
            raise ProtocolViolation(
                f"bind message supplies {len(message.params)} parameters, "
                f"but prepared statement requires {len(prepared.param_types)}"
            )
        if prepared.route is Route.SETTING:
            return Portal(Route.SETTING, setting=prepared.setting, formats=_checked(message, 1))
        assert prepared.tree is not None
        tree = prepared.tree
        key: Hashable = prepared.text
        if prepared.param_types:
            formats = tuple(message.param_format(i) for i in range(len(message.params)))
            key = (prepared.text, message.params, formats)
            spec, key = await self.session.answers.translate(
                tree,
                key,
                lambda: bind_parameters(tree, prepared.param_types, message.params, formats),
            )
        else:
            spec, key = await self.session.answers.translate(tree, key)
        return Portal(
            Route.DP,
            spec=spec,
            key=key,
            text=prepared.text,
            formats=_checked(message, len(result_columns(spec))),
        )

    async def describe(self, message: Describe, raw: RawMessage) -> None:
        """Describe: parameter and row descriptions of local statements and portals."""
        if message.target is Target.STATEMENT:
            prepared = self.statements.get(message.name)
            if prepared is None or prepared.upstream:
                self.forward(raw, _DESCRIBED)
                return
            if await self.drain():
                spec = await self._describe_spec(prepared)
                rows = self._rows(prepared.setting, spec, TEXT_ONLY)
                self.send(ParameterDescription(prepared.param_types), rows)
            return
        portal = self.portals.get(message.name)
        if portal is None or portal.route is Route.PASSTHROUGH:
            self.forward(raw, _DESCRIBED)
            return
        if await self.drain():
            self.send(self._rows(portal.setting, portal.spec, portal.formats))

    async def _describe_spec(self, prepared: Prepared) -> AnswerSpec | None:
        if prepared.route is Route.SETTING or prepared.spec is not None:
            return prepared.spec
        assert prepared.tree is not None
        # the columns do not depend on the values: describe it as if every parameter were NULL
        n = len(prepared.param_types)
        nulls = bind_parameters(prepared.tree, prepared.param_types, [None] * n, [0] * n)
        return (await self.session.answers.translate(nulls, (prepared.text, (None,) * n)))[0]

    def _rows(
        self, setting: SettingCommand | None, spec: AnswerSpec | None, formats: Formats
    ) -> Message:
        if setting is not None:
            if setting.verb is Verb.SHOW:
                return self.session.answers.setting_description(setting, formats)
            return NoData()
        assert spec is not None
        return row_description(result_columns(spec), formats)

    async def execute(self, message: Execute, raw: RawMessage) -> None:
        """Execute: answer a DP portal (once) and send its rows, up to the row limit."""
        portal = self.portals.get(message.portal)
        if portal is None or portal.route is Route.PASSTHROUGH:
            # RESET ALL / DISCARD ALL: reset now, undone if the backend refuses it
            resets = portal is not None and portal.resets_settings
            self.forward(raw, _EXECUTED, self.session.answers.reset_settings() if resets else None)
            return
        if not await self.drain():
            return
        session = self.session
        session.refuse_in_failed_transaction()
        if portal.setting is not None:
            self.send(
                *session.answers.apply_setting(portal.setting, portal.formats, describe=False)
            )
            return
        if portal.result is None:
            assert portal.spec is not None
            session.flush_client()  # what came before reaches the client while we compute
            portal.result = await session.answers.answer_spec(portal.spec, portal.key, portal.text)
            self.send(*notices(portal.result, session.answers.settings.notices_per_row))
        result = portal.result
        total = len(result.rows)
        stop = total if message.max_rows <= 0 else min(total, portal.sent + message.max_rows)
        self.send(*data_rows(result, portal.formats, portal.sent, stop))
        sent, portal.sent = stop - portal.sent, stop
        self.send(PortalSuspended() if stop < total else CommandComplete(f"SELECT {sent}"))

    async def close(self, message: Close, raw: RawMessage) -> None:
        """Close a statement or portal, here or in the backend."""
        if message.target is Target.STATEMENT:
            route, undo = self._take(self.statements, message.name)
        else:
            route, undo = self._take(self.portals, message.name)
        if route is Route.PASSTHROUGH:
            self.forward(raw, _CLOSED, undo)
        elif await self.drain():
            self.send(CloseComplete())
        elif undo is not None:
            undo()  # skipped after an error: the statement or portal lives on

    @staticmethod
    def _take(table: dict[str, P], name: str) -> tuple[Route, Callable[[], None] | None]:
        """Remove ``name`` from a table.

        Returns:
            Its route (unknown names go to the backend) and the undo for a skipped Close.
        """
        entry = table.pop(name, None)
        if entry is None:
            return Route.PASSTHROUGH, None
        lives_upstream = isinstance(entry, Prepared) and entry.upstream
        return (
            Route.PASSTHROUGH if lives_upstream else entry.route,
            _restore(table, name, entry),
        )

    async def flush(self, message: Flush, raw: RawMessage) -> None:
        """Flush: everything so far reaches the client."""
        await self.drain()
        self.session.flush_client()

    async def sync(self) -> None:
        """Sync: end the batch; the backend's ReadyForQuery (or ours) ends the cycle."""
        session = self.session
        poison = self.local_failure and (
            self.batch_upstream or session.status is not TransactionStatus.IDLE
        )
        self.local_failure = False
        if self.batch_upstream or poison:
            if poison:
                self._queue_poison()
            session.up.queue(_SYNC)
            await self._relay(stop_when_drained=False)  # an error on the way marks EXTENDED_ERROR
            self.pending.clear()
        else:
            session.send_ready()
        session.enter(State.READY)  # Sync ends the error state on both sides
        self.batch_upstream = False
        self._forwarded = 0
        if session.status is TransactionStatus.IDLE:
            self.portals.clear()  # portals end with their transaction

    def forget(self, sql: str) -> None:
        """Drop statements that a pass-through ``DEALLOCATE`` or ``DISCARD`` removes.

        Protocol-level statements share the backend's namespace with SQL ``PREPARE``.

        >>> class _S: pass
        >>> ext = ExtendedProtocol.__new__(ExtendedProtocol)
        >>> ext.statements = {"a": Prepared(Route.DP), "b": Prepared(Route.DP)}
        >>> ext.forget('DEALLOCATE PREPARE "a"'); sorted(ext.statements)
        ['b']
        >>> ext.forget("discard all"); ext.statements
        {}
        """
        for match in _deallocations(sql):
            name = match.group("name")
            if name is None or name.lower() == "all":
                self.statements.clear()
            else:
                self.statements.pop(name[1:-1] if name.startswith('"') else name.lower(), None)

    # -- the backend's replies --------------------------------------------------------------

    def _queue_poison(self) -> None:
        self.session.up.queue(self._poison)
        self.pending.append(_Pending(frozenset(), poison=True))

    async def poison_now(self) -> None:
        """Fail the backend's transaction block now (between simple-protocol cycles)."""
        self._queue_poison()
        self.session.up.queue(_SYNC)
        await self._relay(stop_when_drained=False, ready=Action.DROP_STOP)
        self.pending.clear()
        self.session.enter(State.READY)

    async def _relay(self, stop_when_drained: bool, ready: Action = Action.RELAY_STOP) -> None:
        session = self.session

        def decide(kind: int, buf: bytearray, start: int, end: int) -> Action | Replace:
            if kind == READY_FOR_QUERY:
                return ready
            if kind == ERROR_RESPONSE:
                poisoned = bool(self.pending) and self.pending[0].poison
                relocate = self.pending[0].relocate if self.pending else None
                for pending in reversed(self.pending):
                    if pending.undo is not None:
                        pending.undo()
                self.pending.clear()
                if poisoned:
                    return Action.DROP_STOP if stop_when_drained else Action.DROP
                session.enter(State.EXTENDED_ERROR)  # the backend now skips until Sync
                if relocate is not None:
                    return Replace(relocate(bytes(buf[start:end])), stop=stop_when_drained)
                return Action.RELAY_STOP if stop_when_drained else Action.RELAY
            if self.pending and kind in self.pending[0].completes:
                done = self.pending.pop(0)
                if stop_when_drained and not self.pending:
                    return Action.DROP_STOP if done.hidden else Action.RELAY_STOP
                if done.hidden:
                    return Action.DROP
            return Action.RELAY

        await session.relay(decide)


def _deallocations(sql: str) -> Iterator[re.Match[str]]:
    """`_DEALLOCATE`'s matches, found by plain substring search first.

    This runs on the event loop for every relayed query while the session has prepared
    statements: the regex alone, tried at every word, took 0.1 s on a crafted 1 MB query.

    >>> [m.group("name") for m in _deallocations("select 1; DEALLOCATE x; Discard all")]
    ['x', None]
    """
    lower = sql.lower()
    if len(lower) != len(sql):  # lower-casing moved offsets: search the text itself
        yield from _DEALLOCATE.finditer(sql)
        return
    starts = []
    for word in ("deallocate", "discard"):
        start = lower.find(word)
        while start >= 0:
            starts.append(start)
            start = lower.find(word, start + 1)
    for start in sorted(starts):
        match = _DEALLOCATE.match(sql, start)
        if match is not None:
            yield match


def relocated_error(payload: bytes, rendered: str, original: str, offset: int) -> bytes:
    """A wrapper's ErrorResponse, its position moved into the analyst's statement or dropped.

    PostgreSQL counts the position in the SQL it ran (the wrapper, with the released rows in);
    the analyst wrote ``original``, which starts ``offset`` characters into their query string.

    >>> error = ErrorResponse({"C": "42703", "M": "column nope does not exist", "P": "46"})
    >>> rendered = "SELECT x AS sex FROM (VALUES (1)) v ORDER BY nope"
    >>> original = "SELECT sex, COUNT(*) FROM adult GROUP BY sex ORDER BY nope"
    >>> moved = relocated_error(error.encode()[5:], rendered, original, 10)
    >>> decode_payload(ErrorResponse.read, moved[5:], "ErrorResponse").fields["P"]
    '65'
    """
    error = decode_payload(ErrorResponse.read, payload, "ErrorResponse")
    fields = dict(error.fields)
    text = fields.pop("P", None)
    if text is not None and text.isdigit():
        where = original_position(rendered, int(text), original)
        if where is not None:
            fields["P"] = str(offset + where)
    return ErrorResponse(fields).encode()


def _upstream_types(
    wrapped: Wrapped, types: tuple[int, ...], declared: tuple[int, ...]
) -> tuple[int, ...]:
    """The types the backend prepares a wrapper with.

    A parameter the wrapper's own SQL uses (``LIMIT $1``, ``HAVING n > $2``) keeps the type the
    client declared, or none, for PostgreSQL to infer; one only the cores use is gone from the
    wrapper, so the backend is told its type.

    >>> from sqlmap.postprocess import Wrapped
    >>> _upstream_types(Wrapped((), "SELECT x FROM r LIMIT $2"), (20, 25), ())
    (20, 0)
    """
    in_wrapper = {int(n) for n in re.findall(r"\$(\d+)", wrapped.template)}
    return tuple(
        (declared[i] if i < len(declared) else 0) if i + 1 in in_wrapper else t
        for i, t in enumerate(types)
    )


def _checked(message: Bind, columns: int) -> Formats:
    """The Bind's result formats, checked against the number of columns now."""
    if columns:
        message.result_format(0, columns)
    return message.result_format
