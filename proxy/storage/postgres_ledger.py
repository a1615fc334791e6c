"""The ledger store in PostgreSQL: every released measurement, every answer, and the budget.

Layout, in a schema of its own (``dpproxy`` by default) that analysts cannot reach:

* ``tables``: one row per protected table: the fingerprint of its cube (history vectors are
  only meaningful over the cube they were computed on), its shape (values per dimension), its
  cells and its measures' reaches (JSON: what one row adds to a cell's sum, which decides what a
  vector charged each cell), its data version and total budget, and the most any cell has spent
  (rounded up to float8, for ``dp.budget``: the exact ledger is recomputed from the measurements
  on load).
* ``measurements``: one row per released noisy measurement, the papers' (H_i, alpha_i, y_i), with
  the request and the answer it served; noise is drawn once per entry and stored, keyed by an id
  drawn before the write, so a retried write never creates a second, independently noised entry.
  A vector is stored as SQL over the cube produces it, factored: the dimensions it depends on
  (``axes``), constant along the others, and its weights over (kind, *those dimensions), its
  *core*, by their non-zero entries (``core_index`` in C order, ``core_weights``). A range count
  over a wide cube covers a million cells but is a few numbers; a GROUP BY's groups one each.
  Rows written before that list every coordinate (``cells``, ``weights``).
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
import math
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from fractions import Fraction

import asyncpg
import numpy as np
import numpy.typing as npt

from proxy.engine.budget import float_up
from proxy.engine.history import HistoryEntry
from proxy.errors import ConfigError
from proxy.storage.ledger_store import AnswerRecord, NewMeasurement, StoredEntry
from sqlmap.canonical import quote_ident
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

__all__ = [
    "PostgresLedgerStore",
    "Spend",
    "has_column",
    "measures_json",
    "stored_query",
    "upgrade_columns",
]

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
    created_at timestamptz NOT NULL DEFAULT now(),
    shape integer[],
    most_spent float8 NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS {schema}.measurements (
    id bigserial PRIMARY KEY,
    entry_key uuid NOT NULL UNIQUE,
    table_id integer NOT NULL REFERENCES {schema}.tables (id),
    fingerprint text NOT NULL,
    data_version integer NOT NULL,
    cells integer[],
    weights float8[],
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
    created_at timestamptz NOT NULL DEFAULT now(),
    axes integer[],
    core_index integer[],
    core_weights float8[],
    n_weighed bigint
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

#: Ledgers from before factored vectors: every vector listed its coordinates, and
#: ``cell_spend`` had a row per cell ever charged. Old rows keep their lists (they still load);
#: the most a cell spent moves to ``tables.most_spent``. Run only when needed (ALTER TABLE).
_FACTORED_UPGRADE = """
ALTER TABLE {schema}.measurements ADD COLUMN IF NOT EXISTS axes integer[],
    ADD COLUMN IF NOT EXISTS core_index integer[],
    ADD COLUMN IF NOT EXISTS core_weights float8[],
    ADD COLUMN IF NOT EXISTS n_weighed bigint, ALTER COLUMN cells DROP NOT NULL,
    ALTER COLUMN weights DROP NOT NULL;
ALTER TABLE {schema}.tables ADD COLUMN IF NOT EXISTS shape integer[],
    ADD COLUMN IF NOT EXISTS most_spent float8 NOT NULL DEFAULT 0;
"""

#: After the views stop reading it (dp.budget did).
_DROP_CELL_SPEND = """
UPDATE {schema}.tables t SET most_spent = greatest(t.most_spent, coalesce(
    (SELECT max(c.spent) FROM {schema}.cell_spend c WHERE c.table_id = t.id), 0));
DROP TABLE {schema}.cell_spend;
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
CROSS JOIN LATERAL (SELECT """
    + _AS_FLOAT.format("t.carried")
    + """ + t.most_spent AS spent) s
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE source = 'fresh') AS fresh,
           count(*) FILTER (WHERE source = 'combined') AS combined,
           count(*) FILTER (WHERE source = 'history') AS history,
           count(*) FILTER (WHERE source = 'refused') AS refused
    FROM {schema}.answers WHERE table_id = t.id) a;
