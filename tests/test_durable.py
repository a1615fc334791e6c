"""The durable ledger in PostgreSQL: entries survive, cubes are pinned, writes are idempotent."""

from __future__ import annotations

import asyncio
import uuid
from fractions import Fraction

import numpy as np
import psycopg
import pytest

from proxy.engine.history import HistoryEntry
from proxy.errors import ConfigError
from proxy.storage.ledger_store import AnswerRecord, NewMeasurement
from proxy.storage.postgres_ledger import PostgresLedgerStore
from sqlmap.cube import CategoricalDimension, Cube, Measure, NumericDimension
from sqlmap.vector import LinearQuery

CUBE = Cube(
    "public",
    "people",
    (CategoricalDimension("sex", ("M", "F")), NumericDimension("age", (0, 50, 100))),
)


def measurement(
    weights: list[float] | np.ndarray, budget: Fraction, answer: float
) -> NewMeasurement:
    """A measurement of a tensor over the cube's shape (4 sexes, 5 ages: NULL and other bins),
    or of dense weights from cell 0 on (a list)."""
    if isinstance(weights, np.ndarray):
        query = LinearQuery.from_tensor(CUBE.shape, weights)
    else:
        dense = np.zeros(CUBE.n_cells)
        dense[: len(weights)] = weights
        query = LinearQuery.from_dense(dense)
    entry = HistoryEntry(CUBE.qualified_name, query, budget, Fraction(1), answer)
    return NewMeasurement(
        uuid.uuid4(), entry, 10.0, 0.95, "analyst", "SELECT ...", "fresh", 0.0, 10.0, 0.95
    )


def record(source: str, budget: Fraction) -> AnswerRecord:
    return AnswerRecord(source, budget, 1.0, 0.0, 2.0, 0.95, 1.0, 0.95, "analyst", "SELECT ...")


def test_entries_survive_reopening(pg_dsn: str, ledger_schema: str) -> None:
    async def run() -> None:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        first = measurement(np.array([[1.0], [0.0], [0.0], [0.0]]), Fraction(1, 10), 41.5)
        async with ledger.spending(CUBE) as spend:
            assert await spend.since(0) == []
            ids = await spend.append([first], Fraction(1, 10))
            # a retried write of the same entry does not create a second one
            assert await spend.append([first], Fraction(1, 5)) == []
        await ledger.record_answers(CUBE, [record("fresh", Fraction(1, 10))])
        await ledger.record_answers(CUBE, [record("history", Fraction(0))])
        await ledger.close()

        reopened = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        (stored,) = await reopened.load(CUBE)
        assert stored.id == ids[0] and stored.key == first.key
        assert stored.entry.budget == Fraction(1, 10) and stored.entry.noisy_answer == 41.5
        assert stored.entry.query == first.entry.query and stored.user == "analyst"
        assert stored.entry.query.factored  # as it was measured: no cell listed
        assert await reopened.load(CUBE, after_id=stored.id) == []
        await reopened.close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        vectors = conn.execute(
            "SELECT cells, weights, axes, core_index, core_weights, n_weighed "
            f'FROM "{ledger_schema}".measurements'
        ).fetchall()
        spent = conn.execute(f'SELECT most_spent FROM "{ledger_schema}".tables').fetchall()
        sources = conn.execute(
            f'SELECT source FROM "{ledger_schema}".answers ORDER BY id'
        ).fetchall()
    # sex = 'M': the sex dimension alone, its first value (5 cells, one per age)
    assert vectors == [(None, None, [0], [0], [1.0], 5)]
    assert spent == [(0.1,)]  # the retry wrote nothing, so it spent nothing
    assert sources == [("fresh",), ("history",)]


