"""A socket as an asyncio Protocol: incoming bytes go to a listener, writes respect flow control.

Both ends of a session use it: the client's connection and the pass-through connection to
PostgreSQL. Callbacks (rather than streams) let the plain pass-through path relay bytes straight
from one transport to the other, without waking the session's task.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any, Protocol, cast

__all__ = ["Listener", "Connection"]


class Listener(Protocol):
    """What a connection tells about its socket."""

    def on_data(self, data: bytes) -> None:
        """Bytes arrived."""

    def on_eof(self, error: Exception | None) -> None:
        """The peer closed (or the connection broke, with ``error``)."""

    def on_writable(self, writable: bool) -> None:
        """The peer stopped (False) or resumed (True) reading what we write."""


class _Nobody:
    """The listener until a real one is attached: keeps what arrives."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof: tuple[Exception | None] | None = None

    def on_data(self, data: bytes) -> None:
        self.data += data

    def on_eof(self, error: Exception | None) -> None:
        self.eof = (error,)

    def on_writable(self, writable: bool) -> None:
        pass


class Connection(asyncio.Protocol):
    """One socket: `write`, `drain`, `close`, TLS upgrade; data and EOF go to the listener."""

    def __init__(self, on_made: Callable[[Connection], None] | None = None) -> None:
        self._on_made = on_made
        self.transport: asyncio.Transport | None = None
        self._early = _Nobody()
        self._listener: Listener = self._early
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self._closed = False

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        # uvloop's transports are not asyncio.Transport subclasses, but offer the same methods
        self.transport = cast(asyncio.Transport, transport)
        if self._on_made is not None:
            self._on_made(self)

    def data_received(self, data: bytes) -> None:  # noqa: D102
        self._listener.on_data(data)

    def eof_received(self) -> bool:  # noqa: D102
        self._listener.on_eof(None)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._closed = True
        self._wake_drain(exc)
        self._listener.on_eof(exc)

    def pause_writing(self) -> None:  # noqa: D102
        self._paused = True
        self._listener.on_writable(False)

    def resume_writing(self) -> None:  # noqa: D102
        self._paused = False
        self._wake_drain(None)
        self._listener.on_writable(True)

    # -- use --------------------------------------------------------------------------------

    def attach(self, listener: Listener) -> None:
        """Send data and EOF to ``listener`` from now on, starting with what came before."""
        early, self._listener = self._early, listener
        if early.data:
            listener.on_data(bytes(early.data))
            early.data.clear()
        if early.eof is not None:
            listener.on_eof(early.eof[0])

    def write(self, data: bytes | bytearray) -> None:
        """Queue bytes for the socket (no-op once closed)."""
        if self.transport is not None and not self._closed and not self.transport.is_closing():
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the peer reads what we wrote, if it fell behind."""
        if self._paused and not self._closed:
            if self._drain is None:
                self._drain = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drain)

    def _wake_drain(self, exc: Exception | None) -> None:
        waiter, self._drain = self._drain, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def pause_reading(self) -> None:
        """Stop reading the socket (back-pressure)."""
        if self.transport is not None and not self._closed and self.transport.is_reading():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read the socket again."""
        if self.transport is not None and not self._closed and not self.transport.is_reading():
            self.transport.resume_reading()

    async def start_tls(
        self, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None
    ) -> None:
        """Continue over TLS."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        transport = await loop.start_tls(
            self.transport, self, context, server_side=server_side, server_hostname=server_hostname
        )
        assert transport is not None
        self.transport = transport

    def get_extra_info(self, name: str) -> Any:
        """The transport's extra info (peername, sslcontext, socket, ...)."""
        return None if self.transport is None else self.transport.get_extra_info(name)

    def is_closing(self) -> bool:
        """The connection is closed or closing."""
        return self._closed or self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        """Close after flushing what was written."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
