"""A session's start: encryption requests, the startup packet, SCRAM, the backend login.

The states STARTUP, AUTHENTICATING and CONNECTING of `proxy.server.states.State`, up to the first
ReadyForQuery. Every refusal is FATAL and closes the connection. The handshake sees the session
through `Handshaking` only: it reads and writes messages, moves the state, and hands over who
logged in and their pass-through connection.
"""

from __future__ import annotations

import logging
import ssl
from typing import Final, Protocol

from proxy.auth import MECHANISM, ScramExchange
from proxy.dp.settings import DpSettings
from proxy.errors import (
    AdminShutdown,
    DpproxyError,
    InvalidAuthorization,
    InvalidParameterValue,
    ProtocolViolation,
    TooManyConnections,
    UndefinedDatabase,
)
from proxy.logs import event
from proxy.server.context import CancelKey, SessionContext
from proxy.server.states import Fatal, State
from proxy.server.upstream import Upstream
from proxy.wire import (
    AuthenticationOk,
    AuthenticationSASL,
    AuthenticationSASLContinue,
    AuthenticationSASLFinal,
    AuthResponse,
    BackendKeyData,
    CancelRequest,
    GSSENCRequest,
    Message,
    NegotiateProtocolVersion,
    ParameterStatus,
    RawMessage,
    ReadyForQuery,
    SSLRequest,
    StartupMessage,
    decode_frontend,
    decode_startup,
    split_options,
)

__all__ = ["handshake", "Handshaking"]

#: Protocol 3.0, as NegotiateProtocolVersion states it (the full number, as PostgreSQL sends).
_PROTOCOL_3_0: Final = 3 << 16
#: Startup parameters passed on to the pass-through connection; the rest (options, search_path,
#: role, ...) stay with dpproxy.
_FORWARDED: Final = frozenset(
    {"application_name", "datestyle", "timezone", "intervalstyle", "extra_float_digits"}
)
_UTF8_NAMES: Final = frozenset({"utf8", "utf-8", "unicode", "sql_ascii", "auto"})


class Handshaking(Protocol):
    """What the handshake needs of a session (`proxy.server.session.Session`)."""

    @property
    def ctx(self) -> SessionContext:
        """The server's shared state."""

    @property
    def peer(self) -> str:
        """The client's address, for the log."""

    @property
    def user(self) -> str:
        """The user named at start-up ("" before)."""

    def enter(self, state: State) -> None:
        """Move to ``state``."""

    def send(self, *messages: Message) -> None:
        """Queue messages for the client."""

    def write_now(self, data: bytes) -> None:
        """Write bytes to the client at once (the one-byte answers to encryption requests)."""

    async def start_tls(self, context: ssl.SSLContext) -> None:
        """Continue the client connection over TLS."""

    def unread(self) -> int:
        """Client bytes received and not yet taken."""

    async def read_startup(self) -> bytes | None:
        """The next startup packet's payload; None at end of stream."""

    async def read_typed(self) -> RawMessage | None:
        """The next typed message; None at end of stream."""

    def identify(self, user: str) -> None:
        """The startup packet named ``user``."""

    def use_settings(self, settings: DpSettings) -> None:
        """Start with these ``dp.*`` settings (the startup packet's ``-c`` options)."""

    def connected(self, upstream: Upstream) -> CancelKey:
        """The pass-through connection is up: keep it; returns the session's cancel key."""

    @property
    def tls(self) -> bool:
        """The client connection is encrypted."""


async def handshake(session: Handshaking) -> None:
    """STARTUP, AUTHENTICATING and CONNECTING, up to the first ReadyForQuery."""
    startup = await _read_startup(session)
    if startup is None:
        session.enter(State.CLOSED)
        return
    session.enter(State.AUTHENTICATING)
    database = _check_startup(session, startup)
    if not await _authenticate(session):
        session.enter(State.CLOSED)
        return
    if database != session.ctx.database:
        raise Fatal(
            UndefinedDatabase(
                f'database "{database}" does not exist',
                hint=f'dpproxy serves the database "{session.ctx.database}"',
            )
        )
    session.enter(State.CONNECTING)
    await _connect_upstream(session, startup)


