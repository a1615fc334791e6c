"""A blocking protocol client built on dpproxy's own codec, for byte-level tests."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from scramp import ScramClient

from proxy.wire import (
    AuthenticationOk,
    AuthenticationSASL,
    AuthenticationSASLContinue,
    AuthenticationSASLFinal,
    BackendMessage,
    ErrorResponse,
    Message,
    MessageBuffer,
    ReadyForQuery,
    SASLInitialResponse,
    SASLResponse,
    StartupMessage,
    decode_backend,
    encode_all,
)


class Closed(Exception):
    """The server closed the connection."""


class RawClient:
    """One connection; `send` messages, `read` replies. `close_all` closes every one opened."""

    _open: list[RawClient] = []

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = MessageBuffer()
        self.startup_messages: list[BackendMessage] = []
        RawClient._open.append(self)

    @classmethod
    def close_all(cls) -> None:
        for client in cls._open:
            client.close()
        cls._open.clear()

    @classmethod
    def open(cls, port: int, host: str = "127.0.0.1", timeout: float = 10) -> RawClient:
        sock = socket.create_connection((host, port), timeout=timeout)
        return cls(sock)

    @classmethod
    def connect(
        cls,
        port: int,
        user: str = "analyst",
        password: str = "analyst",
        params: Mapping[str, str] | None = None,
    ) -> RawClient:
        """Open, start up and authenticate; return after the first ReadyForQuery."""
        client = cls.open(port)
        client.startup(user, params)
        client.authenticate(user, password)
        client.startup_messages = client.until_ready()
        return client

    def startup(
        self, user: str = "analyst", params: Mapping[str, str] | None = None, minor: int = 0
    ) -> None:
        self.send_bytes(
            StartupMessage({"user": user, "database": "demo", **(params or {})}, 3, minor).encode()
        )

    def authenticate(self, user: str, password: str) -> None:
        request = self.read()
        assert isinstance(request, AuthenticationSASL), request
        scram = ScramClient(["SCRAM-SHA-256"], user, password)
        self.send(SASLInitialResponse("SCRAM-SHA-256", scram.get_client_first().encode()))
        challenge = self.read()
        if isinstance(challenge, ErrorResponse):
            raise AssertionError(challenge.message)
        assert isinstance(challenge, AuthenticationSASLContinue), challenge
        scram.set_server_first(challenge.data.decode())
        self.send(SASLResponse(scram.get_client_final().encode()))
        final = self.read()
        if isinstance(final, ErrorResponse):
            raise PermissionError(final.message)
        assert isinstance(final, AuthenticationSASLFinal)
        scram.set_server_final(final.data.decode())
        assert isinstance(self.read(), AuthenticationOk)

    def send(self, *messages: Message) -> None:
        self.sock.sendall(encode_all(messages))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> BackendMessage:
        while (raw := self.buffer.take_message()) is None:
            data = self.sock.recv(65536)
            if not data:
                raise Closed()
            self.buffer.feed(data)
        return decode_backend(raw)

    def read_byte(self) -> bytes:
        data = self.sock.recv(1)
        if not data:
            raise Closed()
        return data

    def until_ready(self) -> list[BackendMessage]:
        messages = []
        while True:
            message = self.read()
            messages.append(message)
            if isinstance(message, ReadyForQuery):
                return messages

    def closed(self) -> bool:
        """Read until the server closes; True if it did (within the socket timeout)."""
        try:
            while True:
                self.read()
        except Closed:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def kinds(messages: list[BackendMessage]) -> str:
    """Type bytes of messages as one string, e.g. '12TDCZ'."""
    return "".join(m.TYPE.decode() for m in messages)
