"""A session's states, the moves between them, and the error that ends a session.

As asyncpg's coreproto does, a session is always in one named `State`, each state has one
handler, and every change goes through `Session.enter`, which refuses a move `NEXT` does not
list. The handlers:

| state | handled by |
|---|---|
| STARTUP, AUTHENTICATING, CONNECTING | `proxy.server.handshake.handshake`, one coroutine |
| READY | `Session._on_ready`: one query-cycle message |
| IDLE, RELAYING | the connections' callbacks (`Session._pump`, `Session._relayed`) |
| EXTENDED_ERROR | `Session._on_extended_error`: discard until Sync |
| COPY_IN | `Session._on_copy_in`: one CopyData, CopyDone or CopyFail |
| CLOSED | nothing |
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from proxy.errors import DpproxyError

__all__ = ["State", "NEXT", "Fatal"]


class State(Enum):
    """Where a session is; each value says what it waits for."""

    STARTUP = "startup"  # SSLRequest, GSSENCRequest, CancelRequest or StartupMessage
    AUTHENTICATING = "authenticating"  # the SCRAM exchange
    CONNECTING = "connecting"  # logging in to the backend as the pass-through role
    READY = "ready"  # the task handles the next query-cycle message
    IDLE = "idle"  # between cycles: the task sleeps, plain pass-through queries are relayed
    RELAYING = "relaying"  # the backend's reply to one plain query goes to the client
    EXTENDED_ERROR = "extended error"  # after an extended-protocol error: discard until Sync
    COPY_IN = "copy in"  # the client streams COPY data to the backend
    CLOSED = "closed"  # done: the connection is closed


#: The states each state may move to (staying put is always allowed).
NEXT: Final[dict[State, frozenset[State]]] = {
    State.STARTUP: frozenset({State.AUTHENTICATING, State.CLOSED}),
    State.AUTHENTICATING: frozenset({State.CONNECTING, State.CLOSED}),
    State.CONNECTING: frozenset({State.READY, State.CLOSED}),
    State.READY: frozenset({State.IDLE, State.EXTENDED_ERROR, State.COPY_IN, State.CLOSED}),
    State.IDLE: frozenset({State.RELAYING, State.READY, State.CLOSED}),
    State.RELAYING: frozenset({State.IDLE, State.COPY_IN, State.CLOSED}),
    State.EXTENDED_ERROR: frozenset({State.READY, State.CLOSED}),
    State.COPY_IN: frozenset({State.READY, State.CLOSED}),
    State.CLOSED: frozenset(),
}


class Fatal(Exception):
    """Ends the session: send the error with severity FATAL, then close."""

    def __init__(self, error: DpproxyError) -> None:
        super().__init__(error.message)
        self.error = error