async def _read_startup(session: Handshaking) -> StartupMessage | None:
    tls_done = gss_done = False
    while True:
        payload = await session.read_startup()
        if payload is None:
            return None
        packet = decode_startup(payload)
        if isinstance(packet, StartupMessage):
            return packet
        if isinstance(packet, CancelRequest):
            await session.ctx.cancel(packet)
            return None
        if session.unread():  # bytes sent before the handshake (CVE-2021-23214)
            raise ProtocolViolation("received unencrypted data after SSL request")
        if isinstance(packet, SSLRequest) and session.ctx.tls is not None and not tls_done:
            tls_done = True
            session.write_now(b"S")
            await session.start_tls(session.ctx.tls)
        elif isinstance(packet, (SSLRequest, GSSENCRequest)):
            if (tls_done and isinstance(packet, SSLRequest)) or (
                gss_done and isinstance(packet, GSSENCRequest)
            ):
                raise ProtocolViolation("duplicate encryption request")
            gss_done = gss_done or isinstance(packet, GSSENCRequest)
            tls_done = tls_done or isinstance(packet, SSLRequest)
            session.write_now(b"N")


def _check_startup(session: Handshaking, startup: StartupMessage) -> str:
    """Check the startup packet; return the database asked for."""
    params = startup.parameters
    if startup.minor > 0 or startup.protocol_options:
        session.send(NegotiateProtocolVersion(_PROTOCOL_3_0, startup.protocol_options))
    user = params.get("user", "")
    if not user:
        raise Fatal(InvalidAuthorization("no PostgreSQL user name specified in startup packet"))
    session.identify(user)
    if params.get("replication", "false").lower() not in ("false", "0", "off", "no"):
        raise Fatal(InvalidAuthorization("replication connections are not supported by dpproxy"))
    encoding = params.get("client_encoding", "UTF8")
    if encoding.strip().strip("'\"").lower() not in _UTF8_NAMES:  # asyncpg sends 'utf-8', quoted
        raise Fatal(
            InvalidParameterValue(
                f'invalid value for parameter "client_encoding": "{encoding}"',
                hint="dpproxy speaks UTF8 only: set client_encoding (PGCLIENTENCODING) to UTF8",
            )
        )
    try:
        settings, dropped = DpSettings.from_options(split_options(params.get("options", "")))
    except DpproxyError as e:
        raise Fatal(e) from None
    session.use_settings(settings)
    if dropped:
        event("options_ignored", logging.WARNING, user=user, options=" ".join(dropped))
    if session.ctx.shutting_down:
        raise Fatal(AdminShutdown("the database system is shutting down"))
    if len(session.ctx.sessions) >= session.ctx.max_connections:
        raise Fatal(TooManyConnections("sorry, too many clients already"))
    return params.get("database") or user


async def _auth_response(session: Handshaking) -> AuthResponse | None:
    raw = await session.read_typed()
    if raw is None:
        return None
    if raw.type != b"p":
        raise ProtocolViolation(f"expected SASL response, got message type {raw.type!r}")
    message = decode_frontend(raw)
    assert isinstance(message, AuthResponse)
    return message


async def _authenticate(session: Handshaking) -> bool:
    """SCRAM-SHA-256; False if the client hung up (psql does, to ask for a password)."""
    exchange = ScramExchange(
        session.user, session.ctx.users.get(session.user), session.ctx.mock_secret
    )
    session.send(AuthenticationSASL((MECHANISM,)))
    first = await _auth_response(session)
    if first is None:
        return False
    initial = first.as_sasl_initial_response()
    if initial.mechanism != MECHANISM or initial.data is None:
        raise ProtocolViolation("client selected an invalid SASL authentication mechanism")
    session.send(AuthenticationSASLContinue(exchange.first(initial.data)))
    final = await _auth_response(session)
    if final is None:
        return False
    try:
        server_final = exchange.final(final.as_sasl_response().data)
    except DpproxyError as e:
        event("auth_failed", logging.WARNING, user=session.user, peer=session.peer)
        raise Fatal(e) from None
    session.send(AuthenticationSASLFinal(server_final), AuthenticationOk())
    return True


async def _connect_upstream(session: Handshaking, startup: StartupMessage) -> None:
    forwarded = {k: v for k, v in startup.parameters.items() if k.lower() in _FORWARDED}
    forwarded["client_encoding"] = "UTF8"
    upstream = await Upstream.connect(session.ctx.upstream.for_user(session.user), forwarded)
    key = session.connected(upstream)
    for name, value in upstream.parameters.items():
        session.send(ParameterStatus(name, value))
    session.send(BackendKeyData(key.process_id, key.secret_key))
    session.enter(State.READY)
    event("session_started", user=session.user, peer=session.peer, tls=session.tls)
    session.send(ReadyForQuery(upstream.status))
