"""Answers a translated DP query: the engine decides, the reader measures, the result is built.

This is where the three parts meet: the :class:`~sqlmap.translate.AnswerSpec` says what to
compute, the table's :class:`~proxy.engine.engine.PrivacyEngine` decides what it costs from public
inputs only, and only then, if a fresh measurement is needed, does the privileged
:class:`~proxy.backend.Reader` compute the true histogram.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np
import numpy.typing as npt

from proxy.engine.engine import PrivacyEngine, QueryRequest, Reply
from proxy.engine.history import HistoryStore
from proxy.engine.ledger import format_budget
from proxy.engine.noise import RandomSource
from proxy.errors import InvalidParameterValue
from sqlmap.cube import CategoricalDimension, Cube
from sqlmap.translate import AnswerSpec, OutputKind

__all__ = ["ColumnType", "ResultColumn", "DpResult", "HistogramSource", "DpService", "notice_text"]


class ColumnType:
    """The PostgreSQL types of DP result columns (OIDs)."""

    TEXT = 25
    FLOAT8 = 701


@dataclass(frozen=True, slots=True)
class ResultColumn:
    """A column of a DP result: its name and PostgreSQL type OID."""

    name: str
    type_oid: int


@dataclass(frozen=True, slots=True)
class DpResult:
    """What the client receives.

    Columns, rows (str | float | None values), one notice per answered value, and the engine's
    replies row by row (for logs and the ledger views).
    """

    columns: tuple[ResultColumn, ...]
    rows: tuple[tuple[str | float | None, ...], ...]
    notices: tuple[str, ...]
    replies: tuple[Reply, ...]


class HistogramSource(Protocol):
    """Whatever computes true histograms: the privileged :class:`~proxy.backend.Reader`."""

    async def histogram(self, cube: Cube) -> npt.NDArray[np.int64]:
        """X for ``cube``."""
        ...


class DpService:
    """One engine per protected table, and the lock that keeps plan and execute together.

    Args:
        cubes: the protected tables.
        store: the history store (in memory, or the durable ledger).
        source: computes true histograms, only after the engine decided to measure.
        rng: the noise source; the OS CSPRNG unless a test passes a seeded one.
    """

    def __init__(
        self,
        cubes: Iterable[Cube],
        store: HistoryStore,
        source: HistogramSource,
        rng: RandomSource | None = None,
    ) -> None:
        self._source = source
        self._engines = {
            c.qualified_name: PrivacyEngine(
                c.qualified_name,
                c.n_cells,
                total_budget=Fraction(c.total_budget),
                store=store,
                rng=rng,
                nonnegative=False,
            )
            for c in cubes
        }
        self._locks = {name: asyncio.Lock() for name in self._engines}

    def engine(self, cube: Cube) -> PrivacyEngine:
        """The engine of a protected table."""
        return self._engines[cube.qualified_name]

    async def answer(self, spec: AnswerSpec) -> DpResult:
        """Answer every value of ``spec`` as one atomic batch.

        Raises:
            InvalidParameterValue: the query states no accuracy and no default applies.
            BudgetExhausted: the fresh measurements would overspend some cell (nothing is spent).
        """
        if spec.accuracy is None:
            raise InvalidParameterValue(
                "no accuracy requested",
                hint="append WITH ACCURACY <eps> [CONFIDENCE <c>], or SET dp.accuracy = <eps>",
            )
        cube = spec.cube
        engine = self.engine(cube)
        requests = [QueryRequest(q, spec.accuracy) for q in spec.queries]
        # plan and execute must not interleave with another batch on the same table
        async with self._locks[cube.qualified_name]:
            plan = engine.plan(requests)
            truths: list[float] = []
            if plan.measurements:
                x = await self._source.histogram(cube)
                truths = [m.evaluate(x) for m in plan.measurements]
            replies = engine.execute(plan, truths)
        return _result(spec, replies)


def _result(spec: AnswerSpec, replies: tuple[Reply, ...]) -> DpResult:
    columns = []
    for column in spec.columns:
        dim = spec.cube.dimension(column.dimension) if column.dimension else None
        text_key = isinstance(dim, CategoricalDimension) and not dim.numeric
        columns.append(
            ResultColumn(column.name, ColumnType.TEXT if text_key else ColumnType.FLOAT8)
        )
    per_row = len(spec.rows[0].queries)
    rows, notices = [], []
    aggregates = [c for c in spec.columns if c.kind is OutputKind.AGGREGATE]
    for r, row in enumerate(spec.rows):
        keys = dict(zip(spec.group_dims, row.keys))
        row_replies = replies[r * per_row : (r + 1) * per_row]
        values: list[str | float | None] = []
        answers = iter(row_replies)
        for column in spec.columns:
            if column.kind is OutputKind.GROUP_KEY:
                key = keys[column.dimension or ""].value
                values.append(None if key is None else key if isinstance(key, str) else float(key))
            elif column.kind is OutputKind.AGGREGATE:
                values.append(next(answers).estimate)
            else:
                reply = row_replies[column.aggregate or 0]
                values.append(reply.low if column.kind is OutputKind.INTERVAL_LOW else reply.high)
        rows.append(tuple(values))
        labels = ", ".join(f"{d}={k.label}" for d, k in keys.items())
        for column, reply in zip(aggregates, row_replies):
            notices.append(notice_text(column.name + (f" [{labels}]" if labels else ""), reply))
    return DpResult(tuple(columns), tuple(rows), tuple(notices), replies)


def notice_text(what: str, reply: Reply) -> str:
    """The NoticeResponse that accompanies every DP value.

    >>> from fractions import Fraction
    >>> reply = Reply(10.0, 5.0, 15.0, 0.95, "fresh", Fraction(1, 3), Fraction(2, 3))
    >>> print(notice_text("count", reply))
    dp: count = 10 in [5, 15] with confidence 0.95; source fresh;
    budget charged 0.333334, remaining 0.666666
    """
    charged = format_budget(reply.budget_charged, up=True)  # rounded against the analyst
    remaining = format_budget(reply.budget_remaining, up=False)
    return (
        f"dp: {what} = {reply.estimate:.6g} in [{reply.low:.6g}, {reply.high:.6g}] "
        f"with confidence {reply.confidence:.6g}; source {reply.source}; "
        f"budget charged {charged}, remaining {remaining}"
    )