def test_a_batch_is_written_in_order_and_a_retry_only_adds_what_is_missing(
    pg_dsn: str, ledger_schema: str
) -> None:
    """A GROUP BY's measurements go in one statement; each row keeps its own vector."""
    batch = [
        measurement(np.array([[1.0, 0.0, 2.5, 0.0, 0.0]]), Fraction(1, 8), 3.0),  # by age
        measurement(np.ones((1, 1)), Fraction(1, 4), -2.0),  # COUNT(*): no dimension
        measurement([0, 0, 0, 1], Fraction(1, 2), 7.25),  # cell by cell: stored factored
    ]

    async def run() -> None:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        async with ledger.spending(CUBE) as spend:
            (first,) = await spend.append(batch[1:2], Fraction(1, 4))
        async with ledger.spending(CUBE) as spend:  # a retry of the whole batch
            ids = await spend.append(batch, Fraction(7, 8))
            assert await spend.append([], Fraction(1)) == []
        assert len(ids) == 2 and first < ids[0] < ids[1]
        stored = await ledger.load(CUBE)
        assert [s.id for s in stored] == [first, *ids]
        assert [s.key for s in stored] == [batch[1].key, batch[0].key, batch[2].key]
        for s, m in zip(stored, [batch[1], batch[0], batch[2]]):
            assert s.entry == m.entry and s.entry.query.factored
        await ledger.close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT axes, core_index, core_weights, sql_text, source "
            f'FROM "{ledger_schema}".measurements ORDER BY id'
        ).fetchall()
        spent = conn.execute(f'SELECT most_spent FROM "{ledger_schema}".tables').fetchall()
    assert [r[:3] for r in rows] == [
        ([], [0], [1.0]),
        ([1], [0, 2], [1.0, 2.5]),
        ([0, 1], [3], [1.0]),  # sex 0, age 3: both dimensions
    ]
    assert {r[3:] for r in rows} == {("SELECT ...", "fresh")}
    assert spent == [(0.875,)]  # the most of what each write said


def test_changed_cube_is_refused(pg_dsn: str, ledger_schema: str) -> None:
    other = Cube("public", "people", (CategoricalDimension("sex", ("M", "F", "X")),))

    async def run() -> None:
        await (await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)).close()
        with pytest.raises(
            ConfigError, match="the cube differs from the one its ledger was written for"
        ):
            await PostgresLedgerStore.open(pg_dsn, [other], ledger_schema)
        # a measure added to the same dimensions changes the vectors too
        measured = Cube("public", "people", CUBE.dimensions, measures=(Measure("w", 0, 10),))
        with pytest.raises(ConfigError) as refused:
            await PostgresLedgerStore.open(pg_dsn, [measured], ledger_schema)
        assert "dimensions or measures changed" in (refused.value.detail or "")
        assert "dpproxy ledger rekey" in (refused.value.hint or "")

    asyncio.run(run())


def test_spending_lock_serializes_writers(pg_dsn: str, ledger_schema: str) -> None:
    async def run() -> list[str]:
        a = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        b = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        events: list[str] = []

        async def hold(ledger: PostgresLedgerStore, name: str) -> None:
            async with ledger.spending(CUBE):
                events.append(f"{name} in")
                await asyncio.sleep(0.2)
                events.append(f"{name} out")

        await asyncio.gather(hold(a, "a"), hold(b, "b"))
        await a.close()
        await b.close()
        return events

    events = asyncio.run(run())
    assert events in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])


def test_views_show_budget_and_history(pg_dsn: str, ledger_schema: str) -> None:
    async def run() -> None:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        async with ledger.spending(CUBE) as spend:
            new = measurement(np.array([[1.0], [0.0], [0.0], [0.0]]), Fraction(1, 4), 12.0)
            await spend.append([new], Fraction(1, 4))
        async with ledger.spending(CUBE) as spend:
            new = measurement(np.array([[0.0, 1.0, 1.0, 0.0, 0.0]]), Fraction(1, 8), 3.0)
            await spend.append([new], Fraction(3, 8))  # cells (M, ages 1-2) paid both
        await ledger.record_answers(
            CUBE,
            [record(source, Fraction(0)) for source in ("fresh", "combined", "history", "refused")],
        )
        await ledger.close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        budget = conn.execute(
            "SELECT table_name, total, spent, remaining, fresh, combined, history, refused "
            "FROM dp.budget"
        ).fetchall()
        history = conn.execute(
            "SELECT h.table_name, user_name, source, n_cells, axes, core_shape, core_index, "
            "core_weights, budget, "
            "noisy_answer, half_width, confidence, reusable "
            "FROM dp.history h JOIN dp.history_vectors USING (id) ORDER BY id"
        ).fetchall()
    assert budget == [("public.people", 1.0, 0.375, 0.625, 1, 1, 1, 1)]
    assert history == [  # n_cells: the cells weighed (5 ages of one sex; 2 ages of 4 sexes)
        ("public.people", "analyst", "fresh", 5, [0], [1, 4], [0], [1.0])
        + (0.25, 12.0, 10.0, 0.95, True),
        ("public.people", "analyst", "fresh", 8, [1], [1, 5], [1, 2], [1.0, 1.0])
        + (0.125, 3.0, 10.0, 0.95, True),
    ]


