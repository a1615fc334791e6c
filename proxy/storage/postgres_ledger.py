"""The ledger store in PostgreSQL: every released measurement, every answer, and the budget.

Layout, in a schema of its own (``dpproxy`` by default) that analysts cannot reach:

* ``tables``: one row per protected table: the fingerprint of its cube (history vectors are
  only meaningful over the cube they were computed on), its cells and its measures' reaches
  (JSON: what one row adds to a cell's sum, which decides what a vector charged each cell),
  its data version and total budget.
* ``cell_spend``: the budget each cell has spent, rounded up to float8, updated for the cells a
  measurement touches (for inspection and ``dp.budget``; the exact ledger is recomputed from the
  measurements on load).
* ``measurements``: one row per released noisy measurement, the papers' (H_i, alpha_i, y_i), with
  the request and the answer it served; noise is drawn once per entry and stored, keyed by an id
  drawn before the write, so a retried write never creates a second, independently noised entry.
* ``answers``: one row per answer given or refused (history, fresh, combined, refused).

Two read-only views in schema ``dp``, ``dp.budget`` and ``dp.history``, are granted to the
analysts' pass-through roles, so analysts query them like any relation (docs/config.md). The
ledger lives in the analyst database for that (`proxy.storage.provision`).

A fresh measurement is written inside :meth:`PostgresLedgerStore.spending`, which holds a
transaction and the table's row of ``tables`` locked FOR NO KEY UPDATE, so processes sharing the
ledger spend one after another. Taking that lock needs UPDATE on the ledger, which analysts lack
(unlike an advisory lock, which any role connected to the database can take and hold); it does
not conflict with the key-share locks of the audit log's inserts, so answers from history never
wait for it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from fractions import Fraction

import asyncpg
import numpy as np
import numpy.typing as npt

from proxy.engine.budget import Charges
from proxy.engine.history import HistoryEntry
from proxy.errors import ConfigError
from proxy.storage.ledger_store import AnswerRecord, NewMeasurement, StoredEntry
from sqlmap.canonical import quote_ident
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

__all__ = ["PostgresLedgerStore", "Spend", "measures_json", "stored_query"]

_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.tables (
    id serial PRIMARY KEY,
    name text NOT NULL UNIQUE,
    fingerprint text NOT NULL,
    n_cells integer NOT NULL,
    measures text NOT NULL DEFAULT '[]',
    data_version integer NOT NULL DEFAULT 1,
    carried text NOT NULL DEFAULT '0',
    total_budget float8,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {schema}.cell_spend (
    table_id integer NOT NULL REFERENCES {schema}.tables (id),
    cell integer NOT NULL,
    spent float8 NOT NULL,
    PRIMARY KEY (table_id, cell)
);
CREATE TABLE IF NOT EXISTS {schema}.measurements (
    id bigserial PRIMARY KEY,
    entry_key uuid NOT NULL UNIQUE,
    table_id integer NOT NULL REFERENCES {schema}.tables (id),
    fingerprint text NOT NULL,
    data_version integer NOT NULL,
    cells integer[] NOT NULL,
    weights float8[] NOT NULL,
    sensitivity float8 NOT NULL,
    budget text NOT NULL,
    step text NOT NULL,
    noisy_answer float8 NOT NULL,
    source text,
    query_offset float8,
    half_width float8,
    confidence float8,
    requested_eps float8,
    requested_confidence float8,
    user_name text,
    sql_text text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {schema}.answers (
    id bigserial PRIMARY KEY,
    table_id integer NOT NULL REFERENCES {schema}.tables (id),
    source text NOT NULL CHECK (source IN ('history', 'fresh', 'combined', 'refused')),
    budget text NOT NULL,
    estimate float8,
    low float8,
    high float8,
    confidence float8,
    requested_eps float8,
    requested_confidence float8,
    user_name text,
    sql_text text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS answers_table_source ON {schema}.answers (table_id, source);
"""

#: Ledgers written by development builds before ``cell_spend`` (they have ``tables.spent``).
#: Run only when needed: ALTER TABLE locks out concurrent spenders while it runs.
_UPGRADE = """
ALTER TABLE {schema}.tables DROP COLUMN spent, ADD COLUMN IF NOT EXISTS total_budget float8;
ALTER TABLE {schema}.measurements ADD COLUMN IF NOT EXISTS source text,
    ADD COLUMN IF NOT EXISTS query_offset float8, ADD COLUMN IF NOT EXISTS half_width float8,
    ADD COLUMN IF NOT EXISTS confidence float8;
"""

