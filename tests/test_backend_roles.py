"""The two backend roles: the pass-through role cannot read protected rows; the reader can."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import numpy as np
import psycopg
import pytest

from proxy.backend import Reader
from proxy.config import load_config
from proxy.demo import ADULT_ROWS
from proxy.provision import BackendRoles, provision_roles
from sqlmap.vector import LinearQuery

CUBES = load_config(Path(__file__).parent.parent / "config.yaml").cubes


@pytest.fixture(scope="module")
def roles(adult_dsn: str) -> BackendRoles:
    provision_roles(adult_dsn, CUBES)
    return provision_roles(adult_dsn, CUBES)  # idempotent


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM adult",
        "SELECT count(*) FROM adult",
        "SELECT age FROM public.adult LIMIT 1",
        "COPY adult TO STDOUT",
        "SELECT * FROM pg_stats WHERE tablename = 'adult'",
    ],
)
def test_passthrough_role_cannot_read_protected_rows(roles: BackendRoles, sql: str) -> None:
    with psycopg.connect(roles.passthrough_dsn, autocommit=True) as conn:
        if "pg_stats" in sql:  # filtered by privilege: no rows, not an error
            assert conn.execute(sql).fetchall() == []
            return
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)


def test_passthrough_role_can_browse_the_catalog(roles: BackendRoles) -> None:
    with psycopg.connect(roles.passthrough_dsn, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT attname FROM pg_attribute "
            "WHERE attrelid = 'public.adult'::regclass AND attnum > 0"
        ).fetchall()
    assert ("age",) in columns


def test_reader_measures(roles: BackendRoles) -> None:
    cube = CUBES[0]
    everyone = LinearQuery.from_dense(np.ones(cube.n_cells))
    no_gain = LinearQuery.from_dense(np.arange(cube.n_cells) % 2 == 0)  # capital_gain is last
    nobody = LinearQuery(cube.n_cells, np.array([], np.int64), np.array([]))

    async def run() -> list[float]:
        reader = await Reader.connect(roles.reader_dsn)
        try:
            await reader.check_columns(cube)
            return await reader.measure(cube, [everyone, no_gain, nobody])
        finally:
            await reader.close()

    total, without_gain, none = asyncio.run(run())
    assert (total, none) == (ADULT_ROWS, 0)
    with psycopg.connect(roles.reader_dsn) as conn:
        plain = conn.execute("SELECT count(*) FROM adult WHERE capital_gain < 1").fetchone()
    assert plain == (without_gain,)


def test_reader_sessions_are_read_only(roles: BackendRoles) -> None:
    async def run() -> None:
        reader = await Reader.connect(roles.reader_dsn)
        try:
            async with reader._pool.acquire() as conn:  # the pool's own sessions, as configured
                with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
                    await conn.execute("CREATE TABLE t (x int)")
        finally:
            await reader.close()

    asyncio.run(run())
