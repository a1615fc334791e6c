"""Ratios and AVG end to end below the wire: translator, ratio rounds, engine, real backend.

The noise is seeded, so each check of an interval against PostgreSQL's own answer is one fixed
draw (coverage over many draws is tests/engine/test_ratio.py's).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from fractions import Fraction
from pathlib import Path

import psycopg
import pytest

from proxy.config import load_config
from proxy.dp.answering import DpResult, DpService
from proxy.dp.routing import Router
from proxy.engine.budget import Charges
from proxy.engine.history import HistoryEntry
from proxy.engine.noise import SeededRandomSource
from proxy.storage.ledger_store import MemoryLedgerStore, NewMeasurement, Spending, StoredEntry
from proxy.storage.provision import BackendRoles, provision_roles
from proxy.storage.reader import Reader

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
TRANSLATOR = CONFIG.translator()
ROUTER = Router(TRANSLATOR, CONFIG.cubes)
PERCENT = "100.0 * COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*)"


class KeptLedger(MemoryLedgerStore):
    """This process's ledger, keeping what each spending wrote so a test can recompute it."""

    def __init__(self) -> None:
        self.entries: list[HistoryEntry] = []

    @asynccontextmanager
    async def spending(self, cube: object) -> AsyncIterator[Spending]:
        async with super().spending(cube) as spend:  # type: ignore[arg-type]
            yield _Keeping(spend, self.entries)


class _Keeping:
    def __init__(self, spend: Spending, entries: list[HistoryEntry]) -> None:
        self._spend, self._entries = spend, entries

    async def since(self, after_id: int) -> list[StoredEntry]:
        return await self._spend.since(after_id)

    async def append(self, measurements: Sequence[NewMeasurement], charges: Charges) -> list[int]:
        self._entries.extend(m.entry for m in measurements)
        return await self._spend.append(measurements, charges)


Run = tuple[asyncio.AbstractEventLoop, DpService, KeptLedger, BackendRoles]


@pytest.fixture()
def run(adult_dsn: str) -> Iterator[Run]:
    roles = provision_roles(adult_dsn, CONFIG.cubes)
    loop = asyncio.new_event_loop()
    reader = loop.run_until_complete(Reader.connect(roles.reader_dsn))
    ledger = KeptLedger()
    service = DpService(CONFIG.cubes, reader, rng=SeededRandomSource(13), ledger=ledger)
    yield loop, service, ledger, roles
    loop.run_until_complete(reader.close())
    loop.close()


def answer(run: Run, sql: str) -> DpResult:
    return run[0].run_until_complete(run[1].answer(TRANSLATOR.translate(sql)))