def test_ledger_of_an_earlier_layout_is_upgraded(pg_dsn: str, ledger_schema: str) -> None:
    """Development builds kept per-cell spend in a float8[] column of ``tables``."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE SCHEMA "{ledger_schema}"; CREATE TABLE "{ledger_schema}".tables ('
            "id serial PRIMARY KEY, name text NOT NULL UNIQUE, fingerprint text NOT NULL, "
            "n_cells integer NOT NULL, data_version integer NOT NULL DEFAULT 1, "
            "carried text NOT NULL DEFAULT '0', spent float8[] NOT NULL, "
            "created_at timestamptz NOT NULL DEFAULT now())"
        )

    async def run() -> None:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        async with ledger.spending(CUBE) as spend:
            new = measurement([1], Fraction(1, 2), 5.0)
            assert await spend.append([new], Fraction(1))
        await ledger.close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT spent FROM dp.budget").fetchall() == [(1.0,)]


def test_concurrent_answers_share_audit_writes(pg_dsn: str, ledger_schema: str) -> None:
    async def run() -> None:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        await asyncio.gather(
            *(ledger.record_answers(CUBE, [record("history", Fraction(0))]) for _ in range(300))
        )
        # a caller returns only once its rows are written: the next one sees them all
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute("SELECT history FROM dp.budget").fetchone() == (300,)
        await ledger.close()

    asyncio.run(run())


def test_an_older_history_view_is_replaced(pg_dsn: str, ledger_schema: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS dp")
        conn.execute("DROP VIEW IF EXISTS dp.history")
        # the shape before: per-cell arrays and requested_eps
        conn.execute(
            "CREATE VIEW dp.history AS SELECT 1 AS id, ARRAY[1] AS cells, "
            "ARRAY[1.0] AS weights, 2.0::float8 AS requested_eps"
        )

    async def run() -> None:
        await (await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)).close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'dp.history'::regclass "
                "AND attnum > 0 ORDER BY attnum"
            )
        ]
    assert "cells" not in columns and "requested_eps" not in columns
    assert {"n_cells", "requested_accuracy", "sql_text", "budget"} <= set(columns)


#: A ledger as written before vectors were stored factored: cell lists, and a row of
#: ``cell_spend`` per charged cell that dp.budget read.
_BEFORE_FACTORED = """
CREATE SCHEMA {s};
CREATE TABLE {s}.tables (id serial PRIMARY KEY, name text NOT NULL UNIQUE,
    fingerprint text NOT NULL, n_cells integer NOT NULL, measures text NOT NULL DEFAULT '[]',
    data_version integer NOT NULL DEFAULT 1, carried text NOT NULL DEFAULT '0',
    total_budget float8, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE {s}.cell_spend (table_id integer NOT NULL REFERENCES {s}.tables (id),
    cell integer NOT NULL, spent float8 NOT NULL, PRIMARY KEY (table_id, cell));
CREATE TABLE {s}.measurements (id bigserial PRIMARY KEY, entry_key uuid NOT NULL UNIQUE,
    table_id integer NOT NULL REFERENCES {s}.tables (id), fingerprint text NOT NULL,
    data_version integer NOT NULL, cells integer[] NOT NULL, weights float8[] NOT NULL,
    sensitivity float8 NOT NULL, budget text NOT NULL, step text NOT NULL,
    noisy_answer float8 NOT NULL, source text, query_offset float8, half_width float8,
    confidence float8, requested_eps float8, requested_confidence float8, user_name text,
    sql_text text, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE {s}.answers (id bigserial PRIMARY KEY,
    table_id integer NOT NULL REFERENCES {s}.tables (id), source text NOT NULL,
    budget text NOT NULL, estimate float8, low float8, high float8, confidence float8,
    requested_eps float8, requested_confidence float8, user_name text, sql_text text,
    created_at timestamptz NOT NULL DEFAULT now());
DROP VIEW IF EXISTS dp.budget, dp.history, dp.history_vectors;
CREATE VIEW dp.budget AS
SELECT t.name AS table_name, t.total_budget AS total, s.spent,
       greatest(t.total_budget - s.spent, 0) AS remaining,
       a.fresh, a.combined, a.history, a.refused
FROM {s}.tables t
CROSS JOIN LATERAL (SELECT t.carried::float8 + coalesce(max(c.spent), 0) AS spent
                    FROM {s}.cell_spend c WHERE c.table_id = t.id) s
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE source = 'fresh') AS fresh,
           count(*) FILTER (WHERE source = 'combined') AS combined,
           count(*) FILTER (WHERE source = 'history') AS history,
           count(*) FILTER (WHERE source = 'refused') AS refused
    FROM {s}.answers WHERE table_id = t.id) a;
