"""What BI tools' introspection finds through dpproxy (the stand-ins of the boundary).

The queries are Metabase's sync, the shape of Grafana's table and column pickers and DBeaver's
table list; they pass through to the analyst database, where the protected tables are empty
stand-ins that the analysts may SELECT, and the statistics views on the analysts' search_path
are views of no rows.
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


# Metabase's sync of a PostgreSQL database (metabase/metabase, src/metabase/driver/postgres.clj:
# get-tables-sql, current-user-table-privileges, describe-fields-sql), as HoneySQL renders it
# for pgjdbc: quoted identifiers, values as parameters.
METABASE_TABLES = (
    'SELECT "n"."nspname" AS "schema", "c"."relname" AS "name", CASE "c"."relkind" '
    "WHEN 'r' THEN 'TABLE' WHEN 'p' THEN 'PARTITIONED TABLE' WHEN 'v' THEN 'VIEW' "
    "WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE NULL END AS \"type\", "
    '"d"."description" AS "description", "stat"."n_live_tup" AS "estimated_row_count" '
    'FROM "pg_catalog"."pg_class" AS "c" '
    'INNER JOIN "pg_catalog"."pg_namespace" AS "n" ON "c"."relnamespace" = "n"."oid" '
    'LEFT JOIN "pg_catalog"."pg_description" AS "d" ON ("c"."oid" = "d"."objoid") '
    'AND ("d"."objsubid" = %s) AND ("d"."classoid" = \'pg_class\'::regclass) '
    'LEFT JOIN "pg_stat_user_tables" AS "stat" ON ("n"."nspname" = "stat"."schemaname") '
    'AND ("c"."relname" = "stat"."relname") '
    'WHERE ("c"."relnamespace" = "n"."oid") AND ("n"."nspname" !~ %s) '
    "AND (\"n\".\"nspname\" <> %s) AND c.relkind in ('r', 'p', 'v', 'f', 'm') "
    'AND ("n"."nspname" IN (%s)) ORDER BY "type" ASC, "schema" ASC, "name" ASC'
)
METABASE_TABLES_PARAMS = (0, "^pg_", "information_schema", "public")


#: '"schema"."table"' of the privilege query's row t
_QUOTED_NAME = (
    "'\"' || replace(t.schemaname, '\"', '\"\"') || '\"' || '.' || '\"' "
    "|| replace(t.objectname, '\"', '\"\"') || '\"'"
)


METABASE_PRIVILEGES = (
    "with table_privileges as ( select NULL as role, t.schemaname as schema, "
    "t.objectname as table, "
    + ", ".join(
        f"pg_catalog.{fn}(current_user, {_QUOTED_NAME}, '{right}') as {right}"
        for fn, right in (
            ("has_any_column_privilege", "update"),
            ("has_any_column_privilege", "select"),
            ("has_any_column_privilege", "insert"),
            ("has_table_privilege", "delete"),
        )
    )
    + " from ( select schemaname, tablename as objectname from pg_catalog.pg_tables union "
    "select schemaname, viewname as objectname from pg_catalog.pg_views union "
    "select schemaname, matviewname as objectname from pg_catalog.pg_matviews ) t "
    "where t.schemaname !~ '^pg_' and t.schemaname <> 'information_schema' "
    "and pg_catalog.has_schema_privilege(current_user, t.schemaname, 'usage') ) "
    "select t.* from table_privileges t"
)

METABASE_FIELDS = (
    'SELECT "c"."column_name" AS "name", CASE WHEN "c"."udt_schema" IN (\'public\', '
    '\'pg_catalog\') THEN FORMAT(\'%%s\', "c"."udt_name") ELSE FORMAT(\'"%%s"."%%s"\', '
    '"c"."udt_schema", "c"."udt_name") END AS "database-type", '
    '"c"."ordinal_position" - 1 AS "database-position", "c"."table_schema" AS "table-schema", '
    '"c"."table_name" AS "table-name", "pk"."column_name" IS NOT NULL AS "pk?", '
    'COL_DESCRIPTION(CAST(CAST(FORMAT(\'%%I.%%I\', CAST("c"."table_schema" AS TEXT), '
    'CAST("c"."table_name" AS TEXT)) AS REGCLASS) AS OID), "c"."ordinal_position") '
    'AS "field-comment" FROM "information_schema"."columns" AS "c" LEFT JOIN '
    '(SELECT "tc"."table_schema", "tc"."table_name", "kc"."column_name" '
    'FROM "information_schema"."table_constraints" AS "tc" '
    'INNER JOIN "information_schema"."key_column_usage" AS "kc" '
    'ON ("tc"."constraint_name" = "kc"."constraint_name") '
    'AND ("tc"."table_schema" = "kc"."table_schema") AND ("tc"."table_name" = "kc"."table_name") '
    'WHERE "tc"."constraint_type" = \'PRIMARY KEY\') AS "pk" '
    'ON ("c"."table_schema" = "pk"."table_schema") AND ("c"."table_name" = "pk"."table_name") '
    'AND ("c"."column_name" = "pk"."column_name") '
    "WHERE c.table_schema !~ '^information_schema|catalog_history|pg_' "
    'AND ("c"."table_schema" IN (%s)) AND ("c"."table_name" IN (%s)) '
    'ORDER BY "table-schema" ASC, "table-name" ASC, "database-position" ASC'
)


@pytest.mark.parametrize("prepare", [False, True], ids=["extended", "prepared"])
def test_metabase_sync_lists_adult_with_its_columns_and_select_privilege(
    proxy: Proxy, prepare: bool
) -> None:
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        conn.cursor_factory = psycopg.Cursor
        tables = (
            conn.cursor(row_factory=dict_row)
            .execute(METABASE_TABLES, METABASE_TABLES_PARAMS, prepare=prepare)
            .fetchall()
        )
        privileges = {
            (r["schema"], r["table"]): r
            for r in conn.cursor(row_factory=dict_row)
            .execute(METABASE_PRIVILEGES, prepare=prepare)
            .fetchall()
        }
        fields = (
            conn.cursor(row_factory=dict_row)
            .execute(METABASE_FIELDS, ("public", "adult"), prepare=prepare)
            .fetchall()
        )
    adult = [t for t in tables if t["name"] == "adult"]
    assert adult == [
        {
            "schema": "public",
            "name": "adult",
            "type": "TABLE",
            "description": adult[0]["description"],
            "estimated_row_count": None,  # the shadow of pg_stat_user_tables has no rows
        }
    ]
    assert privileges["public", "adult"]["select"] is True
    assert privileges["public", "adult"]["insert"] is False
    assert len(fields) == 15
    assert {"name": "sex", "database-type": "text"}.items() <= fields[9].items()
    assert [f["database-position"] for f in fields] == list(range(15))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT c.* FROM pg_class c WHERE c.relname = 'adult'",
        "SELECT reltuples, relpages, relallvisible FROM pg_class WHERE relname = 'adult'",
        "SELECT n_live_tup, n_tup_ins, seq_tup_read FROM pg_stat_user_tables "
        "WHERE relname = 'adult'",
        "SELECT * FROM pg_stat_all_tables",
        "SELECT * FROM pg_stats WHERE tablename = 'adult'",
        "SELECT pg_relation_size('public.adult'), pg_total_relation_size('public.adult')",
    ],
)
def test_statistics_through_dpproxy_show_nothing_derived_from_rows(
    proxy: Proxy, adult_dsn: str, sql: str
) -> None:
    with psycopg.connect(adult_dsn, autocommit=True) as admin:
        admin.execute("ANALYZE public.adult")  # the real table's statistics are current
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        rows = conn.cursor(row_factory=dict_row).execute(sql).fetchall()
    for row in rows:
        for column in ("reltuples", "n_live_tup", "n_tup_ins", "seq_tup_read"):
            assert row.get(column) in (None, -1, 0), row
        for column in ("relpages", "relallvisible", "pg_relation_size"):
            assert row.get(column) in (None, 0), row
        # an empty table's TOAST index is one metapage; the real table is over 3 MB
        assert row.get("pg_total_relation_size") in (None, 8192), row
    assert not any("most_common_vals" in row for row in rows) or rows == []


def test_statistics_views_in_pg_catalog_stay_refused_by_postgresql(proxy: Proxy) -> None:
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="pg_stat_user_tables"):
            conn.execute("SELECT n_live_tup FROM pg_catalog.pg_stat_user_tables")


# Grafana's PostgreSQL data source pickers (grafana/grafana, postgresMetaQuery.ts): the schemas
# of the search_path, the table list (unqualified when on the search_path), a table's columns.
_ON_SEARCH_PATH = (
    "quote_ident(table_schema) IN (SELECT CASE WHEN trim(s[i]) = '\"$user\"' THEN user "
    "ELSE trim(s[i]) END FROM generate_series("
    "array_lower(string_to_array(current_setting('search_path'),','),1), "
    "array_upper(string_to_array(current_setting('search_path'),','),1)) as i, "
    "string_to_array(current_setting('search_path'),',') s)"
)
GRAFANA_TABLES = (
    f"SELECT CASE WHEN {_ON_SEARCH_PATH} THEN quote_ident(table_name) "
    "ELSE quote_ident(table_schema) || '.' || quote_ident(table_name) END AS \"table\" "
    "FROM information_schema.tables WHERE quote_ident(table_schema) NOT IN "
    "('information_schema', 'pg_catalog', '_timescaledb_cache', '_timescaledb_catalog', "
    "'_timescaledb_internal', '_timescaledb_config', 'timescaledb_information', "
    f"'timescaledb_experimental') ORDER BY CASE WHEN {_ON_SEARCH_PATH} THEN 0 ELSE 1 END, 1"
)
GRAFANA_COLUMNS = (
    'SELECT quote_ident(column_name) AS "column", data_type AS "type" '
    "FROM information_schema.columns WHERE CASE WHEN array_length(parse_ident('adult'),1) = 2 "
    "THEN quote_ident(table_schema) = (parse_ident('adult'))[1] "
    "AND quote_ident(table_name) = (parse_ident('adult'))[2] "
    f"ELSE quote_ident(table_name) = 'adult' AND {_ON_SEARCH_PATH} END"
)


def test_grafana_pickers_find_adult_and_its_columns(proxy: Proxy) -> None:
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        tables = [t for (t,) in conn.execute(GRAFANA_TABLES).fetchall()]
        columns = conn.execute(GRAFANA_COLUMNS).fetchall()
    assert "adult" in tables
    assert len(columns) == 15 and ("age", "integer") in columns
