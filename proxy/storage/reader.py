"""The privileged backend: a connection pool that runs only SQL generated from a cube.

Its methods take a :class:`~sqlmap.cube.Cube` and query vectors, never SQL text, so no code path
can hand it a user's query: this is the role that can read protected tables.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg

from sqlmap.canonical import COLUMN_TYPES_SQL, check_column_types, measurement_sql
from sqlmap.cube import Cube
from sqlmap.vector import LinearQuery

__all__ = ["Reader"]


class Reader:
    """Computes true answers on protected tables under the reader role."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, dsn: str, size: int = 2) -> Reader:
        """Open a pool of ``size`` connections as the reader role."""
        # read-only sessions: a generated query has no reason to write, ever
        pool = await asyncpg.create_pool(
            dsn, min_size=1, max_size=size, server_settings={"default_transaction_read_only": "on"}
        )
        return cls(pool)

    async def measure(self, cube: Cube, queries: Sequence[LinearQuery]) -> list[float]:
        """``q . x`` for each (offset-free) query on the rows of ``cube``'s table, now.

        One statement reads only the rows the queries weigh (:func:`measurement_sql`).
        """
        # linear in the grid of the dimensions the queries name (all of them for vectors held
        # cell by cell, 0.7 s for 8 million cells): off the event loop
        measurement = await asyncio.to_thread(measurement_sql, cube, queries)
        if measurement.sql is None:
            return measurement.answers(())
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(measurement.sql)
        return measurement.answers(tuple(r) for r in rows)

    async def check_columns(self, cube: Cube) -> None:
        """Raise ConfigError unless every dimension matches its column's type."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(COLUMN_TYPES_SQL, cube.schema, cube.table)
        check_column_types(cube, {r[0]: r[1] for r in rows})

    async def close(self) -> None:
        """Close every connection."""
        await self._pool.close()