CREATE VIEW dp.history AS
SELECT m.id, t.name AS table_name, m.created_at, m.user_name, m.source, m.sql_text,
       cardinality(m.cells) AS n_cells, m.budget::float8 AS budget, m.noisy_answer,
       m.requested_eps AS requested_accuracy, m.requested_confidence, m.half_width,
       m.confidence, (m.fingerprint = t.fingerprint AND m.data_version = t.data_version)
       AS reusable
FROM {s}.measurements m JOIN {s}.tables t ON t.id = m.table_id;
CREATE VIEW dp.history_vectors AS
SELECT m.id, t.name AS table_name, m.cells, m.weights, m.query_offset, m.sensitivity
FROM {s}.measurements m JOIN {s}.tables t ON t.id = m.table_id;
INSERT INTO {s}.tables (name, fingerprint, n_cells, total_budget)
    VALUES ('public.people', '{fingerprint}', 20, 1);
INSERT INTO {s}.measurements (entry_key, table_id, fingerprint, data_version, cells, weights,
    sensitivity, budget, step, noisy_answer, source)
    VALUES (gen_random_uuid(), 1, '{fingerprint}', 1, '{{0,1,7}}', '{{1,1,0.5}}', 1, '1/10', '1',
            41.5, 'fresh');
INSERT INTO {s}.cell_spend VALUES (1, 0, 0.1), (1, 1, 0.1), (1, 7, 0.05);
"""


def test_a_ledger_of_cell_lists_is_upgraded_and_its_rows_still_load(
    pg_dsn: str, ledger_schema: str
) -> None:
    """Old rows load as they were written; the spend of ``cell_spend`` moves to the table."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {ledger_schema} CASCADE")
        layout = _BEFORE_FACTORED.format(s=f'"{ledger_schema}"', fingerprint=CUBE.fingerprint)
        conn.execute(layout)  # type: ignore[arg-type]
    old = np.zeros(CUBE.n_cells)
    old[[0, 1, 7]] = [1.0, 1.0, 0.5]
    new = measurement(np.array([[0.0], [1.0], [0.0], [0.0]]), Fraction(1, 5), 7.0)

    async def run() -> None:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        (stored,) = await ledger.load(CUBE)
        assert stored.entry.query == LinearQuery.from_dense(old)
        assert not stored.entry.query.factored and stored.entry.budget == Fraction(1, 10)
        with psycopg.connect(pg_dsn) as conn:
            assert conn.execute("SELECT spent FROM dp.budget").fetchall() == [(0.1,)]
        async with ledger.spending(CUBE) as spend:  # sex = 'F': cell 7 already paid 1/20
            await spend.append([new], Fraction(1, 4))
        await ledger.close()
        reopened = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        assert [s.entry for s in await reopened.load(CUBE)] == [stored.entry, new.entry]
        await reopened.close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(
            "SELECT to_regclass(%s)", (f"{ledger_schema}.cell_spend",)
        ).fetchone() == (None,)
        assert conn.execute("SELECT spent FROM dp.budget").fetchall() == [(0.25,)]
        vectors = conn.execute(
            "SELECT n_cells, cells, weights, axes, core_index, core_weights FROM dp.history "
            "JOIN dp.history_vectors USING (id) ORDER BY id"
        ).fetchall()
    assert vectors == [
        (3, [0, 1, 7], [1.0, 1.0, 0.5], None, None, None),
        (5, None, None, [0], [1], [1.0]),
    ]
