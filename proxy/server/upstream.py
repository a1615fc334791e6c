"""The pass-through connection: one PostgreSQL session as the pass-through role per client.

dpproxy speaks the client side of the protocol here, with the same codec it serves clients with.
Replies travel back as raw bytes: `Upstream.relay` scans message headers in place and writes
whole messages to the client unchanged, in as few writes as the socket allows, stopping at the
message a caller asks for (ReadyForQuery, the end of one extended-protocol reply, ...). The
login is a table of steps, one per backend message (`_LOGIN_STEPS`); where it logs in is
`proxy.server.address`.

Over ~400 lines because the login, the task's relay and the fast relay share one buffer of
backend bytes and one transaction status.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

import scramp

from proxy.auth import MECHANISM, md5_password
from proxy.errors import ConnectionFailure
from proxy.server.address import CONNECT_TIMEOUT, UpstreamAddress
from proxy.server.connection import Connection
from proxy.wire import (
    AuthenticationCleartextPassword,
    AuthenticationMD5Password,
    AuthenticationSASL,
    AuthenticationSASLContinue,
    AuthenticationSASLFinal,
    BackendKeyData,
    CancelRequest,
    ErrorResponse,
    Message,
    ParameterStatus,
    PasswordMessage,
    RawMessage,
    ReadyForQuery,
    SASLInitialResponse,
    SASLResponse,
    SSLRequest,
    StartupMessage,
    TransactionStatus,
    decode_backend,
)
from proxy.wire.framing import COPY_IN_RESPONSE, READY_FOR_QUERY, FramingLost, frames

__all__ = ["Upstream", "Action", "Decide", "Replace"]


class Action(Enum):
    """What `Upstream.relay` does with one complete message."""

    RELAY = "relay"  # send it to the client and go on
    RELAY_STOP = "relay and stop"  # send it and return
    DROP = "drop"  # keep it from the client and go on
    DROP_STOP = "drop and stop"  # keep it from the client and return


@dataclass(frozen=True, slots=True)
class Replace:
    """What `Upstream.relay` sends the client instead of one message (then stops if ``stop``)."""

    data: bytes
    stop: bool = False


#: Called for every complete message with (type byte as an int, buffer, payload start, payload
#: end).
Decide = Callable[[int, bytearray, int, int], "Action | Replace"]

_STATUSES: Final = {ord(s.value): s for s in TransactionStatus}


class Upstream:
    """One authenticated backend session.

    Its bytes collect in a buffer that `read_message` and `relay` consume as the session's task
    asks, or that a *fast relay* (`start_relay`) forwards to the client as they arrive, from the
    connection's callback, until a ReadyForQuery.

    Attributes:
        parameters: the ParameterStatus values the backend reported at start-up.
        status: the transaction status of its last ReadyForQuery.
    """

    def __init__(self, address: UpstreamAddress, conn: Connection) -> None:
        self.address = address
        self.conn = conn
        self._buf = bytearray()
        self._out = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._lost: ConnectionFailure | None = None
        self._fast: tuple[Connection, Callable[[ConnectionFailure | None, int], None]] | None = None
        self.parameters: dict[str, str] = {}
        self.status = TransactionStatus.IDLE
        self._key: BackendKeyData | None = None
        self._scram: scramp.ScramClient | None = None  # during a SCRAM login
        conn.attach(self)

    # -- connection callbacks ---------------------------------------------------------------

    def on_data(self, data: bytes) -> None:
        """Bytes from the backend: relay them now (fast relay) or wake the task."""
        if self._fast is None:
            self._buf += data
            self._wake()
        elif self._buf:
            self._buf += data
            self._run_fast(self._buf)
        else:  # the common case: scan the chunk itself, without copying it into the buffer
            self._run_fast(data)

    def on_eof(self, error: Exception | None) -> None:
        """The backend closed the connection."""
        if self._lost is None:
            reason = f": {error}" if error else ""
            self._lost = ConnectionFailure(f"the PostgreSQL backend closed the connection{reason}")
        if self._fast is not None:
            _, done = self._fast
            self._fast = None
            done(self._lost, 0)
        self._wake()

    def on_writable(self, writable: bool) -> None:
        """The backend's reading pace (the connection's drain handles it)."""

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _more(self) -> None:
        """Wait for more bytes from the backend."""
        if self._lost is not None:
            raise self._lost
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    # -- start-up ---------------------------------------------------------------------------

    @classmethod
    async def connect(cls, address: UpstreamAddress, parameters: Mapping[str, str]) -> Upstream:
        """Log in as the pass-through role with the given run-time parameters.

        Raises:
            ConnectionFailure: unreachable, refused, or authentication failed.
        """
        conn = await address.open()
        upstream = cls(address, conn)
        try:
            if not address.is_unix and address.sslmode not in ("disable", "allow"):
                await asyncio.wait_for(upstream._start_tls(), CONNECT_TIMEOUT)
            await asyncio.wait_for(upstream._startup(parameters), CONNECT_TIMEOUT)
        except BaseException:
            conn.close()
            raise
        return upstream

    async def _start_tls(self) -> None:
        self.conn.write(SSLRequest().encode())
        while not self._buf:
            await self._more()
        answer = bytes(self._buf[:1])
        del self._buf[:1]
        if answer != b"S":
            if self.address.sslmode in ("require", "verify-ca", "verify-full"):
                raise ConnectionFailure(
                    "the PostgreSQL backend does not support TLS (sslmode requires it)"
                )
            return
        if self._buf:
            raise ConnectionFailure("the PostgreSQL backend sent data before the TLS handshake")
        context = ssl.create_default_context()
        if self.address.sslmode != "verify-full":
            context.check_hostname = False
        if self.address.sslmode not in ("verify-ca", "verify-full"):
            context.verify_mode = ssl.CERT_NONE
        await self.conn.start_tls(context, server_side=False, server_hostname=self.address.host)

    async def _startup(self, parameters: Mapping[str, str]) -> None:
        params = {"user": self.address.user, "database": self.address.database, **parameters}
        self.conn.write(StartupMessage(params).encode())
        done = False
        while not done:
            message = decode_backend(await self.read_message())
            step = _LOGIN_STEPS.get(type(message))
            # AuthenticationOk, NoticeResponse, NegotiateProtocolVersion: nothing to do
            done = step is not None and step(self, message)

    # The steps of the login, one per backend message; True once logged in.

    def _send_cleartext(self, message: AuthenticationCleartextPassword) -> bool:
        self.conn.write(PasswordMessage(self._password()).encode())
        return False

    def _send_md5(self, message: AuthenticationMD5Password) -> bool:
        hashed = md5_password(self.address.user, self._password(), message.salt)
        self.conn.write(PasswordMessage(hashed).encode())
        return False

    def _start_sasl(self, message: AuthenticationSASL) -> bool:
        if MECHANISM not in message.mechanisms:
            raise ConnectionFailure(
                f"backend offers no supported SASL mechanism: {message.mechanisms}"
            )
        self._scram = scramp.ScramClient([MECHANISM], self.address.user, self._password())
        first = self._scram.get_client_first().encode()
        self.conn.write(SASLInitialResponse(MECHANISM, first).encode())
        return False

    def _continue_sasl(self, message: AuthenticationSASLContinue) -> bool:
        if self._scram is not None:
            self._scram.set_server_first(message.data.decode())
            self.conn.write(SASLResponse(self._scram.get_client_final().encode()).encode())
        return False

    def _finish_sasl(self, message: AuthenticationSASLFinal) -> bool:
        if self._scram is not None:
            self._scram.set_server_final(message.data.decode())
        return False

    def _keep_parameter(self, message: ParameterStatus) -> bool:
        self.parameters[message.name] = message.value
        return False

    def _keep_key(self, message: BackendKeyData) -> bool:
        self._key = message
        return False

    def _logged_in(self, message: ReadyForQuery) -> bool:
        self.status = message.status
        self._scram = None
        return True

    def _refused(self, message: ErrorResponse) -> bool:
        raise ConnectionFailure(f"the PostgreSQL backend refused the connection: {message.message}")

    def _password(self) -> str:
        if self.address.password is None:
            raise ConnectionFailure(
                f"the PostgreSQL backend asks for a password for {self.address.user}; "
                "set backend.passthrough_secret and run `dpproxy provision`"
            )
        return self.address.password

    # -- I/O --------------------------------------------------------------------------------

    def queue(self, data: bytes) -> None:
        """Add bytes (whole frontend messages) to what the next `flush` sends."""
        self._out += data

    @property
    def queued(self) -> bool:
        """Bytes are waiting for `flush`."""
        return bool(self._out)

    def send_now(self) -> None:
        """Write everything queued (without waiting for the backend to read it)."""
        if self._lost is not None:
            raise self._lost
        if self._out:
            self.conn.write(self._out)
            self._out = bytearray()

    def send(self, data: bytes) -> None:
        """Write whole frontend messages now, after anything queued."""
        if self._out:
            self.queue(data)
            self.send_now()
            return
        if self._lost is not None:
            raise self._lost
        self.conn.write(data)

    async def flush(self) -> None:
        """Send everything queued."""
        self.send_now()
        await self.conn.drain()

    async def read_message(self) -> RawMessage:
        """Read one whole message (for start-up and the rare message-level exchanges)."""
        while True:
            try:
                for kind, start, end in frames(self._buf):
                    raw = RawMessage(bytes((kind,)), bytes(self._buf[start:end]))
                    del self._buf[:end]
                    return raw
            except FramingLost as e:
                raise _malformed(e) from None
            await self._more()

    def _scan(self, client: Connection, decide: Decide) -> bool:
        """Relay the whole messages buffered now, as ``decide`` says; True if it said stop.

        Also records the transaction status of every ReadyForQuery that passes.
        """
        buf = self._buf
        pos = start = 0
        stop = False
        try:
            for kind, payload, end in frames(buf):
                if kind == READY_FOR_QUERY and end - payload == 1:
                    self.status = _status(buf[payload])
                action = decide(kind, buf, payload, end)
                if isinstance(action, Replace):
                    client.write(bytes(buf[start:pos]) + action.data)
                    start = pos = end
                    if action.stop:
                        stop = True
                        break
                    continue
                if action is Action.DROP or action is Action.DROP_STOP:
                    if start < pos:
                        client.write(bytes(buf[start:pos]))
                    start = end
                pos = end
                if action is Action.RELAY_STOP or action is Action.DROP_STOP:
                    stop = True
                    break
        except FramingLost as e:
            raise _malformed(e) from None
        if start < pos:
            client.write(bytes(buf[start:pos]))
        del buf[:pos]
        return stop

    async def relay(self, client: Connection, decide: Decide) -> None:
        """Copy whole messages to ``client`` as they arrive until ``decide`` says stop."""
        while not self._scan(client, decide):
            await client.drain()
            await self._more()
        await client.drain()

    def start_relay(
        self, client: Connection, done: Callable[[ConnectionFailure | None, int], None]
    ) -> None:
        """Relay to ``client`` from the connection's callback, until ReadyForQuery.

        Stops early at a CopyInResponse. Then calls ``done(error, type of the last
        message)``; the session's task sleeps meanwhile.
        """
        if self._lost is not None:
            done(self._lost, 0)
            return
        self._fast = (client, done)
        if self._buf:
            self._run_fast(self._buf)

    def _run_fast(self, buf: bytes | bytearray) -> None:
        """The fast relay's scan of ``buf``: whole messages to the client up to ReadyForQuery.

        ``buf`` is either the buffer or, when the buffer is empty, a chunk just received; what
        is left of it after the last whole message is kept in the buffer. The scan stops early
        at a CopyInResponse, whose COPY data the session's task must pump.
        """
        assert self._fast is not None
        client, done = self._fast
        try:
            pos, last, status = _hop(buf)
        except ConnectionFailure as e:
            self._fast = None
            done(e, 0)
            return
        size = len(buf)
        if pos == size:  # the common case: the reply ends with the chunk; no copy
            if pos:
                client.write(buf)
                if buf is self._buf:
                    self._buf = bytearray()  # a new one: the transport may still hold the old
        else:
            if pos:
                client.write(bytes(buf[:pos]))
            if buf is self._buf:
                del buf[:pos]
            else:
                self._buf += memoryview(buf)[pos:]
        if status is not None:
            self.status = status
        if last == READY_FOR_QUERY or last == COPY_IN_RESPONSE:
            self._fast = None
            done(None, last)

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading the backend while the client cannot keep up."""
        if paused:
            self.conn.pause_reading()
        else:
            self.conn.resume_reading()

    async def cancel(self) -> None:
        """Ask the backend, on a new connection, to cancel what this session runs."""
        if self._key is None:
            return
        try:
            conn = await self.address.open()
        except ConnectionFailure:
            return
        closed = asyncio.get_running_loop().create_future()

        class _Closed:
            def on_data(self, data: bytes) -> None:
                pass

            def on_eof(self, error: Exception | None) -> None:
                if not closed.done():
                    closed.set_result(None)

            def on_writable(self, writable: bool) -> None:
                pass

        conn.attach(_Closed())
        try:
            conn.write(CancelRequest(self._key.process_id, self._key.secret_key).encode())
            await asyncio.wait_for(closed, CONNECT_TIMEOUT)  # the server closes it when done
        except TimeoutError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        """Say Terminate and close (no wait)."""
        self._fast = None
        if not self.conn.is_closing():
            self.conn.write(b"X\x00\x00\x00\x04")
            self.conn.close()