#: Budgets are stored exactly, as fractions in text ('3/1024'); the views show them as float8.
_AS_FLOAT = (
    "(CASE WHEN strpos({0}, '/') > 0 THEN split_part({0}, '/', 1)::float8 "
    "/ split_part({0}, '/', 2)::float8 ELSE {0}::float8 END)"
)

_VIEWS = (
    """
CREATE OR REPLACE VIEW dp.budget AS
SELECT t.name AS table_name,
       t.total_budget AS total,
       s.spent,
       greatest(t.total_budget - s.spent, 0) AS remaining,
       a.fresh, a.combined, a.history, a.refused
FROM {schema}.tables t
CROSS JOIN LATERAL (
    SELECT """
    + _AS_FLOAT.format("t.carried")
    + """ + coalesce(max(c.spent), 0) AS spent
    FROM {schema}.cell_spend c WHERE c.table_id = t.id) s
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE source = 'fresh') AS fresh,
           count(*) FILTER (WHERE source = 'combined') AS combined,
           count(*) FILTER (WHERE source = 'history') AS history,
           count(*) FILTER (WHERE source = 'refused') AS refused
    FROM {schema}.answers WHERE table_id = t.id) a;
CREATE OR REPLACE VIEW dp.history AS
SELECT m.id, t.name AS table_name, m.created_at, m.user_name, m.source, m.sql_text,
       cardinality(m.cells) AS n_cells, """
    + _AS_FLOAT.format("m.budget")
    + """ AS budget,
       m.noisy_answer, m.requested_eps AS requested_accuracy, m.requested_confidence,
       m.half_width, m.confidence,
       (m.fingerprint = t.fingerprint AND m.data_version = t.data_version) AS reusable
FROM {schema}.measurements m JOIN {schema}.tables t ON t.id = m.table_id;
CREATE OR REPLACE VIEW dp.history_vectors AS
SELECT m.id, t.name AS table_name, m.cells, m.weights, m.query_offset, m.sensitivity
FROM {schema}.measurements m JOIN {schema}.tables t ON t.id = m.table_id;
"""
)

#: Views whose columns changed (CREATE OR REPLACE VIEW cannot drop or rename columns): the
#: arrays of dp.history moved to dp.history_vectors, requested_eps became requested_accuracy.
_OLD_VIEWS = """
SELECT EXISTS (SELECT FROM pg_attribute
               WHERE attrelid = to_regclass('dp.history') AND attname = 'cells')
"""


@dataclass(frozen=True, slots=True)
class _Table:
    id: int
    cube: Cube
    data_version: int
    carried: Fraction


