"""The privileged backend: a connection pool that runs only SQL generated from a cube.

Its methods take a :class:`~sqlmap.cube.Cube`, never SQL text, so no code path can hand it a
user's query: this is the role that can read protected tables.
"""

from __future__ import annotations

import asyncpg
import numpy as np
import numpy.typing as npt

from sqlmap.canonical import (
    COLUMN_TYPES_SQL,
    check_column_types,
    histogram_from_rows,
    histogram_sql,
)
from sqlmap.cube import Cube

__all__ = ["Reader"]


class Reader:
    """Computes true histograms of protected tables under the reader role."""

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

    async def histogram(self, cube: Cube) -> npt.NDArray[np.int64]:
        """x: the number of rows in every cell of ``cube``, now."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(histogram_sql(cube))
        return histogram_from_rows(cube, ((r[0], r[1]) for r in rows))

    async def check_columns(self, cube: Cube) -> None:
        """Raise ConfigError unless every dimension matches its column's type."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(COLUMN_TYPES_SQL, cube.schema, cube.table)
        check_column_types(cube, {r[0]: r[1] for r in rows})

    async def close(self) -> None:
        """Close every connection."""
        await self._pool.close()