CREATE OR REPLACE VIEW dp.history AS
SELECT m.id, t.name AS table_name, m.created_at, m.user_name, m.source, m.sql_text,
       coalesce(cardinality(m.cells), m.n_weighed::integer) AS n_cells, """
    + _AS_FLOAT.format("m.budget")
    + """ AS budget,
       m.noisy_answer, m.requested_eps AS requested_accuracy, m.requested_confidence,
       m.half_width, m.confidence,
       (m.fingerprint = t.fingerprint AND m.data_version = t.data_version) AS reusable
FROM {schema}.measurements m JOIN {schema}.tables t ON t.id = m.table_id;
CREATE OR REPLACE VIEW dp.history_vectors AS
SELECT m.id, t.name AS table_name, m.cells, m.weights, m.query_offset, m.sensitivity,
       m.axes,
       CASE WHEN m.axes IS NOT NULL THEN
           ARRAY[1 + json_array_length(t.measures::json)]
           || ARRAY(SELECT t.shape[a + 1] FROM unnest(m.axes) WITH ORDINALITY AS x(a, n)
                    ORDER BY n)
       END AS core_shape,
       m.core_index, m.core_weights
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
    fingerprint: str  # the cube's (a hash: worked out once)


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

    async def append(
        self, measurements: Sequence[NewMeasurement], most_spent: Fraction
    ) -> list[int]:
        """Write measurements; returns the row ids of those not already stored.

        ``most_spent``: the most any cell of the table has spent once they are charged, carried
        budget aside (exact: whoever spends has absorbed every entry under this lock); the
        ledger keeps it rounded up, for ``dp.budget``. An entry whose key is already stored (a
        retried write) is not written again.
        """
        if not measurements:
            return []
        s, table = self._schema, self._table
        # one statement for the whole batch (a GROUP BY's groups): the vectors travel
        # concatenated, each row takes its slices
        vectors = [_as_factored(table.cube, m.entry.query) for m in measurements]
        axes = [np.asarray(v.axes, dtype=np.int64) for v in vectors]
        cores = [v.core.ravel() for v in vectors if v.core is not None]
        index = [np.flatnonzero(c) for c in cores]
        axes_ends = np.cumsum([a.size for a in axes]).tolist()
        core_ends = np.cumsum([i.size for i in index]).tolist()
        # coordinates weighed: each entry of a core stands for the cells of the other dimensions
        weighed = [i.size * v.n_cells // c.size for v, c, i in zip(vectors, cores, index)]
        rows = await self._conn.fetch(
            "WITH written AS (INSERT INTO "
            f"{s}.measurements (entry_key, table_id, fingerprint, data_version, axes, "
            "core_index, core_weights, n_weighed, sensitivity, budget, step, noisy_answer, "
            "requested_eps, requested_confidence, user_name, sql_text, source, query_offset, "
            "half_width, confidence) "
            "SELECT u.entry_key, $1, $2, $3, ($4::int[])[u.axes_first:u.axes_last], "
            "($5::int[])[u.core_first:u.core_last], ($6::float8[])[u.core_first:u.core_last], "
            "u.n_weighed, u.sensitivity, u.budget, u.step, u.noisy_answer, "
            "u.requested_eps, u.requested_confidence, u.user_name, u.sql_text, u.source, "
            "u.query_offset, u.half_width, u.confidence "
            "FROM unnest($7::uuid[], $8::int[], $9::int[], $10::int[], $11::int[], "
            "$12::int8[], $13::float8[], $14::text[], $15::text[], $16::float8[], "
            "$17::float8[], $18::float8[], $19::text[], $20::text[], $21::text[], "
            "$22::float8[], $23::float8[], $24::float8[]) "
            "WITH ORDINALITY AS u(entry_key, axes_first, axes_last, core_first, core_last, "
            "n_weighed, sensitivity, budget, step, noisy_answer, requested_eps, "
            "requested_confidence, user_name, sql_text, source, query_offset, half_width, "
            "confidence, n) "
            "ORDER BY u.n ON CONFLICT (entry_key) DO NOTHING RETURNING id, entry_key), "
            f"spent AS (UPDATE {s}.tables SET most_spent = greatest(most_spent, $25) "
            "WHERE id = $1 AND EXISTS (SELECT FROM written)) "
            "SELECT id, entry_key FROM written",
            table.id,
            table.fingerprint,
            table.data_version,
            np.concatenate(axes).tolist(),
            np.concatenate(index).tolist(),
            np.concatenate([c[i] for c, i in zip(cores, index)]).tolist(),
            [m.key for m in measurements],
            [end - a.size + 1 for end, a in zip(axes_ends, axes)],
            axes_ends,
            [end - i.size + 1 for end, i in zip(core_ends, index)],
            core_ends,
            weighed,
            [m.entry.query.sensitivity for m in measurements],
            [str(m.entry.budget) for m in measurements],
            [str(m.entry.step) for m in measurements],
            [m.entry.noisy_answer for m in measurements],
            [m.requested_eps for m in measurements],
            [m.requested_confidence for m in measurements],
            [m.user for m in measurements],
            [m.sql for m in measurements],
            [m.source for m in measurements],
            [m.query_offset for m in measurements],
            [m.half_width for m in measurements],
            [m.confidence for m in measurements],
            float_up(most_spent),
        )
        written = {r["entry_key"]: int(r["id"]) for r in rows}
        return [written[m.key] for m in measurements if m.key in written]


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

    await upgrade_columns(conn, schema)
    if await conn.fetchval(_OLD_VIEWS):
        await conn.execute("DROP VIEW dp.history")
    await conn.execute(_VIEWS.format(schema=schema))
    if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{schema}.cell_spend"):
        await conn.execute(_DROP_CELL_SPEND.format(schema=schema))
    if analyst_role is not None:
        role = quote_ident(analyst_role)
        await conn.execute(
            f"GRANT USAGE ON SCHEMA dp TO {role}; "
            f"GRANT SELECT ON dp.budget, dp.history, dp.history_vectors TO {role}"
        )
    for cube in cubes:
        row = await conn.fetchrow(
            f"INSERT INTO {schema}.tables "
            "(name, fingerprint, n_cells, measures, total_budget, shape) "
            "VALUES ($1, $2, $3, $4, $5, $6) "
            # the shape of a ledger from before it was kept (a changed cube is refused below,
            # which rolls this back)
            "ON CONFLICT (name) DO UPDATE SET total_budget = excluded.total_budget, "
            "shape = excluded.shape "
            "RETURNING id, fingerprint, n_cells, data_version, carried",
            cube.qualified_name,
            cube.fingerprint,
            cube.n_cells,
            measures_json(cube),
            cube.total_budget,
            list(cube.shape),
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
            int(row["id"]),
            cube,
            int(row["data_version"]),
            Fraction(row["carried"]),
            row["fingerprint"],
        )
    return tables


async def has_column(conn: asyncpg.Connection, schema: str, table: str, column: str) -> bool:
    """Whether the ledger's ``table`` has ``column`` (ledgers written before it lack it)."""
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) "
            "AND attname = $2 AND NOT attisdropped",
            f"{schema}.{table}",
            column,
        )
    )