class PostgresLedgerStore:
    """The ledger of every protected table, in PostgreSQL (a `LedgerStore`)."""

    def __init__(self, pool: asyncpg.Pool, schema: str, tables: dict[str, _Table]) -> None:
        self._pool = pool
        self._schema_name = schema
        self._schema = quote_ident(schema)
        self._tables = tables
        # the audit log's group commit: rows waiting for the next write, and who waits on them
        self._audit: list[tuple[list[tuple[object, ...]], asyncio.Future[None]]] = []
        self._auditor: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        dsn: str,
        cubes: Iterable[Cube],
        schema: str = "dpproxy",
        analyst_role: str | None = None,
    ) -> PostgresLedgerStore:
        """Connect, create the schema and the ``dp`` views if needed, and register every cube.

        Args:
            dsn: a role that may create ``schema`` (and schema ``dp``).
            cubes: the protected tables.
            schema: the ledger's schema.
            analyst_role: the analysts' group (``dpproxy_passthrough``), granted SELECT on
                ``dp.budget`` and ``dp.history`` (never any right on ``schema``).

        Raises:
            ConfigError: a table's cube differs from the one its ledger was written for.
        """
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        try:
            tables = await _register(pool, quote_ident(schema), list(cubes), analyst_role)
        except BaseException:
            await pool.close()
            raise
        return cls(pool, schema, tables)

    async def close(self) -> None:
        """Finish the audit log's last write, then close every connection."""
        if self._auditor is not None:
            await self._auditor
        await self._pool.close()

    def data_version(self, cube: Cube) -> int:
        """The table's data version as of :meth:`open` (bumped by ``mark-changed``)."""
        return self._tables[cube.qualified_name].data_version

    def carried(self, cube: Cube) -> Fraction:
        """Budget spent per cell before the table's cube was redefined (``rekey``)."""
        return self._tables[cube.qualified_name].carried

    async def load(self, cube: Cube, after_id: int = 0) -> list[StoredEntry]:
        """The table's reusable entries (current data version), in order, after ``after_id``."""
        async with self._pool.acquire() as conn:
            return await _entries(conn, self._schema, self._tables[cube.qualified_name], after_id)

    async def load_outdated(self, cube: Cube) -> list[StoredEntry]:
        """Entries that measured an older version of the data: still charged, never reused."""
        table = self._tables[cube.qualified_name]
        async with self._pool.acquire() as conn:
            return await _entries(conn, self._schema, table, 0, outdated=True)

    @asynccontextmanager
    async def spending(self, cube: Cube) -> AsyncIterator[Spend]:
        """A transaction holding the table's spending lock; commits when the block ends."""
        table = self._tables[cube.qualified_name]
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                f"SELECT FROM {self._schema}.tables WHERE id = $1 FOR NO KEY UPDATE", table.id
            )
            yield Spend(conn, self._schema, table)

    async def record_answers(self, cube: Cube, records: Sequence[AnswerRecord]) -> None:
        """Append answers (or refusals) to the audit log; returns once they are written.

        Concurrent callers share writes (group commit): while one write is in flight, new
        records wait for the next, which takes them all. Many sessions answering from history
        then cost one COPY per round trip, not one INSERT per answer.
        """
        if not records:
            return
        table = self._tables[cube.qualified_name]
        written = asyncio.get_running_loop().create_future()
        self._audit.append(([_answer_row(table, r) for r in records], written))
        if self._auditor is None:
            self._auditor = asyncio.create_task(self._write_audit())
        await written

    async def _write_audit(self) -> None:
        try:
            while self._audit:
                batch, self._audit = self._audit, []
                try:
                    async with self._pool.acquire() as conn:
                        await conn.copy_records_to_table(
                            "answers",
                            schema_name=self._schema_name,
                            columns=_ANSWER_COLUMNS,
                            records=[row for rows, _ in batch for row in rows],
                        )
                except Exception as e:  # every waiter of this batch gets the error
                    for _, written in batch:
                        if not written.done():
                            written.set_exception(e)
                else:
                    for _, written in batch:
                        if not written.done():
                            written.set_result(None)
        finally:
            self._auditor = None


class Spend:
    """What may be done while holding a table's spending lock (a `Spending`)."""

    def __init__(self, conn: asyncpg.Connection, schema: str, table: _Table) -> None:
        self._conn = conn
        self._schema = schema
        self._table = table

    async def since(self, after_id: int) -> list[StoredEntry]:
        """Entries other processes appended after ``after_id``."""
        return await _entries(self._conn, self._schema, self._table, after_id)

    async def append(self, measurements: Sequence[NewMeasurement], charges: Charges) -> list[int]:
        """Write measurements and what they charge each cell they touch; returns the row ids.

        ``charges`` are exact; ``cell_spend`` adds them rounded up to float8. An entry whose key
        is already stored (a retried write) is not written again.
        """
        s, table = self._schema, self._table
        ids = []
        for m in measurements:
            entry = m.entry
            row = await self._conn.fetchrow(
                f"INSERT INTO {s}.measurements (entry_key, table_id, fingerprint, data_version, "
                "cells, weights, sensitivity, budget, step, noisy_answer, requested_eps, "
                "requested_confidence, user_name, sql_text, source, query_offset, half_width, "
                "confidence) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, "
                "$14, $15, $16, $17, $18) "
                "ON CONFLICT (entry_key) DO NOTHING RETURNING id",
                m.key,
                table.id,
                table.cube.fingerprint,
                table.data_version,
                entry.query.cells.tolist(),
                entry.query.weights.tolist(),
                entry.query.sensitivity,
                str(entry.budget),
                str(entry.step),
                entry.noisy_answer,
                m.requested_eps,
                m.requested_confidence,
                m.user,
                m.sql,
                m.source,
                m.query_offset,
                m.half_width,
                m.confidence,
            )
            if row is not None:
                ids.append(int(row[0]))
        if ids and charges:
            # only the cells these measurements touch: a query rarely covers the whole cube
            cells, spent = charges.rounded_up()
            await self._conn.execute(
                f"INSERT INTO {s}.cell_spend AS c (table_id, cell, spent) "
                "SELECT $1, cell, spent FROM unnest($2::int[], $3::float8[]) AS u(cell, spent) "
                "ON CONFLICT (table_id, cell) DO UPDATE SET spent = c.spent + excluded.spent",
                table.id,
                cells,
                spent,
            )
        return ids


