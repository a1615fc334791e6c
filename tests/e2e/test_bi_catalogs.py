"""What BI tools' introspection finds through dpproxy (the stand-ins of the boundary).

The queries are the shape of Metabase's describe-fields and privilege checks and of Grafana's
table and column pickers; they pass through to the analyst database, where the protected tables
are empty stand-ins that the analysts may SELECT.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.e2e.conftest import Proxy


def test_protected_tables_are_listed_with_their_columns_and_select_privilege(
    proxy: Proxy,
) -> None:
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        tables = conn.execute(
            "SELECT quote_ident(table_name) FROM information_schema.tables "
            "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
        ).fetchall()
        columns = conn.execute(
            "SELECT c.column_name, c.udt_name FROM information_schema.columns c "
            "WHERE c.table_schema = 'public' AND c.table_name = 'adult' ORDER BY c.ordinal_position"
        ).fetchall()
        (privilege,) = conn.execute(
            "SELECT has_table_privilege('public.adult', 'SELECT')"
        ).fetchone() or (None,)
        # DBeaver's table list: every column of pg_class, statistics included
        relation = (
            conn.cursor(row_factory=dict_row)
            .execute("SELECT c.* FROM pg_class c WHERE c.relname = 'adult'")
            .fetchone()
        )
    assert ("adult",) in tables
    assert len(columns) == 15 and ("sex", "text") in columns
    assert privilege is True
    assert relation is not None and relation["reltuples"] <= 0  # the empty stand-in's


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT n.nspname AS schema, c.relname AS name, stat.n_live_tup AS estimated_row_count "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON c.relnamespace = n.oid "
        "LEFT JOIN pg_stat_user_tables stat ON n.nspname = stat.schemaname "
        "AND c.relname = stat.relname WHERE c.relkind IN ('r', 'p', 'v', 'f', 'm')",
    ],
)
def test_metabase_table_sync_still_reads_statistics_and_is_refused(proxy: Proxy, sql: str) -> None:
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)