async def upgrade_columns(conn: asyncpg.Connection, schema: str) -> None:
    """Add what a ledger written by an earlier version lacks (ALTER TABLE only where needed)."""
    if await has_column(conn, schema, "tables", "spent"):
        await conn.execute(_UPGRADE.format(schema=schema))
    if not await has_column(conn, schema, "tables", "measures"):  # from before measures: none
        await conn.execute(
            f"ALTER TABLE {schema}.tables ADD COLUMN measures text NOT NULL DEFAULT '[]'"
        )
    if not (
        await has_column(conn, schema, "measurements", "n_weighed")
        and await has_column(conn, schema, "tables", "shape")
    ):
        await conn.execute(_FACTORED_UPGRADE.format(schema=schema))


def measures_json(cube: Cube) -> str:
    """The cube's measures' reaches as ``tables.measures`` keeps them.

    >>> from sqlmap.cube import CategoricalDimension, Measure
    >>> measures_json(Cube("public", "t", (CategoricalDimension("s", ("a",)),),
    ...                    measures=(Measure("v", 1, 9),)))
    '[[0, 9]]'
    """
    return json.dumps([list(reach) for reach in cube.measure_reach])


def stored_query(
    n_cells: int,
    measures: str,
    shape: Sequence[int] | None,
    *,
    cells: npt.ArrayLike | None = None,
    weights: npt.ArrayLike | None = None,
    axes: Sequence[int] | None = None,
    core_index: npt.ArrayLike | None = None,
    core_weights: npt.ArrayLike | None = None,
) -> LinearQuery:
    """A stored vector over a ledger table's coordinates (its ``n_cells``, measures, shape).

    Factored (``axes``, ``core_index``, ``core_weights``), or listed (``cells``, ``weights``)
    in rows from before.
    """
    reach = tuple((int(lo), int(hi)) for lo, hi in json.loads(measures))
    if axes is not None and shape is not None:
        return _factored(
            tuple(int(n) for n in shape),
            reach,
            axes,
            np.asarray(core_index, dtype=np.int64),
            np.asarray(core_weights, dtype=np.float64),
        )
    return LinearQuery(
        n_cells * (1 + len(reach)), np.asarray(cells), np.asarray(weights), 0.0, reach
    )