async def _register(
    pool: asyncpg.Pool, schema: str, cubes: list[Cube], analyst_role: str | None
) -> dict[str, _Table]:
    async with pool.acquire() as conn:
        for attempt in range(3):
            try:
                async with conn.transaction():
                    return await _register_locked(conn, schema, cubes, analyst_role)
            except (asyncpg.UniqueViolationError, asyncpg.DuplicateObjectError):
                if attempt == 2:  # a new ledger created by another process at the same moment
                    raise
    raise AssertionError("unreachable")


async def _register_locked(
    conn: asyncpg.Connection, schema: str, cubes: list[Cube], analyst_role: str | None
) -> dict[str, _Table]:
    tables = {}
    if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{schema}.tables"):
        # one registrar at a time, by a lock only the ledger's writers may take (analysts could
        # take any advisory lock); concurrent creations of a new ledger are retried instead
        await conn.execute(f"LOCK TABLE {schema}.tables IN SHARE ROW EXCLUSIVE MODE")
    for name in (schema, "dp"):
        # CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema
        # exists; `dpproxy provision` creates both for a reader role that lacks it
        if await conn.fetchval("SELECT to_regnamespace($1) IS NULL", name):
            await conn.execute(f"CREATE SCHEMA {name}")
    await conn.execute(_DDL.format(schema=schema))
    if await conn.fetchval(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass "
        "AND attname = 'spent' AND NOT attisdropped",
        f"{schema}.tables",
    ):
        await conn.execute(_UPGRADE.format(schema=schema))
    if not await conn.fetchval(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass "
        "AND attname = 'measures' AND NOT attisdropped",
        f"{schema}.tables",
    ):  # a ledger from before measures: its cubes had none
        await conn.execute(
            f"ALTER TABLE {schema}.tables ADD COLUMN measures text NOT NULL DEFAULT '[]'"
        )
    if await conn.fetchval(_OLD_VIEWS):
        await conn.execute("DROP VIEW dp.history")
    await conn.execute(_VIEWS.format(schema=schema))
    if analyst_role is not None:
        role = quote_ident(analyst_role)
        await conn.execute(
            f"GRANT USAGE ON SCHEMA dp TO {role}; "
            f"GRANT SELECT ON dp.budget, dp.history, dp.history_vectors TO {role}"
        )
    for cube in cubes:
        row = await conn.fetchrow(
            f"INSERT INTO {schema}.tables (name, fingerprint, n_cells, measures, total_budget) "
            "VALUES ($1, $2, $3, $4, $5) "
            "ON CONFLICT (name) DO UPDATE SET total_budget = excluded.total_budget "
            "RETURNING id, fingerprint, n_cells, data_version, carried",
            cube.qualified_name,
            cube.fingerprint,
            cube.n_cells,
            measures_json(cube),
            cube.total_budget,
        )
        if row["fingerprint"] != cube.fingerprint:
            raise ConfigError(
                f"tables.{cube.qualified_name}: the cube differs from the one its ledger "
                f"was written for (fingerprint {row['fingerprint']}, now {cube.fingerprint})",
                detail="its dimensions or measures changed: history vectors over the old cells "
                "cannot be reused over new ones",
                hint="restore the old dimensions and measures, or run 'dpproxy ledger rekey' to "
                "start a new "
                "history for this table (spent budget is carried over)",
            )
        tables[cube.qualified_name] = _Table(
            int(row["id"]), cube, int(row["data_version"]), Fraction(row["carried"])
        )
    return tables


def measures_json(cube: Cube) -> str:
    """The cube's measures' reaches as ``tables.measures`` keeps them.

    >>> from sqlmap.cube import CategoricalDimension, Measure
    >>> measures_json(Cube("public", "t", (CategoricalDimension("s", ("a",)),),
    ...                    measures=(Measure("v", 1, 9),)))
    '[[0, 9]]'
    """
    return json.dumps([list(reach) for reach in cube.measure_reach])


