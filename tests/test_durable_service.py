"""DP answers through the durable ledger: restart keeps history, sharing never overspends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import psycopg
import pytest

from proxy.config import load_config
from proxy.dp.answering import DpService
from proxy.engine.budget import CellBudget, UserCaps, cell_charges, float_up
from proxy.engine.engine import Plan, QueryRequest
from proxy.errors import BudgetExhausted
from proxy.storage.postgres_ledger import PostgresLedgerStore, stored_query
from proxy.storage.provision import BackendRoles
from proxy.storage.reader import Reader
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
TRANSLATOR = CONFIG.translator()
(CUBE,) = CONFIG.cubes


async def open_service(
    dsn: str, roles: BackendRoles, ledger_schema: str, cube: Cube = CUBE
) -> tuple[DpService, PostgresLedgerStore, Reader]:
    ledger = await PostgresLedgerStore.open(dsn, [cube], ledger_schema)
    reader = await Reader.connect(roles.reader_dsn)
    return await DpService.open_durable([cube], reader, ledger), ledger, reader


def test_restart_keeps_answers_free(pg_dsn: str, roles: BackendRoles, ledger_schema: str) -> None:
    sql = "SELECT sex, COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 30"

    async def run() -> None:
        service, ledger, reader = await open_service(pg_dsn, roles, ledger_schema)
        first = await service.answer(TRANSLATOR.translate(sql), user="analyst", sql=sql)
        assert {r.source for r in first.replies} == {"fresh"}
        spent = service.engine(CUBE).budget.spent
        await ledger.close()
        await reader.close()

        service, ledger, reader = await open_service(pg_dsn, roles, ledger_schema)
        assert service.engine(CUBE).budget.spent == spent  # recomputed exactly from the ledger
        again = await service.answer(TRANSLATOR.translate(sql), user="analyst", sql=sql)
        assert {r.source for r in again.replies} == {"history"}
        assert [r.estimate for r in again.replies] == pytest.approx(
            [r.estimate for r in first.replies], rel=1e-9
        )
        await ledger.close()
        await reader.close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        counts = dict(
            conn.execute(
                f'SELECT source, count(*) FROM "{ledger_schema}".answers GROUP BY 1'
            ).fetchall()
        )
    assert counts == {"fresh": 2, "history": 2}


def test_two_services_sharing_a_ledger_never_overspend(
    pg_dsn: str, roles: BackendRoles, ledger_schema: str
) -> None:
    tight = Cube(CUBE.schema, CUBE.table, CUBE.dimensions, 0.05, measures=CUBE.measures)
    conditions = [
        "sex = 'Male'",
        "race = 'White'",
        "age < 45",
        "income = '>50K'",
        "education = 'HS-grad'",
        "hours_per_week >= 41",
        "capital_gain >= 1",
        "age >= 25",
        "race <> 'Black'",
        "sex = 'Female'",
    ]
    # overlapping queries: each costs ln(10)/150 = 0.0154 on its cells, so a cell fits three
    queries = [
        f"SELECT COUNT(*) FROM adult WHERE {c} WITH ACCURACY 150 CONFIDENCE 0.9" for c in conditions
    ] * 2
    translator = type(TRANSLATOR)([tight], CONFIG.privacy.defaults)

    async def run() -> tuple[int, int]:
        a = await open_service(pg_dsn, roles, ledger_schema, tight)
        b = await open_service(pg_dsn, roles, ledger_schema, tight)
        outcomes = {"ok": 0, "refused": 0}

        async def client(service: DpService, sqls: list[str]) -> None:
            for sql in sqls:
                try:
                    await service.answer(translator.translate(sql))
                    outcomes["ok"] += 1
                except BudgetExhausted:
                    outcomes["refused"] += 1

        await asyncio.wait_for(
            asyncio.gather(*(client(s[0], queries[i::4]) for i, s in enumerate([a, b, a, b]))),
            timeout=120,
        )
        for _service, ledger, reader in (a, b):
            await ledger.close()
            await reader.close()
        return outcomes["ok"], outcomes["refused"]

    ok, refused = asyncio.run(run())
    assert ok + refused == len(queries) and refused > 0 and ok > 0
    # independent recomputation of every cell's spend from the stored measurements, cell by
    # cell; the ledger's most_spent, written by both, is the most of it
    recomputed = CellBudget("check", total=Fraction(10**9))
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT t.n_cells, t.measures, t.shape, m.axes, m.core_index, m.core_weights, "
            "m.budget "
            f'FROM "{ledger_schema}".measurements m JOIN "{ledger_schema}".tables t '
            "ON t.id = m.table_id"
        ).fetchall()
        (most_spent,) = conn.execute(f'SELECT most_spent FROM "{ledger_schema}".tables').fetchone()
    for n_cells, measures, shape, axes, index, weights, budget in rows:
        query = stored_query(
            n_cells, measures, shape, axes=axes, core_index=index, core_weights=weights
        )
        listed = LinearQuery(query.n_cells, query.cells, query.weights, measures=query.measures)
        recomputed.commit(cell_charges(listed, Fraction(budget)))
    assert 0 < recomputed.spent <= Fraction(tight.total_budget)
    assert most_spent == float_up(recomputed.spent)


def test_refusal_is_decided_on_the_shared_history(
    pg_dsn: str, roles: BackendRoles, ledger_schema: str
) -> None:
    """B exhausted the Male cells itself; A measured the Female cells. Together they answer
    the total for free, which B's own view alone would refuse."""
    tight = Cube(CUBE.schema, CUBE.table, CUBE.dimensions, total_budget=0.08)
    translator = type(TRANSLATOR)([tight], CONFIG.privacy.defaults)

    def ask(where: str, accuracy: int) -> str:
        return f"SELECT COUNT(*) FROM adult{where} WITH ACCURACY {accuracy} CONFIDENCE 0.9"

    async def run() -> None:
        a = await open_service(pg_dsn, roles, ledger_schema, tight)
        b = await open_service(pg_dsn, roles, ledger_schema, tight)
        males = await b[0].answer(translator.translate(ask(" WHERE sex = 'Male'", 30)))
        females = await a[0].answer(translator.translate(ask(" WHERE sex = 'Female'", 30)))
        assert {males.replies[0].source, females.replies[0].source} == {"fresh"}
        total = translator.translate(ask("", 100))
        with pytest.raises(BudgetExhausted):  # B alone cannot: its Male cells are spent
            b[0].engine(tight).plan([QueryRequest(q, total.accuracy) for q in total.queries])
        answer = await b[0].answer(total)
        assert answer.replies[0].source == "history"
        assert answer.replies[0].budget_charged == 0
        for _service, ledger, reader in (a, b):
            await ledger.close()
            await reader.close()

    asyncio.run(run())