def _as_factored(cube: Cube, query: LinearQuery) -> LinearQuery:
    """``query`` held factored over ``cube`` (SQL's vectors already are)."""
    if query.core is not None:
        return query
    dense = query.to_dense().reshape((query.kinds, *cube.shape))
    return LinearQuery.from_tensor(cube.shape, dense, measures=query.measures)


def _factored(
    shape: tuple[int, ...],
    measures: tuple[tuple[int, int], ...],
    axes: Sequence[int],
    index: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
) -> LinearQuery:
    """A vector from its stored axes and its core's non-zero entries (C order, (kind, *axes))."""
    if any(not 0 <= d < len(shape) for d in axes):
        raise ValueError(f"stored axes {list(axes)} of a cube of {len(shape)} dimensions")
    core = np.zeros(math.prod(shape[d] for d in axes) * (1 + len(measures)))
    core[index] = weights
    tensor = core.reshape([1 + len(measures), *(shape[d] for d in axes)])
    return LinearQuery.from_core(shape, axes, tensor, measures)


async def _entries(
    conn: asyncpg.Connection, schema: str, table: _Table, after_id: int, outdated: bool = False
) -> list[StoredEntry]:
    """Stored entries in order; a vector measured again is one shared :class:`LinearQuery`.

    Vectors come as PostgreSQL's binary arrays (``array_send``), read straight into numpy:
    a restart then costs what the rows hold (a factored vector's few numbers), not a Python
    object per cell.
    """
    version = "data_version < $3" if outdated else "data_version = $3"
    rows = await conn.fetch(
        "SELECT id, entry_key, array_send(cells) AS cells, array_send(weights) AS weights, "
        "array_send(axes) AS axes, array_send(core_index) AS core_index, "
        "array_send(core_weights) AS core_weights, "
        f"budget, step, noisy_answer, user_name FROM {schema}.measurements "
        f"WHERE table_id = $1 AND fingerprint = $2 AND {version} AND id > $4 ORDER BY id",
        table.id,
        table.fingerprint,
        table.data_version,
        after_id,
    )
    cube = table.cube
    n, measures = cube.n_coordinates, cube.measure_reach
    vectors: dict[bytes, LinearQuery] = {}
    fractions: dict[str, Fraction] = {}
    entries = []
    for r in rows:
        factored = r["axes"] is not None
        key = (
            r["axes"] + r["core_index"] + r["core_weights"]
            if factored
            else r["cells"] + r["weights"]
        )
        query = vectors.get(key)
        if query is None:
            if factored:
                query = _factored(
                    cube.shape,
                    measures,
                    _binary_array(r["axes"], _INT4).tolist(),
                    _binary_array(r["core_index"], _INT4).astype(np.int64),
                    _binary_array(r["core_weights"], _FLOAT8).astype(np.float64),
                )
            else:
                cells = _binary_array(r["cells"], _INT4).astype(np.int64)
                weights = _binary_array(r["weights"], _FLOAT8).astype(np.float64)
                query = LinearQuery(n, cells, weights, measures=measures)
            vectors[key] = query
        budget, step = (_fraction(fractions, r["budget"]), _fraction(fractions, r["step"]))
        entry = HistoryEntry(cube.qualified_name, query, budget, step, float(r["noisy_answer"]))
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
