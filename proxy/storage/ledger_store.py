"""Where released measurements and answers are recorded: the interface, and its memory-only form.

`DpService` spends through one `LedgerStore`, whichever it is: `PostgresLedgerStore`
(`proxy.storage.postgres_ledger`, ``ledger.dsn`` set: durable, shared by every dpproxy process,
written before an answer is released) or `MemoryLedgerStore` (no ``ledger.dsn``: the
measurements live only in this process's engines and end with it). Not to be confused with the
engine's per-cell budget (`proxy.engine.budget`) or the ``dpproxy ledger`` admin commands
(`proxy.storage.ledger_admin`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from proxy.engine.history import HistoryEntry
from sqlmap.cube import Cube

__all__ = [
    "LedgerStore",
    "Spending",
    "MemoryLedgerStore",
    "StoredEntry",
    "NewMeasurement",
    "AnswerRecord",
]


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """A history entry as stored: its row id, its entry key, the entry, and who caused it."""

    id: int
    key: uuid.UUID
    entry: HistoryEntry
    user: str | None = None


@dataclass(frozen=True, slots=True)
class NewMeasurement:
    """A measurement to write, with the request and the answer it served.

    ``key`` is drawn once, before the first attempt to write it. ``source`` (fresh or combined),
    ``query_offset``, ``half_width`` and ``confidence`` describe the answer it went into.
    """

    key: uuid.UUID
    entry: HistoryEntry
    requested_eps: float
    requested_confidence: float
    user: str | None
    sql: str | None
    source: str
    query_offset: float
    half_width: float
    confidence: float


@dataclass(frozen=True, slots=True)
class AnswerRecord:
    """One answer (or refusal) for the audit log."""

    source: str
    budget: Fraction
    estimate: float | None
    low: float | None
    high: float | None
    confidence: float | None
    requested_eps: float | None
    requested_confidence: float | None
    user: str | None
    sql: str | None


class Spending(Protocol):
    """What may be done while holding a table's spending lock."""

    async def since(self, after_id: int) -> list[StoredEntry]:
        """Entries other processes appended after ``after_id``."""

    async def append(
        self, measurements: Sequence[NewMeasurement], most_spent: Fraction
    ) -> list[int]:
        """Record measurements and the most a cell has spent with them; returns their row ids."""


class LedgerStore(Protocol):
    """Where a table's released measurements and its answers are recorded."""

    def spending(self, cube: Cube) -> AbstractAsyncContextManager[Spending]:
        """Hold the table's spending lock; what is appended inside is recorded when it ends."""

    async def record_answers(self, cube: Cube, records: Sequence[AnswerRecord]) -> None:
        """Append answers (or refusals) to the audit log."""


class MemoryLedgerStore:
    """No store but this process's engines: one process spends, and nothing outlives it.

    The engine's history holds the measurements and its per-cell budget the spend; the
    ``dp_answer`` log lines are the only audit trail.
    """

    @asynccontextmanager
    async def spending(self, cube: Cube) -> AsyncIterator[Spending]:
        """Nothing to lock: this process's spending lock is the only one."""
        yield _Alone()

    async def record_answers(self, cube: Cube, records: Sequence[AnswerRecord]) -> None:
        """Nothing to write (see the class)."""


class _Alone:
    """The spending of a process that shares its budget with no other."""

    async def since(self, after_id: int) -> list[StoredEntry]:
        return []  # no other process writes

    async def append(
        self, measurements: Sequence[NewMeasurement], most_spent: Fraction
    ) -> list[int]:
        return []  # the engine records them; there are no rows
