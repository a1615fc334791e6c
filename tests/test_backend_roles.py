"""The two backend roles: the pass-through role cannot read protected rows; the reader can."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import psycopg
import pytest

from proxy.backend import Reader
from proxy.config import load_config
from proxy.demo import ADULT_ROWS
from proxy.provision import BackendRoles, provision_roles

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


def test_reader_computes_the_histogram(roles: BackendRoles) -> None:
    async def run() -> int:
        reader = await Reader.connect(roles.reader_dsn)
        try:
            await reader.check_columns(CUBES[0])
            return int((await reader.histogram(CUBES[0])).sum())
        finally:
            await reader.close()

    assert asyncio.run(run()) == ADULT_ROWS


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
