"""The durable ledger in PostgreSQL: entries survive, cubes are pinned, writes are idempotent."""

from __future__ import annotations

import asyncio
import uuid
from fractions import Fraction

import numpy as np
import psycopg
import pytest

from proxy.engine.budget import Charges
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


def measurement(weights: list[float], budget: Fraction, answer: float) -> NewMeasurement:
    dense = np.zeros(CUBE.n_cells)
    dense[: len(weights)] = weights
    entry = HistoryEntry(
        CUBE.qualified_name, LinearQuery.from_dense(dense), budget, Fraction(1), answer
    )
    return NewMeasurement(
        uuid.uuid4(), entry, 10.0, 0.95, "analyst", "SELECT ...", "fresh", 0.0, 10.0, 0.95
    )


def record(source: str, budget: Fraction) -> AnswerRecord:
    return AnswerRecord(source, budget, 1.0, 0.0, 2.0, 0.95, 1.0, 0.95, "analyst", "SELECT ...")


def test_entries_survive_reopening(pg_dsn: str, ledger_schema: str) -> None:
    async def run() -> None:
        ledger = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        first = measurement([1, 1], Fraction(1, 10), 41.5)
        async with ledger.spending(CUBE) as spend:
            assert await spend.since(0) == []
            ids = await spend.append([first], Charges.of([first.entry]))
            # a retried write of the same entry does not create a second one
            assert await spend.append([first], Charges.of([first.entry])) == []
        await ledger.record_answers(CUBE, [record("fresh", Fraction(1, 10))])
        await ledger.record_answers(CUBE, [record("history", Fraction(0))])
        await ledger.close()

        reopened = await PostgresLedgerStore.open(pg_dsn, [CUBE], ledger_schema)
        (stored,) = await reopened.load(CUBE)
        assert stored.id == ids[0] and stored.key == first.key
        assert stored.entry.budget == Fraction(1, 10) and stored.entry.noisy_answer == 41.5
        assert stored.entry.query == first.entry.query and stored.user == "analyst"
        assert await reopened.load(CUBE, after_id=stored.id) == []
        await reopened.close()

    asyncio.run(run())
    with psycopg.connect(pg_dsn) as conn:
        spent = conn.execute(
            f'SELECT cell, spent FROM "{ledger_schema}".cell_spend ORDER BY cell'
        ).fetchall()
        sources = conn.execute(
            f'SELECT source FROM "{ledger_schema}".answers ORDER BY id'
        ).fetchall()
    assert spent == [(0, 0.1), (1, 0.1)]  # only the cells the measurement touched
    assert sources == [("fresh",), ("history",)]


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
            new = measurement([1, 1], Fraction(1, 4), 12.0)
            await spend.append([new], Charges.of([new.entry]))
        async with ledger.spending(CUBE) as spend:
            new = measurement([0, 1, 1], Fraction(1, 8), 3.0)
            await spend.append([new], Charges.of([new.entry]))
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
            "SELECT h.table_name, user_name, source, n_cells, cells, weights, budget, "
            "noisy_answer, half_width, confidence, reusable "
            "FROM dp.history h JOIN dp.history_vectors USING (id) ORDER BY id"
        ).fetchall()
    # cell 1 paid both: 1/4 + 1/8
    assert budget == [("public.people", 1.0, 0.375, 0.625, 1, 1, 1, 1)]
    assert history == [
        ("public.people", "analyst", "fresh", 2, [0, 1], [1.0, 1.0], 0.25, 12.0, 10.0, 0.95, True),
        ("public.people", "analyst", "fresh", 2, [1, 2], [1.0, 1.0], 0.125, 3.0, 10.0, 0.95, True),
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
            assert await spend.append([new], Charges.of_query(new.entry.query, Fraction(1)))
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