def test_a_fresh_answer_is_planned_once_unless_the_history_moved(
    pg_dsn: str, roles: BackendRoles, ledger_schema: str
) -> None:
    """The plan that found a measurement needed is the one spent, unless another process wrote
    an entry meanwhile: then it is made again, and here B's entry answers A's query for free."""
    sql = "SELECT COUNT(*) FROM adult WHERE age < 35 WITH ACCURACY 40"
    plans: list[int] = []

    async def run() -> None:
        a = await open_service(pg_dsn, roles, ledger_schema)
        b = await open_service(pg_dsn, roles, ledger_schema)
        engine = a[0].engine(CUBE)
        real_plan = engine.plan

        def counted(requests: Sequence[QueryRequest]) -> Plan:
            plans.append(engine.history_size)
            return real_plan(requests)

        engine.plan = counted  # type: ignore[method-assign]
        first = await a[0].answer(TRANSLATOR.translate(sql.replace("age < 35", "age >= 35")))
        assert first.replies[0].source == "fresh" and plans == [0]
        fresh = await b[0].answer(TRANSLATOR.translate(sql))
        assert fresh.replies[0].source == "fresh"
        # A's own view needs a measurement; under the ledger's lock it absorbs B's entry
        again = await a[0].answer(TRANSLATOR.translate(sql))
        assert again.replies[0].source == "history" and again.replies[0].budget_charged == 0
        assert plans == [0, 1, 2]
        for _service, ledger, reader in (a, b):
            await ledger.close()
            await reader.close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{ledger_schema}".measurements').fetchone()
    assert row == (2,)


def test_user_caps_survive_restart(pg_dsn: str, roles: BackendRoles, ledger_schema: str) -> None:
    caps = UserCaps(Fraction(1, 20), {"dba": Fraction(1)})
    # ln(10)/100 = 0.023 per query: two fit alice's 0.05 on the same cells, a third does not
    queries = [
        f"SELECT COUNT(*) FROM adult WHERE {c} WITH ACCURACY 100 CONFIDENCE 0.9"
        for c in ("sex = 'Male'", "age < 45", "race = 'White'")
    ]

    async def open_capped() -> tuple[DpService, PostgresLedgerStore, Reader]:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        reader = await Reader.connect(roles.reader_dsn)
        return await DpService.open_durable([CUBE], reader, ledger, caps=caps), ledger, reader

    async def run() -> None:
        service, ledger, reader = await open_capped()
        for sql in queries[:2]:
            await service.answer(TRANSLATOR.translate(sql), user="alice", sql=sql)
        await ledger.close()
        await reader.close()

        service, ledger, reader = await open_capped()  # alice's spend is read back
        with pytest.raises(BudgetExhausted, match='budget of user "alice" on table') as refused:
            await service.answer(TRANSLATOR.translate(queries[2]), user="alice")
        assert "the user has spent 0.046" in (refused.value.detail or "")
        loose = queries[0].replace("ACCURACY 100", "ACCURACY 1000")
        again = await service.answer(TRANSLATOR.translate(loose), user="alice")
        assert again.replies[0].source == "history"  # free answers are never capped
        other = await service.answer(TRANSLATOR.translate(queries[2]), user="bob")
        assert other.replies[0].source == "fresh"  # bob has a cap of his own
        tight = TRANSLATOR.translate(queries[2].replace("ACCURACY 100", "ACCURACY 20"))
        assert (await service.answer(tight, user="dba")).replies[0].budget_charged > caps.default
        await ledger.close()
        await reader.close()

    asyncio.run(run())


