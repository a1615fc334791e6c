"""DP answers end to end below the wire: translator, engine, real backend measurements."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest

from proxy.config import load_config
from proxy.dp.answering import ColumnType, DpResult, DpService
from proxy.engine.budget import format_budget
from proxy.errors import BudgetExhausted, DpproxyError, QueryCanceled
from proxy.storage.postgres_ledger import PostgresLedgerStore
from proxy.storage.provision import provision_roles
from proxy.storage.reader import Reader
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
TRANSLATOR = CONFIG.translator()


class CountingReader(Reader):
    """The real reader, counting how often the true data is read."""

    reads = 0

    async def measure(self, cube: Cube, queries: tuple[LinearQuery, ...]) -> list[float]:
        CountingReader.reads += 1
        return await super().measure(cube, queries)


@pytest.fixture()
def run(adult_dsn: str) -> Iterator[tuple[asyncio.AbstractEventLoop, DpService]]:
    roles = provision_roles(adult_dsn, CONFIG.cubes)
    loop = asyncio.new_event_loop()
    reader = loop.run_until_complete(CountingReader.connect(roles.reader_dsn))
    CountingReader.reads = 0
    yield loop, DpService(CONFIG.cubes, reader)
    loop.run_until_complete(reader.close())
    loop.close()


def answer(run: tuple[asyncio.AbstractEventLoop, DpService], sql: str):  # type: ignore[no-untyped-def]
    loop, service = run
    return loop.run_until_complete(service.answer(TRANSLATOR.translate(sql)))


def test_fresh_then_free_from_history(run: tuple[asyncio.AbstractEventLoop, DpService]) -> None:
    first = answer(run, "SELECT COUNT(*) FROM adult WITH ACCURACY 50 CONFIDENCE 0.95")
    (reply,) = first.replies
    assert reply.source == "fresh" and reply.budget_charged > 0
    assert first.columns[0].name == "count" and first.columns[0].type_oid == ColumnType.FLOAT8
    assert reply.low <= first.rows[0][0] <= reply.high
    assert "source fresh" in first.notices[0]
    assert CountingReader.reads == 1
    again = answer(
        run, "SELECT count(*) FROM public.adult WHERE age >= 17 WITH ACCURACY 60 CONFIDENCE 0.95"
    )
    (reply2,) = again.replies
    assert reply2.source == "history" and reply2.budget_charged == 0
    assert CountingReader.reads == 1  # the free answer never touched the data


def test_group_by_rows_keys_and_notices(run: tuple[asyncio.AbstractEventLoop, DpService]) -> None:
    result = answer(run, "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex WITH ACCURACY 100")
    assert [c.name for c in result.columns] == ["sex", "n"]
    assert result.columns[0].type_oid == ColumnType.TEXT
    assert [r[0] for r in result.rows] == ["Male", "Female"]
    assert len(result.notices) == 2 and "n [sex='Male']" in result.notices[0]


def test_budget_refusal_spends_nothing(run: tuple[asyncio.AbstractEventLoop, DpService]) -> None:
    with pytest.raises(BudgetExhausted) as raised:
        answer(run, "SELECT COUNT(*) FROM adult WITH ACCURACY 0.001 CONFIDENCE 0.99")
    assert raised.value.sqlstate == "53400"
    assert CountingReader.reads == 0
    _, service = run
    assert service.engine(CONFIG.cubes[0]).budget.remaining == CONFIG.cubes[0].total_budget


def test_no_accuracy_is_an_error() -> None:
    translator = type(TRANSLATOR)(CONFIG.cubes)  # no config defaults
    spec = translator.translate("SELECT COUNT(*) FROM adult")
    service = DpService(CONFIG.cubes, Reader.__new__(Reader))
    with pytest.raises(DpproxyError, match="no accuracy requested"):
        asyncio.run(service.answer(spec))


def test_interval_columns(run: tuple[asyncio.AbstractEventLoop, DpService]) -> None:
    result = answer(
        run,
        "SELECT COUNT(*) AS n, DP_INTERVAL_LOW(COUNT(*)), DP_INTERVAL_HIGH(COUNT(*)) "
        "FROM adult WHERE sex = 'Female' WITH ACCURACY 40",  # far from 0 and N: not cut
    )
    ((n, low, high),) = result.rows
    (reply,) = result.replies
    assert [c.name for c in result.columns] == ["n", "dp_interval_low", "dp_interval_high"]
    assert (low, high) == (reply.low, reply.high) and low <= n <= high
    assert high - low == pytest.approx(80, rel=1e-6)


def test_engine_calls_of_concurrent_answers_never_overlap(
    run: tuple[asyncio.AbstractEventLoop, DpService],
) -> None:
    """Engine work runs in worker threads, but one call at a time per table (its gate)."""
    loop, service = run
    engine = service.engine(CONFIG.cubes[0])
    spans: list[tuple[float, float]] = []

    def timed(method):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spans.append((started, time.perf_counter()))

        return call

    for name in ("plan", "execute", "measure", "record"):
        setattr(engine, name, timed(getattr(engine, name)))
    queries = [
        f"SELECT COUNT(*) FROM adult WHERE {c} WITH ACCURACY {a}"
        for c in ("age >= 25", "sex = 'Male'", "income = '>50K'", "age < 45")
        for a in (200, 300)
    ]

    async def all_at_once() -> list[DpResult]:
        return await asyncio.gather(*(service.answer(TRANSLATOR.translate(q)) for q in queries))

    results = loop.run_until_complete(all_at_once())
    assert {r.source for result in results for r in result.replies} >= {"fresh"}
    spans.sort()
    assert len(spans) >= 2 * len(queries)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))


def test_planning_past_its_time_limit_is_57014_and_the_table_still_answers(
    adult_dsn: str,
) -> None:
    roles = provision_roles(adult_dsn, CONFIG.cubes)

    async def scenario() -> tuple[str, float]:
        reader = await Reader.connect(roles.reader_dsn)
        try:
            impatient = DpService(CONFIG.cubes, reader, planning_timeout=1e-4)
            spec = TRANSLATOR.translate(
                "SELECT sex, race, COUNT(*) FROM adult GROUP BY sex, race WITH ACCURACY 200"
            )
            with pytest.raises(QueryCanceled, match="planning time limit") as raised:
                await impatient.answer(spec)
            impatient._planning_timeout = 60.0  # the abandoned plan still holds the engine
            again = await impatient.answer(spec)
            return raised.value.sqlstate, again.replies[0].estimate
        finally:
            await reader.close()

    sqlstate, estimate = asyncio.run(scenario())
    assert sqlstate == "57014" and estimate > 0


def test_a_failed_ledger_write_releases_and_charges_nothing(
    adult_dsn: str, ledger_schema: str
) -> None:
    """Record before release: the engine is charged only once the ledger store has committed."""
    roles = provision_roles(adult_dsn, CONFIG.cubes)
    schema = f'"{ledger_schema}"'
    spec = TRANSLATOR.translate("SELECT COUNT(*) FROM adult WITH ACCURACY 50")

    async def scenario() -> None:
        reader = await Reader.connect(roles.reader_dsn)
        ledger = await PostgresLedgerStore.open(adult_dsn, CONFIG.cubes, ledger_schema)
        try:
            service = await DpService.open_durable(CONFIG.cubes, reader, ledger)
            engine = service.engine(CONFIG.cubes[0])
            with psycopg.connect(adult_dsn, autocommit=True) as admin:
                admin.execute(
                    f"CREATE FUNCTION {schema}.disk_full() RETURNS trigger LANGUAGE plpgsql "
                    "AS $$BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = '53100'; "
                    "END$$"
                )
                admin.execute(
                    f"CREATE TRIGGER disk_full BEFORE INSERT ON {schema}.measurements "
                    f"FOR EACH ROW EXECUTE FUNCTION {schema}.disk_full()"
                )
            with pytest.raises(asyncpg.DiskFullError, match="could not extend file"):
                await service.answer(spec)
            assert engine.budget.spent == 0 and engine.history_size == 0
            with psycopg.connect(adult_dsn, autocommit=True) as admin:
                admin.execute(f"DROP TRIGGER disk_full ON {schema}.measurements")
            (reply,) = (await service.answer(spec)).replies
            assert reply.source == "fresh" and engine.budget.spent == reply.budget_charged
            assert engine.history_size == 1
            assert [s.entry.budget for s in await ledger.load(CONFIG.cubes[0])] == [
                reply.budget_charged
            ]
        finally:
            await ledger.close()
            await reader.close()

    asyncio.run(scenario())


def test_explain_names_the_most_a_cell_is_charged_and_then_it_is(
    run: tuple[asyncio.AbstractEventLoop, DpService],
) -> None:
    """The preview's charge is the most any cell pays: a GROUP BY's groups touch disjoint
    cells, so that is the largest group's charge, not their sum; the answer then spends it."""
    loop, service = run
    sql = "SELECT race, COUNT(*) FROM adult WHERE age < 35 GROUP BY race WITH ACCURACY 40"
    preview = loop.run_until_complete(service.preview([TRANSLATOR.translate(sql)]))
    (budget_line,) = [row[0] for row in preview.rows if str(row[0]).startswith("Budget:")]
    before = service.engine(CONFIG.cubes[0]).budget.spent
    result = answer(run, sql)
    charged = max(r.budget_charged for r in result.replies)
    assert {r.source for r in result.replies} == {"fresh"} and len(result.replies) == 5
    assert f"charges up to {format_budget(charged, up=True)} on the cells" in str(budget_line)
    assert service.engine(CONFIG.cubes[0]).budget.spent - before == charged
