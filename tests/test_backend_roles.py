"""The boundary `dpproxy provision` sets up, and the start-up check that refuses a leaky one.

The reader reads the real table in the private database; each analyst's own role sees, in the
analyst database, an empty table of the same shape and no statistics of the cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import numpy as np
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from proxy.auth import make_verifier
from proxy.config import BackendConfig, Config, dsn_with, load_config
from proxy.demo import ADULT_ROWS
from proxy.errors import ConfigError
from proxy.server.listener import check_boundary, check_ledger_home
from proxy.storage.provision import BackendRoles, provision_roles
from proxy.storage.reader import Reader
from sqlmap.vector import LinearQuery

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
CUBES = CONFIG.cubes
USERS = ("analyst", "bob")


@pytest.fixture(scope="module")
def roles(adult_dsn: str) -> BackendRoles:
    provision_roles(adult_dsn, CUBES, users=USERS)
    return provision_roles(adult_dsn, CUBES, users=USERS)  # idempotent


@pytest.fixture(scope="module")
def config() -> Config:
    verifier = make_verifier("pw")
    return dataclasses.replace(CONFIG, users=dict.fromkeys(USERS, verifier))


@pytest.fixture(scope="module")
def backend(roles: BackendRoles) -> BackendConfig:
    return BackendConfig(roles.reader_dsn, roles.passthrough_dsn)


def private_dsn(roles: BackendRoles, user: str) -> str:
    return dsn_with(roles.analyst_dsn(user), dbname=conninfo_to_dict(roles.reader_dsn)["dbname"])


@pytest.mark.parametrize("user", USERS)
def test_analysts_cannot_connect_to_the_private_database(roles: BackendRoles, user: str) -> None:
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(private_dsn(roles, user))


def test_analysts_see_an_empty_table_of_the_same_shape(adult_dsn: str, roles: BackendRoles) -> None:
    shape = (
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "col_description(a.attrelid, a.attnum) FROM pg_attribute a "
        "WHERE a.attrelid = 'public.adult'::regclass AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum"
    )
    with psycopg.connect(adult_dsn, autocommit=True) as admin:
        admin.execute("COMMENT ON COLUMN public.adult.age IS 'years'")
        admin.execute("ALTER TABLE public.adult ALTER COLUMN sex SET NOT NULL")
        try:
            provision_roles(adult_dsn, CUBES, users=USERS)
            real = admin.execute(shape).fetchall()
        finally:
            admin.execute("COMMENT ON COLUMN public.adult.age IS NULL")
            admin.execute("ALTER TABLE public.adult ALTER COLUMN sex DROP NOT NULL")
    with psycopg.connect(roles.analyst_dsn(), autocommit=True) as conn:
        assert conn.execute(shape).fetchall() == real
        assert ("age", "integer", False, "years") in real and ("sex", "text", True, None) in real
        assert conn.execute("SELECT count(*) FROM adult").fetchone() == (0,)
        columns = conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' AND table_name = 'adult' ORDER BY ordinal_position"
        ).fetchall()
        assert columns[0] == ("age",) and len(columns) == 15
    provision_roles(adult_dsn, CUBES, users=USERS)  # the shape changed back: so does the stand-in
    with psycopg.connect(roles.analyst_dsn(), autocommit=True) as conn:
        assert ("sex", "text", False, None) in conn.execute(shape).fetchall()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM pg_catalog.pg_stat_database",
        "SELECT * FROM pg_catalog.pg_stat_user_tables",
        "SELECT * FROM pg_catalog.pg_statio_user_tables",
        "SELECT * FROM pg_catalog.pg_stat_io",
        "SELECT * FROM pg_catalog.pg_stat_bgwriter",
        "SELECT * FROM pg_catalog.pg_stat_wal",
        "SELECT * FROM pg_catalog.pg_stat_activity",
        "SET search_path = public; SELECT * FROM pg_stats",
        "SELECT pg_stat_get_db_tuples_returned(1)",
        "SELECT pg_database_size('postgres')",
        "SELECT pg_tablespace_size('pg_default')",
        "SELECT pg_current_wal_lsn()",
    ],
)
def test_analysts_cannot_read_cluster_statistics(roles: BackendRoles, sql: str) -> None:
    with psycopg.connect(roles.analyst_dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)


@pytest.mark.parametrize(
    "view", ["pg_stat_database", "pg_stat_user_tables", "pg_stat_all_tables", "pg_stats"]
)
def test_statistics_views_on_the_search_path_are_shadows_without_rows(
    roles: BackendRoles, view: str
) -> None:
    with psycopg.connect(roles.analyst_dsn(), autocommit=True) as conn:
        cur = conn.execute(f"SELECT * FROM {view}")
        assert cur.fetchall() == []
        (real,) = conn.execute(
            "SELECT array_agg(attname ORDER BY attnum) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0",
            (f"pg_catalog.{view}",),
        ).fetchone() or (None,)
        assert [c.name for c in cur.description or []] == real
        (schema,) = conn.execute("SELECT current_schema()").fetchone() or (None,)
        assert schema == "public"  # tools' default schema is still public


def test_analysts_cannot_signal_each_other(roles: BackendRoles) -> None:
    with (
        psycopg.connect(roles.analyst_dsn("analyst"), autocommit=True) as alice,
        psycopg.connect(roles.analyst_dsn("bob"), autocommit=True) as bob,
    ):
        for function in ("pg_terminate_backend", "pg_cancel_backend"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                alice.execute(f"SELECT {function}(%s)", (bob.info.backend_pid,))
        # a setting an analyst gives their own role stays theirs
        alice.execute("ALTER ROLE CURRENT_USER SET statement_timeout = '1ms'")
        try:
            with psycopg.connect(roles.analyst_dsn("bob")) as again:
                assert again.execute("SHOW statement_timeout").fetchone() == ("0",)
        finally:
            alice.execute("ALTER ROLE CURRENT_USER RESET statement_timeout")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("ALTER ROLE dpproxy_pt_bob SET statement_timeout = '1ms'")


def test_the_boundary_passes_the_start_up_check(config: Config, backend: BackendConfig) -> None:
    asyncio.run(check_boundary(config, backend))


@pytest.fixture()
def admin(adult_dsn: str, roles: BackendRoles) -> Iterator[dict[str, psycopg.Connection]]:
    with (
        psycopg.connect(adult_dsn, autocommit=True) as private,
        psycopg.connect(roles.analyst_admin_dsn, autocommit=True) as analyst,
    ):
        yield {"private": private, "analyst": analyst}


@pytest.mark.parametrize(
    ("where", "breach", "repair", "message"),
    [
        (
            "private",
            "GRANT CONNECT ON DATABASE postgres TO dpproxy_pt_bob",
            "REVOKE CONNECT ON DATABASE postgres FROM dpproxy_pt_bob",
            "dpproxy_pt_bob may connect to postgres",
        ),
        (
            "private",
            "GRANT pg_read_all_stats TO dpproxy_pt_bob",
            "REVOKE pg_read_all_stats FROM dpproxy_pt_bob",
            "dpproxy_pt_bob is a member of pg_read_all_stats",
        ),
        (
            "private",
            "GRANT pg_signal_backend TO dpproxy_passthrough",
            "REVOKE pg_signal_backend FROM dpproxy_passthrough",
            "is a member of pg_signal_backend",
        ),
        (
            "private",
            "GRANT dpproxy_pt_bob TO dpproxy_pt_analyst",
            "REVOKE dpproxy_pt_bob FROM dpproxy_pt_analyst",
            "dpproxy_pt_analyst is a member of dpproxy_pt_bob",
        ),
        (
            "private",
            "ALTER ROLE dpproxy_pt_bob CREATEROLE",
            "ALTER ROLE dpproxy_pt_bob NOCREATEROLE",
            "may create roles",
        ),
        (
            "analyst",
            "GRANT EXECUTE ON FUNCTION pg_stat_get_live_tuples(oid) TO PUBLIC",
            "REVOKE EXECUTE ON FUNCTION pg_stat_get_live_tuples(oid) FROM PUBLIC",
            "may run pg_stat_get_live_tuples(oid)",
        ),
        (
            "analyst",
            "GRANT SELECT ON pg_stat_database TO dpproxy_passthrough",
            "REVOKE SELECT ON pg_stat_database FROM dpproxy_passthrough",
            "may read pg_catalog.pg_stat_database",
        ),
        (
            "analyst",
            "CREATE VIEW dpproxy_catalog.pg_stat_leak AS SELECT 32561 AS n_live_tup; "
            "GRANT SELECT ON dpproxy_catalog.pg_stat_leak TO dpproxy_passthrough",
            "DROP VIEW dpproxy_catalog.pg_stat_leak",
            "dpproxy_catalog.pg_stat_leak shows rows",
        ),
        (
            "analyst",
            "INSERT INTO public.adult (age) VALUES (39)",
            "TRUNCATE public.adult",
            "holds rows; it must be empty",
        ),
        (
            "analyst",
            "ALTER TABLE public.adult RENAME TO adult_gone",
            "ALTER TABLE public.adult_gone RENAME TO adult",
            "no stand-in for public.adult",
        ),
    ],
)
def test_serve_refuses_a_leaky_boundary(
    config: Config,
    backend: BackendConfig,
    admin: dict[str, psycopg.Connection],
    where: str,
    breach: str,
    repair: str,
    message: str,
) -> None:
    admin[where].execute(breach)
    try:
        with pytest.raises(ConfigError, match=re.escape(message)):
            asyncio.run(check_boundary(config, backend))
    finally:
        admin[where].execute(repair)
    asyncio.run(check_boundary(config, backend))


def test_serve_refuses_an_analyst_without_a_role(config: Config, backend: BackendConfig) -> None:
    carol = dataclasses.replace(config, users={**config.users, "carol": config.users["bob"]})
    with pytest.raises(ConfigError, match="user carol's role dpproxy_pt_carol does not exist"):
        asyncio.run(check_boundary(carol, backend))


def test_reader_measures(roles: BackendRoles) -> None:
    cube = CUBES[0]
    n, reach = cube.n_cells, cube.measure_reach
    kinds = np.arange(cube.n_coordinates) // n  # 0: counts, then each measure's sums
    everyone = LinearQuery.from_dense(kinds == 0, measures=reach)
    no_gain = LinearQuery.from_dense(  # capital_gain's dimension is the last
        (kinds == 0) & (np.arange(cube.n_coordinates) % 2 == 0), measures=reach
    )
    gains = LinearQuery.from_dense(kinds == 1 + cube.measure("capital_gain"), measures=reach)
    nobody = LinearQuery(cube.n_coordinates, np.array([], np.int64), np.array([]), measures=reach)

    async def run() -> list[float]:
        reader = await Reader.connect(roles.reader_dsn)
        try:
            await reader.check_columns(cube)
            return await reader.measure(cube, [everyone, no_gain, nobody, gains])
        finally:
            await reader.close()

    total, without_gain, none, gain = asyncio.run(run())
    assert (total, none) == (ADULT_ROWS, 0)
    with psycopg.connect(roles.reader_dsn) as conn:
        plain = conn.execute("SELECT count(*) FROM adult WHERE capital_gain < 1").fetchone()
        clamped = conn.execute(
            "SELECT sum(least(greatest(capital_gain, 0), 20000)) FROM adult"
        ).fetchone()
    assert plain == (without_gain,) and clamped == (gain,)


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


def test_serve_refuses_to_forget_a_ledger_left_in_the_private_database(
    backend: BackendConfig, roles: BackendRoles, admin: dict[str, psycopg.Connection]
) -> None:
    moved = dataclasses.replace(
        backend, ledger_dsn=roles.analyst_admin_dsn, ledger_schema="ledger_before"
    )
    asyncio.run(check_ledger_home(moved))  # no ledger anywhere yet: a fresh one is right
    admin["private"].execute("CREATE SCHEMA ledger_before; CREATE TABLE ledger_before.tables ()")
    try:
        with pytest.raises(ConfigError, match="starting afresh would forget the budget spent"):
            asyncio.run(check_ledger_home(moved))
        # where the ledger lives in the private database by choice, it is found there
        asyncio.run(check_ledger_home(dataclasses.replace(moved, ledger_dsn=backend.dsn)))
    finally:
        admin["private"].execute("DROP SCHEMA ledger_before CASCADE")