def truth(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def ledger_matches_the_history(run: Run) -> None:
    spent: dict[int, Fraction] = defaultdict(Fraction)
    for entry in run[2].entries:
        s = max(abs(Fraction(repr(w))) for w in entry.query.weights.tolist())
        for cell, w in zip(entry.query.cells.tolist(), entry.query.weights.tolist()):
            spent[cell] += entry.budget * abs(Fraction(repr(w))) / s
    engine = run[1].engine(CONFIG.cubes[0])
    assert engine.budget.per_cell() == dict(spent)
    assert engine.budget.spent <= engine.budget.total


def test_percentage_with_its_interval(run: Run, adult_dsn: str) -> None:
    result = answer(
        run,
        f"SELECT {PERCENT} AS pct, DP_INTERVAL_LOW({PERCENT}), DP_INTERVAL_HIGH({PERCENT}) "
        "FROM adult WITH ACCURACY 1 CONFIDENCE 0.95",
    )
    ((pct, low, high),) = result.rows
    ((expected,),) = truth(adult_dsn, f"SELECT {PERCENT} FROM adult")
    assert [c.name for c in result.columns] == ["pct", "dp_interval_low", "dp_interval_high"]
    assert isinstance(pct, float) and isinstance(low, float) and isinstance(high, float)
    assert low <= float(expected) <= high  # type: ignore[arg-type]
    assert pct == (low + high) / 2 and high - low <= 2.0
    (reply,) = result.replies
    assert reply.confidence == 0.95 and reply.budget_charged > 0
    assert result.notices[0].startswith("dp: pct = ")
    ledger_matches_the_history(run)


def test_per_group_rates_share_their_denominators_and_small_groups_are_null(
    run: Run, adult_dsn: str
) -> None:
    rate = "COUNT(*) FILTER (WHERE income = '>50K') / COUNT(*)"
    mean_age = (
        "SUM(CASE WHEN age < 25 THEN 21 WHEN age < 35 THEN 30 WHEN age < 45 THEN 40 "
        "WHEN age < 55 THEN 50 WHEN age < 65 THEN 60 ELSE 75 END) / COUNT(*)"
    )
    sql = (
        f"SELECT race, {rate} AS rate, DP_INTERVAL_LOW({rate}) AS lo, "
        f"DP_INTERVAL_HIGH({rate}) AS hi, {mean_age} AS age FROM adult GROUP BY race "
        "WITH ACCURACY 0.05 CONFIDENCE 0.9"
    )
    result = answer(run, sql)
    expected = dict(
        truth(  # type: ignore[arg-type]
            adult_dsn,
            f"SELECT race, {rate.replace('COUNT(*) F', '1.0 * COUNT(*) F')} FROM adult "
            "GROUP BY race",
        )
    )
    answered = 0
    for race, value, low, high, _ in result.rows:
        if value is None:  # too few rows for this budget: the ratio and its interval are NULL
            assert low is None and high is None
            continue
        assert isinstance(low, float) and isinstance(high, float)
        assert low <= float(expected[race]) <= high and high - low <= 0.1
        answered += 1
    assert answered >= 2  # White and Black at least
    # the mean age of a smaller group to +-0.05 years costs more than the table has: NULL
    # on its own, while the rate over the same denominator is answered
    assert any(age is None and value is not None for _, value, *_, age in result.rows)
    nulls = sum(value is None for row in result.rows for value in (row[1], row[4]))
    assert len(result.warnings) == nulls
    assert all(" is NULL: " in w for w in result.warnings), result.warnings
    ledger_matches_the_history(run)
    spent = run[1].engine(CONFIG.cubes[0]).budget.spent
    again = answer(run, sql)  # the same statement again: its parts are mostly history
    assert run[1].engine(CONFIG.cubes[0]).budget.spent - spent < spent / 4
    assert sum(r.source == "history" for r in again.replies) >= len(again.replies) // 2
    assert [row[0] for row in again.rows] == [row[0] for row in result.rows]


def test_history_answers_count_for_the_parts(run: Run, adult_dsn: str) -> None:
    counts = answer(
        run,
        "SELECT COUNT(*) AS n, COUNT(*) FILTER (WHERE sex = 'Female') AS f FROM adult "
        "WITH ACCURACY 20 CONFIDENCE 0.99",
    )
    assert {r.source for r in counts.replies} == {"fresh"}
    engine = run[1].engine(CONFIG.cubes[0])
    before = engine.budget.spent
    result = answer(
        run,
        "SELECT COUNT(*) FILTER (WHERE sex = 'Female') / COUNT(*) AS share FROM adult "
        "WITH ACCURACY 0.002",
    )
    ((share,),) = result.rows
    ((true_share,),) = truth(
        adult_dsn, "SELECT AVG(CASE WHEN sex = 'Female' THEN 1.0 ELSE 0 END) FROM adult"
    )
    assert isinstance(share, float) and abs(share - float(true_share)) <= 0.002  # type: ignore[arg-type]
    # the counts at +-20 already bound the share to about +-0.0013: nothing more is bought
    (reply,) = result.replies
    assert reply.source == "history" and engine.budget.spent == before
    ledger_matches_the_history(run)


def test_ratios_in_the_wrapper_keep_their_interval(run: Run, adult_dsn: str) -> None:
    loop, service, _, roles = run
    sql = (
        f"SELECT sex, {PERCENT} AS pct, DP_INTERVAL_HIGH({PERCENT}) AS hi FROM adult "
        f"GROUP BY sex HAVING {PERCENT} > 5 ORDER BY pct DESC WITH ACCURACY 2"
    )
    (statement,) = ROUTER.route(sql)
    assert statement.wrapped is not None
    specs = [TRANSLATOR.translate_parsed(c.select) for c in statement.wrapped.cores]
    answered = loop.run_until_complete(service.answer_wrapped(statement.wrapped, specs, "a", sql))
    with psycopg.connect(roles.analyst_dsn(), autocommit=True) as conn:
        rows = conn.execute(answered.sql).fetchall()
    assert [r[0] for r in rows] == ["Male", "Female"]
    expected = dict(truth(adult_dsn, f"SELECT sex, {PERCENT} FROM adult GROUP BY sex"))
    for sex, pct, hi in rows:
        assert abs(pct - float(expected[sex])) <= 2.0 and pct <= hi  # type: ignore[arg-type]


def test_avg_of_a_numeric_dimension_is_sum_over_count() -> None:
    from sqlmap.cube import CategoricalDimension, Cube
    from sqlmap.translate import OutputKind, Translator

    cube = Cube("public", "t", (CategoricalDimension("kids", (0, 1, 2, 3), closed=True),))
    spec = Translator([cube]).translate(
        "SELECT AVG(kids) FILTER (WHERE kids > 0), DP_INTERVAL_LOW(AVG(kids) FILTER "
        "(WHERE kids > 0)) FROM t"
    )
    assert [c.kind for c in spec.columns] == [OutputKind.RATIO, OutputKind.INTERVAL_LOW]
    ((numerator, denominator),) = spec.rows[0].ratios
    assert numerator.to_dense().tolist() == [0.0, 1.0, 2.0, 3.0, 0.0]  # NULL row: not summed
    assert denominator.to_dense().tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]  # nor counted
    assert spec.rows[0].queries == ()


