"""The DBA's ledger commands: status, history, export, mark-changed, rekey.

They work on the ledger database directly, with or without a running proxy. ``mark-changed`` and
``rekey`` take the same lock as spending, so they never interleave with a fresh answer; a
running proxy picks the change up when it restarts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from fractions import Fraction

import asyncpg

from proxy.engine.budget import CellBudget, cell_charges
from proxy.errors import ConfigError
from proxy.storage.postgres_ledger import (
    has_column,
    measures_json,
    stored_query,
    upgrade_columns,
)
from sqlmap.canonical import quote_ident
from sqlmap.cube import Cube

__all__ = ["TableStatus", "status", "mark_changed", "rekey", "history", "export"]


@dataclass(frozen=True, slots=True)
class TableStatus:
    """One table's budget, recomputed exactly from its measurements."""

    table: str
    fingerprint: str
    data_version: int
    total: Fraction
    spent: Fraction
    fresh: int
    history: int
    combined: int
    refused: int

    @property
    def remaining(self) -> Fraction:
        """Budget left (never negative)."""
        return max(self.total - self.spent, Fraction(0))


#: ``tables.measures`` of row ``t``, also in a ledger written before measures (none then)
_MEASURES = "coalesce(to_jsonb(t) ->> 'measures', '[]')"


async def _spent(
    conn: asyncpg.Connection,
    schema: str,
    table_id: int,
    fingerprint: str,
    n_cells: int,
    measures: str,
    carried: Fraction,
) -> Fraction:
    """max_j B_j over every measurement of the cube, any data version, plus what was carried."""
    # a ledger no dpproxy has opened since vectors were stored factored has only cell lists
    factored = await has_column(conn, schema, "measurements", "n_weighed")
    shape = (
        await conn.fetchval(f"SELECT shape FROM {schema}.tables WHERE id = $1", table_id)
        if factored
        else None
    )
    vectors = (
        "axes, core_index, core_weights"
        if factored
        else "NULL AS axes, NULL AS core_index, NULL AS core_weights"
    )
    ledger = CellBudget(
        "status",
        total=Fraction(10**12),
        carried=carried,
        shape=None if shape is None else tuple(shape),
    )
    rows = await conn.fetch(
        f"SELECT cells, weights, {vectors}, budget FROM {schema}.measurements "
        "WHERE table_id = $1 AND fingerprint = $2",
        table_id,
        fingerprint,
    )
    for r in rows:
        query = stored_query(
            n_cells,
            measures,
            shape,
            cells=r["cells"],
            weights=r["weights"],
            axes=r["axes"],
            core_index=r["core_index"],
            core_weights=r["core_weights"],
        )
        ledger.commit(cell_charges(query, Fraction(r["budget"])))
    return ledger.spent


async def status(dsn: str, cubes: Iterable[Cube], schema: str = "dpproxy") -> list[TableStatus]:
    """The budget and answer counts of every protected table the ledger knows."""
    s = quote_ident(schema)
    totals = {c.qualified_name: Fraction(c.total_budget) for c in cubes}
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT id, name, fingerprint, n_cells, data_version, carried, "
            f"{_MEASURES} AS measures FROM {s}.tables t ORDER BY name"
        )
        result = []
        for r in rows:
            counts = dict(
                await conn.fetch(
                    f"SELECT source, count(*) FROM {s}.answers WHERE table_id = $1 GROUP BY 1",
                    r["id"],
                )
            )
            spent = await _spent(
                conn,
                s,
                r["id"],
                r["fingerprint"],
                r["n_cells"],
                r["measures"],
                Fraction(r["carried"]),
            )
            result.append(
                TableStatus(
                    r["name"],
                    r["fingerprint"],
                    r["data_version"],
                    totals.get(r["name"], Fraction(0)),
                    spent,
                    counts.get("fresh", 0),
                    counts.get("history", 0),
                    counts.get("combined", 0),
                    counts.get("refused", 0),
                )
            )
        return result
    finally:
        await conn.close()


