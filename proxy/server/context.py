"""What every session of one server shares: the router, the DP service, limits, the cancel keys."""

from __future__ import annotations

import hmac
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from proxy.auth import Verifier
from proxy.config import LimitsConfig
from proxy.dp.answering import DpService
from proxy.dp.memo import DpMemo
from proxy.dp.routing import Router
from proxy.logs import event
from proxy.server.address import UpstreamAddress
from proxy.wire import CancelRequest
from sqlmap.accuracy import AccuracyDefaults
from sqlmap.translate import Translator

__all__ = ["CancelKey", "Cancellable", "SessionContext"]


@dataclass(frozen=True, slots=True)
class CancelKey:
    """The BackendKeyData dpproxy gives a session (never the backend's own key)."""

    process_id: int
    secret_key: bytes


class Cancellable(Protocol):
    """A session as the cancel-key registry sees it."""

    @property
    def key(self) -> CancelKey | None:
        """Its key, once it has one."""

    async def cancel(self) -> None:
        """Cancel what it runs."""


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
    sessions: dict[int, Cancellable] = field(default_factory=dict)
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