#: The login's step for each backend message (`Upstream._startup`).
_LOGIN_STEPS: Final[dict[type[Message], Callable[[Upstream, Any], bool]]] = {
    AuthenticationCleartextPassword: Upstream._send_cleartext,
    AuthenticationMD5Password: Upstream._send_md5,
    AuthenticationSASL: Upstream._start_sasl,
    AuthenticationSASLContinue: Upstream._continue_sasl,
    AuthenticationSASLFinal: Upstream._finish_sasl,
    ParameterStatus: Upstream._keep_parameter,
    BackendKeyData: Upstream._keep_key,
    ReadyForQuery: Upstream._logged_in,
    ErrorResponse: Upstream._refused,
}


def _malformed(lost: FramingLost) -> ConnectionFailure:
    """Lost framing, reported as the backend's failure."""
    return ConnectionFailure(
        f"the PostgreSQL backend sent a malformed message (length {lost.length})"
    )


def _status(byte: int) -> TransactionStatus:
    """The transaction status a ReadyForQuery's byte names."""
    status = _STATUSES.get(byte)
    if status is None:
        raise ConnectionFailure(
            f"the PostgreSQL backend sent an unknown transaction status {bytes([byte])!r}"
        )
    return status


def _hop(buf: bytes | bytearray) -> tuple[int, int, TransactionStatus | None]:
    r"""Hop over whole messages up to and including the first ReadyForQuery or CopyInResponse.

    Returns:
        (end of the last whole message taken, its type, the ReadyForQuery's status or None).

    Raises:
        ConnectionFailure: a malformed message; the framing is lost.

    >>> _hop(b"C\x00\x00\x00\x05xZ\x00\x00\x00\x05IN")
    (12, 90, <TransactionStatus.IDLE: 'I'>)
    """
    pos = last = 0
    try:
        for last, payload, pos in frames(buf):
            if last == READY_FOR_QUERY:
                return pos, last, _status(buf[payload]) if pos - payload == 1 else None
            if last == COPY_IN_RESPONSE:
                break
    except FramingLost as e:
        raise _malformed(e) from None
    return pos, last, None