async def _table(conn: asyncpg.Connection, schema: str, name: str) -> asyncpg.Record:
    row = await conn.fetchrow(
        f"SELECT id, fingerprint, n_cells, carried, {_MEASURES} AS measures "
        f"FROM {schema}.tables t WHERE name = $1 FOR UPDATE",
        name,
    )
    if row is None:
        raise ConfigError(f"the ledger has no table {name!r}")
    return row


async def mark_changed(dsn: str, table: str, schema: str = "dpproxy") -> int:
    """Mark a table's data as changed: earlier answers stop being reused; their budget stays spent.

    Returns the new data version.
    """
    s = quote_ident(schema)
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            row = await _table(conn, s, table)
            return int(
                await conn.fetchval(
                    f"UPDATE {s}.tables SET data_version = data_version + 1 "
                    "WHERE id = $1 RETURNING data_version",
                    row["id"],
                )
            )
    finally:
        await conn.close()


async def rekey(dsn: str, cube: Cube, schema: str = "dpproxy") -> Fraction:
    """Start a new history for a table whose cube changed, carrying its spent budget over.

    The old cells cannot be mapped onto the new ones, so every new cell starts with the most any
    old cell had spent (``max_j B_j``). Returns that carried budget.
    """
    s = quote_ident(schema)
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            row = await _table(conn, s, cube.qualified_name)
            await upgrade_columns(conn, s)
            if row["fingerprint"] == cube.fingerprint:
                raise ConfigError(
                    f"tables.{cube.qualified_name}: the cube has not changed; nothing to rekey"
                )
            carried = await _spent(
                conn,
                s,
                row["id"],
                row["fingerprint"],
                row["n_cells"],
                row["measures"],
                Fraction(row["carried"]),
            )
            if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{s}.cell_spend"):
                # not yet replaced by `most_spent` (when dpproxy next opens the ledger)
                await conn.execute(f"DELETE FROM {s}.cell_spend WHERE table_id = $1", row["id"])
            await conn.execute(
                # the old cells mean nothing over the new cube; what they spent is in `carried`
                f"UPDATE {s}.tables SET fingerprint = $2, n_cells = $3, measures = $4, "
                "carried = $5, shape = $6, most_spent = 0, data_version = data_version + 1 "
                "WHERE id = $1",
                row["id"],
                cube.fingerprint,
                cube.n_cells,
                measures_json(cube),
                str(carried),
                list(cube.shape),
            )
            return carried
    finally:
        await conn.close()


async def history(dsn: str, schema: str = "dpproxy", limit: int = 50) -> list[dict[str, object]]:
    """The most recent answers, newest first."""
    s = quote_ident(schema)
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT a.id, t.name AS table, a.source, a.budget, a.estimate, a.low, a.high, "
            "a.confidence, a.user_name, a.sql_text, a.created_at "
            f"FROM {s}.answers a JOIN {s}.tables t ON t.id = a.table_id "
            "ORDER BY a.id DESC LIMIT $1",
            limit,
        )
        return [dict(r) for r in rows]
    finally:
        await conn.close()


async def export(dsn: str, schema: str = "dpproxy") -> AsyncIterator[str]:
    """Every table, measurement and answer as JSON lines (one object per line, with its kind)."""
    s = quote_ident(schema)
    conn = await asyncpg.connect(dsn)
    try:
        for kind, sql in (
            (
                "table",
                "SELECT id, name, fingerprint, n_cells, data_version, carried, created_at "
                f"FROM {s}.tables ORDER BY id",
            ),
            ("measurement", f"SELECT * FROM {s}.measurements ORDER BY id"),
            ("answer", f"SELECT * FROM {s}.answers ORDER BY id"),
        ):
            async with conn.transaction():
                async for r in conn.cursor(sql):
                    yield json.dumps({"kind": kind, **dict(r)}, default=str, sort_keys=True)
    finally:
        await conn.close()