def stored_query(
    n_cells: int, measures: str, cells: Sequence[int], weights: Sequence[float]
) -> LinearQuery:
    """A stored vector over a ledger table's coordinates (``tables.n_cells``, ``.measures``)."""
    reach = tuple((int(lo), int(hi)) for lo, hi in json.loads(measures))
    return LinearQuery(
        n_cells * (1 + len(reach)), np.asarray(cells), np.asarray(weights), 0.0, reach
    )


async def _entries(
    conn: asyncpg.Connection, schema: str, table: _Table, after_id: int, outdated: bool = False
) -> list[StoredEntry]:
    """Stored entries in order; a vector measured again is one shared :class:`LinearQuery`.

    Vectors come as PostgreSQL's binary arrays (``array_send``), read straight into numpy:
    a restart then costs what the rows hold, not a Python object per cell.
    """
    version = "data_version < $3" if outdated else "data_version = $3"
    rows = await conn.fetch(
        "SELECT id, entry_key, array_send(cells) AS cells, array_send(weights) AS weights, "
        f"budget, step, noisy_answer, user_name FROM {schema}.measurements "
        f"WHERE table_id = $1 AND fingerprint = $2 AND {version} AND id > $4 ORDER BY id",
        table.id,
        table.cube.fingerprint,
        table.data_version,
        after_id,
    )
    n, measures = table.cube.n_coordinates, table.cube.measure_reach
    vectors: dict[bytes, LinearQuery] = {}
    fractions: dict[str, Fraction] = {}
    entries = []
    for r in rows:
        key = r["cells"] + r["weights"]
        query = vectors.get(key)
        if query is None:
            cells = _binary_array(r["cells"], _INT4).astype(np.int64)
            weights = _binary_array(r["weights"], _FLOAT8).astype(np.float64)
            query = vectors[key] = LinearQuery(n, cells, weights, measures=measures)
        budget, step = (_fraction(fractions, r["budget"]), _fraction(fractions, r["step"]))
        entry = HistoryEntry(
            table.cube.qualified_name, query, budget, step, float(r["noisy_answer"])
        )
        entries.append(StoredEntry(int(r["id"]), r["entry_key"], entry, r["user_name"]))
    return entries


def _fraction(known: dict[str, Fraction], text: str) -> Fraction:
    """``Fraction(text)``, parsed once per distinct text (budgets repeat across entries)."""
    value = known.get(text)
    if value is None:
        value = known[text] = Fraction(text)
    return value


# array_send's elements: a 4-byte length, then the big-endian value
_INT4 = np.dtype([("length", ">i4"), ("value", ">i4")])
_FLOAT8 = np.dtype([("length", ">i4"), ("value", ">f8")])


def _binary_array(data: bytes, element: np.dtype[np.void]) -> npt.NDArray[np.generic]:
    """The values of a one-dimensional array without NULLs in PostgreSQL's binary format.

    >>> header = (1).to_bytes(4, "big") + bytes(8) + (2).to_bytes(4, "big") + (1).to_bytes(4, "big")
    >>> items = b"".join((4).to_bytes(4, "big") + v.to_bytes(4, "big") for v in (3, 7))
    >>> _binary_array(header + items, _INT4).tolist()
    [3, 7]
    """
    dimensions = int.from_bytes(data[:4], "big")
    if dimensions == 0:
        return np.zeros(0, dtype=element["value"].newbyteorder("="))
    if dimensions != 1 or int.from_bytes(data[4:8], "big") != 0:
        raise ValueError("expected a one-dimensional array without NULLs")
    values = np.frombuffer(data, dtype=element, offset=20)["value"]
    return values.astype(values.dtype.newbyteorder("="))


_ANSWER_COLUMNS = [
    "table_id",
    "source",
    "budget",
    "estimate",
    "low",
    "high",
    "confidence",
    "requested_eps",
    "requested_confidence",
    "user_name",
    "sql_text",
]


def _answer_row(table: _Table, r: AnswerRecord) -> tuple[object, ...]:
    """An audit row, in the order of ``_ANSWER_COLUMNS``."""
    return (
        table.id,
        r.source,
        str(r.budget),
        r.estimate,
        r.low,
        r.high,
        r.confidence,
        r.requested_eps,
        r.requested_confidence,
        r.user,
        r.sql,
    )