def test_a_restarted_service_decides_as_the_one_that_wrote_the_ledger(
    pg_dsn: str, roles: BackendRoles, ledger_schema: str
) -> None:
    """Factored vectors over a cube with measures (counts, sums, GROUP BYs, a SUM(CASE ...)),
    read back from the ledger: the same history, budget per cell and decisions as before."""
    stream = [
        "SELECT sex, COUNT(*) FROM adult GROUP BY sex WITH ACCURACY 40",
        "SELECT COUNT(*) FROM adult WHERE age >= 25 AND age < 45 AND race = 'White' "
        "WITH ACCURACY 30",
        "SELECT income, SUM(capital_gain) FROM adult GROUP BY income WITH ACCURACY 400000",
        "SELECT SUM(hours_per_week) FROM adult WHERE education IN ('Bachelors', 'Masters') "
        "WITH ACCURACY 20000",
        "SELECT race, sex, COUNT(*) FROM adult WHERE income = '>50K' GROUP BY race, sex "
        "WITH ACCURACY 60",
        "SELECT SUM(CASE WHEN sex = 'Female' THEN age ELSE 0 END) FROM adult WITH ACCURACY 30000",
        "SELECT COUNT(*) FROM adult WHERE hours_per_week >= 41 WITH ACCURACY 25",
    ]
    probes = [
        *stream,
        "SELECT COUNT(*) FROM adult WITH ACCURACY 30",  # the groups by sex add up to it
        "SELECT COUNT(*) FROM adult WHERE sex = 'Male' WITH ACCURACY 20",  # combined or fresh
        "SELECT education, SUM(capital_loss) FROM adult GROUP BY education WITH ACCURACY 100000",
        "SELECT race, COUNT(*) FROM adult WHERE income = '>50K' GROUP BY race WITH ACCURACY 80",
    ]

    def plan(service: DpService, sql: str) -> Plan:
        spec = TRANSLATOR.translate(sql)
        return service.engine(CUBE).plan([QueryRequest(q, spec.accuracy) for q in spec.queries])

    async def run() -> None:
        writer, ledger, reader = await open_service(pg_dsn, roles, ledger_schema)
        for sql in stream:
            await writer.answer(TRANSLATOR.translate(sql), user="analyst", sql=sql)
        restarted, other_ledger, other_reader = await open_service(pg_dsn, roles, ledger_schema)
        before, after = writer.engine(CUBE), restarted.engine(CUBE)
        assert after.history_shape == before.history_shape and before.history_size > 10
        assert after.budget.spent == before.budget.spent
        assert after.budget.per_cell() == before.budget.per_cell()
        sources = set()
        for sql in probes:
            planned, replanned = plan(writer, sql), plan(restarted, sql)
            assert replanned.measurements == planned.measurements
            assert replanned.charges.items == planned.charges.items
            sources |= {d.source for d in planned.decisions}
            for a, b in zip(planned.decisions, replanned.decisions, strict=True):
                assert (b.source, b.budget, b.step) == (a.source, a.budget, a.step), sql
                assert b.half_width == pytest.approx(a.half_width, rel=1e-9)
                assert b.confidence == pytest.approx(a.confidence, rel=1e-9)
        assert sources == {"history", "fresh", "combined"}
        # what history answers, it answers alike
        sql = stream[0]
        again = await restarted.answer(TRANSLATOR.translate(sql))
        replies = list(again.replies)
        assert {r.source for r in replies} == {"history"}
        first = await writer.answer(TRANSLATOR.translate(sql))
        assert [r.estimate for r in replies] == pytest.approx(
            [r.estimate for r in first.replies], rel=1e-9
        )
        for closing in (ledger, reader, other_ledger, other_reader):
            await closing.close()

    asyncio.run(run())