def test_explain_names_the_ratios_and_spends_nothing(run: Run) -> None:
    loop, service, ledger, _ = run
    spec = TRANSLATOR.translate(f"SELECT sex, {PERCENT} FROM adult GROUP BY sex WITH ACCURACY 1")
    preview = loop.run_until_complete(service.preview([spec]))
    lines = [row[0] for row in preview.rows]
    assert sum("a ratio, answered in rounds" in str(line) for line in lines) == 2, lines
    assert ledger.entries == []


def test_translate_cli_lists_ratio_parts() -> None:
    from proxy.cli import describe

    text = describe(TRANSLATOR.translate(f"SELECT {PERCENT} FROM adult WITH ACCURACY 1"))
    assert "ratio of 5760 cells (sensitivity 100) over 11520 cells (sensitivity 1)" in text


def test_budget_carried_over_a_redefined_cube_counts_as_spent(adult_dsn: str) -> None:
    """A split is weighed against what the cells have left, carried budget included: past it,
    the ratio is NULL with its reason rather than the statement refused for budget."""
    roles = provision_roles(adult_dsn, CONFIG.cubes)
    loop = asyncio.new_event_loop()
    reader = loop.run_until_complete(Reader.connect(roles.reader_dsn))
    try:
        total = Fraction(CONFIG.cubes[0].total_budget)
        service = DpService(
            CONFIG.cubes,
            reader,
            rng=SeededRandomSource(13),
            carried={CONFIG.cubes[0].qualified_name: total - Fraction(1, 100)},
        )
        spec = TRANSLATOR.translate(f"SELECT {PERCENT} AS pct FROM adult WITH ACCURACY 1")
        result = loop.run_until_complete(service.answer(spec))
        assert list(result.rows) == [(None,)]
        (warning,) = result.warnings
        assert " is NULL: " in warning and "budget" in warning
        assert service.engine(CONFIG.cubes[0]).budget.spent <= total
    finally:
        loop.run_until_complete(reader.close())
        loop.close()