def test_a_restart_from_many_rational_budgets_holds_what_the_live_engine_spent(
    pg_dsn: str, roles: BackendRoles, ledger_schema: str
) -> None:
    """A ledger of hundreds of distinct SQL vectors (several blocks of the bulk placement),
    each measured with budgets that are distinct exact rationals (denominators with no common
    factor, as fresh answers at different accuracies spend): read back by a restart, the
    spend per cell is exactly what an engine that took the entries one at a time (placing
    them as it solved between them) spent, and it decides as that engine does."""
    import dataclasses
    import random
    import uuid

    from proxy.engine import PrivacyEngine, SeededRandomSource
    from proxy.engine.history import HistoryEntry
    from proxy.storage.ledger_store import NewMeasurement

    rng = random.Random(5)
    keys = ("sex", "race", "income", "education")
    vectors: list[LinearQuery] = []
    while len(vectors) < 400:
        grouped = ", ".join(rng.sample(keys, rng.randint(1, 3)))
        age = rng.choice((25, 35, 45, 55))
        sql = (
            f"SELECT {grouped}, COUNT(*) FROM adult WHERE age >= {age} GROUP BY {grouped} "
            "WITH ACCURACY 50"
            if rng.random() < 0.7
            else f"SELECT SUM(hours_per_week) FROM adult WHERE age < {age} AND "
            f"sex = '{rng.choice(('Male', 'Female'))}' WITH ACCURACY 9000"
        )
        vectors.extend(q.without_offset() for q in TRANSLATOR.translate(sql).queries)
    primes = [p for p in range(1009, 20000) if all(p % d for d in range(2, 142))]
    entries = []
    for i in range(900):
        query = vectors[i % len(vectors)] if i < len(vectors) else rng.choice(vectors)
        budget = Fraction(rng.randint(1, 400), rng.choice(primes))
        step = Fraction(1, 2 ** rng.randint(4, 9))
        entries.append(HistoryEntry(CUBE.qualified_name, query, budget, step, rng.gauss(500, 80)))
    cube = dataclasses.replace(CUBE, total_budget=10_000.0)
    live = PrivacyEngine(
        cube.qualified_name,
        cube.n_coordinates,
        total_budget=Fraction(10_000),
        rng=SeededRandomSource(1),
        measures=cube.measure_reach,
        shape=cube.shape,
    )
    probe = TRANSLATOR.translate("SELECT race, COUNT(*) FROM adult GROUP BY race WITH ACCURACY 40")
    for start in range(0, len(entries), 45):
        live.absorb(entries[start : start + 45])
        live.plan([QueryRequest(q, probe.accuracy) for q in probe.queries])  # placed now

    async def run() -> None:
        ledger = await PostgresLedgerStore.open(pg_dsn, [cube], ledger_schema)
        for start in range(0, len(entries), 300):
            part = entries[start : start + 300]
            async with ledger.spending(cube) as spend:
                await spend.append(
                    [
                        NewMeasurement(uuid.uuid4(), e, 50.0, 0.95, None, None, "fresh", 0, 1, 1)
                        for e in part
                    ],
                    live.budget.spent,
                )
        await ledger.close()
        service, ledger, reader = await open_service(pg_dsn, roles, ledger_schema, cube)
        restarted = service.engine(cube)
        size, distinct, rank = restarted.history_shape
        assert (size, distinct, rank) == live.history_shape
        assert distinct > 4 * 64 and rank is not None and rank > 64
        assert restarted.budget.per_cell() == live.budget.per_cell()
        assert restarted.budget.spent == live.budget.spent
        sources = set()
        for sql in (
            "SELECT sex, income, COUNT(*) FROM adult WHERE age >= 35 GROUP BY sex, income "
            "WITH ACCURACY 50",
            "SELECT race, COUNT(*) FROM adult GROUP BY race WITH ACCURACY 40",
            "SELECT COUNT(*) FROM adult WHERE age >= 45 AND race = 'White' WITH ACCURACY 20",
            "SELECT education, COUNT(*) FROM adult WHERE age < 25 GROUP BY education "
            "WITH ACCURACY 30",
            "SELECT SUM(hours_per_week) FROM adult WHERE age < 35 WITH ACCURACY 9000",
        ):
            spec = TRANSLATOR.translate(sql)
            requests = [QueryRequest(q, spec.accuracy) for q in spec.queries]
            planned, replanned = live.plan(requests), restarted.plan(requests)
            assert replanned.measurements == planned.measurements, sql
            for a, b in zip(planned.decisions, replanned.decisions, strict=True):
                sources.add(a.source)
                assert b.source == a.source, sql
                # a combined budget may take one step (1e-9) more on one side: the two
                # engines factor the history in different orders (tests/engine/test_restart)
                one_step = 1.01e-9 if a.source == "combined" else 0.0
                assert float(b.budget) == pytest.approx(float(a.budget), rel=one_step), sql
                assert b.half_width == pytest.approx(a.half_width, rel=1e-9)
                assert b.confidence == pytest.approx(a.confidence, rel=1e-9)
        assert {"history", "fresh"} <= sources
        await ledger.close()
        await reader.close()

    asyncio.run(run())
