"""What JDBC-based tools send, through pgjdbc itself (the Debian package), replayed step by step.

Metabase's sync (its table list, privilege and describe-fields queries, with parameters) and a
breakout question; DBeaver's navigator (schemas, ``c.*`` of pg_class, a table's columns, its
statistics tab); Tableau's cursor sequence (``declare ... cursor with hold``, ``fetch 2048``)
and pgjdbc's own fetch-size cursor (a portal read a few rows at a time). The steps run through
`tests/e2e/jdbc/SqlReplay.java`, compiled at test time; without a JDK or pgjdbc this module is
skipped, saying why.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.e2e.conftest import Proxy
from tests.e2e.pgjdbc import NEEDS_PGJDBC, compile_client, java
from tests.e2e.test_bi_catalogs import (
    METABASE_FIELDS,
    METABASE_PRIVILEGES,
    METABASE_TABLES,
    METABASE_TABLES_PARAMS,
)

ACCURACY = 200.0
BOUND = 5 * ACCURACY  # P(|noise| > 5 accuracy) is negligible when P(|noise| > accuracy) is 5%

pytestmark = NEEDS_PGJDBC

Rows = dict[int, list[dict[str, str | None]]]


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_client(tmp_path_factory.mktemp("sqlreplay"), "SqlReplay.java")


@pytest.fixture(scope="module")
def truth(adult_dsn: str) -> dict[str, float]:
    with psycopg.connect(adult_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT sex, COUNT(*) FROM adult GROUP BY sex UNION ALL "
            "SELECT 'rich ' || sex, COUNT(*) FROM adult WHERE income = '>50K' GROUP BY sex"
        ).fetchall()
    return {str(k): float(v) for k, v in rows}


def jdbc(sql: str) -> str:
    """psycopg's placeholders as JDBC's: ``%s`` is ``?``, ``%%`` is ``%``."""
    return re.sub(r"%%|%s", lambda m: "%" if m.group() == "%%" else "?", sql)


def replay(proxy: Proxy, classes: Path, steps: list[list[str]]) -> tuple[Rows, dict[int, str]]:
    """Each step's rows (column -> text, None for NULL) and each failed step's SQLSTATE."""
    url = f"jdbc:postgresql://{proxy.host}:{proxy.port}/demo?options=-c%20dp.accuracy%3D200"
    result = subprocess.run(
        java(classes, "SqlReplay", url),
        input="".join("\t".join(step).replace("\n", "\\n") + "\n" for step in steps),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows: Rows = {}
    failed: dict[int, str] = {}
    for line in result.stdout.splitlines():
        step, *cells = line.split("\t")
        if cells and cells[0].startswith("!"):
            failed[int(step)] = cells[0][1:]
            continue
        pairs = (cell.split("=", 1) for cell in cells)
        rows.setdefault(int(step), []).append({k: None if v == "\\N" else v for k, v in pairs})
    return rows, failed


def test_metabase_sync_and_breakout_through_pgjdbc(
    proxy: Proxy, classes: Path, truth: dict[str, float]
) -> None:
    params = [f"int:{p}" if isinstance(p, int) else f"str:{p}" for p in METABASE_TABLES_PARAMS]
    rows, failed = replay(
        proxy,
        classes,
        [
            ["query", jdbc(METABASE_TABLES), *params],
            ["query", jdbc(METABASE_PRIVILEGES)],
            ["query", jdbc(METABASE_FIELDS), "str:public", "str:adult"],
            [
                "query",
                'SELECT "public"."adult"."sex" AS "sex", count(*) AS "count" FROM "public"."adult" '
                'GROUP BY "public"."adult"."sex" ORDER BY "public"."adult"."sex" ASC',
            ],
            # a filtered question: the filter's value a parameter
            [
                "query",
                'SELECT "public"."adult"."sex" AS "sex", count(*) AS "count" FROM "public"."adult" '
                'WHERE "public"."adult"."income" = ? GROUP BY "public"."adult"."sex" '
                'ORDER BY "count" DESC',
                "str:>50K",
            ],
        ],
    )
    assert failed == {}
    (adult,) = [t for t in rows[0] if t["name"] == "adult"]
    assert adult["type"] == "TABLE" and adult["estimated_row_count"] is None
    (privileges,) = [p for p in rows[1] if (p["schema"], p["table"]) == ("public", "adult")]
    assert privileges["select"] == "t" and privileges["insert"] == "f"
    assert [f["name"] for f in rows[2]][:3] == ["age", "workclass", "fnlwgt"]
    assert len(rows[2]) == 15
    assert [r["sex"] for r in rows[3]] == ["Female", "Male"]
    for row in rows[3]:
        assert abs(float(row["count"] or "nan") - truth[str(row["sex"])]) <= BOUND
    assert [r["sex"] for r in rows[4]] == ["Male", "Female"]
    for row in rows[4]:
        assert abs(float(row["count"] or "nan") - truth["rich " + str(row["sex"])]) <= BOUND


def test_dbeaver_navigator_through_pgjdbc(proxy: Proxy, classes: Path) -> None:
    rows, failed = replay(
        proxy,
        classes,
        [
            [
                "query",
                "SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = ?",
                "str:public",
            ],
            [
                "query",
                "SELECT n.oid,n.*,d.description FROM pg_catalog.pg_namespace n\n"
                "LEFT OUTER JOIN pg_catalog.pg_description d ON d.objoid=n.oid "
                "AND d.objsubid=0 AND d.classoid='pg_namespace'::regclass\nORDER BY nspname",
            ],
            [
                "query",
                "SELECT c.oid,c.*,d.description,pg_catalog.pg_get_expr(c.relpartbound, c.oid) "
                "as partition_expr,  pg_catalog.pg_get_partkeydef(c.oid) as partition_key \n"
                "FROM pg_catalog.pg_class c\nLEFT OUTER JOIN pg_catalog.pg_description d "
                "ON d.objoid=c.oid AND d.objsubid=0 AND d.classoid='pg_class'::regclass\n"
                "WHERE c.relnamespace=? AND c.relkind not in ('i','I','c')",
                "first:0",
            ],
            ["query", "SELECT 'public.adult'::regclass::oid"],
            [
                "query",
                "SELECT c.relname,a.*,pg_catalog.pg_get_expr(ad.adbin, ad.adrelid, true) as "
                "def_value,dsc.description,dep.objid\nFROM pg_catalog.pg_attribute a\n"
                "INNER JOIN pg_catalog.pg_class c ON (a.attrelid=c.oid)\n"
                "LEFT OUTER JOIN pg_catalog.pg_attrdef ad ON (a.attrelid=ad.adrelid "
                "AND a.attnum = ad.adnum)\nLEFT OUTER JOIN pg_catalog.pg_description dsc "
                "ON (c.oid=dsc.objoid AND a.attnum = dsc.objsubid)\nLEFT OUTER JOIN pg_depend dep "
                "on dep.refobjid = a.attrelid AND dep.deptype = 'i' and dep.refobjsubid = a.attnum "
                "and dep.classid = dep.refclassid\nWHERE NOT a.attisdropped "
                "AND c.relkind not in ('i','I','c') AND c.oid=? AND a.attnum > 0\n"
                "ORDER BY a.attnum",
                "first:3",
            ],
            [
                "query",
                "select c.oid,pg_catalog.pg_total_relation_size(c.oid) as total_rel_size,"
                "pg_catalog.pg_relation_size(c.oid) as rel_size\nFROM pg_class c\n"
                "WHERE c.relnamespace=? AND c.oid=?",
                "first:0",
                "first:3",
            ],
        ],
    )
    assert failed == {}
    assert "public" in [n["nspname"] for n in rows[1]]
    (adult,) = [c for c in rows[2] if c["relname"] == "adult"]
    assert adult["reltuples"] == "-1" and adult["relpages"] == "0"  # the stand-in's
    assert len(rows[4]) == 15 and rows[4][0]["attname"] == "age"
    (size,) = rows[5]
    assert size["rel_size"] == "0" and int(size["total_rel_size"] or "-1") <= 8192


def test_tableau_cursor_and_pgjdbc_fetch_size(
    proxy: Proxy, classes: Path, truth: dict[str, float]
) -> None:
    query = "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex ORDER BY sex"
    rows, failed = replay(
        proxy,
        classes,
        [
            ["autocommit", "off"],
            ["exec", f'declare "SQL_CUR0x7f1" cursor with hold for {query}'],
            ["exec", 'fetch 2048 in "SQL_CUR0x7f1"'],
            ["exec", 'close "SQL_CUR0x7f1"'],
            ["commit"],
            # pgjdbc's own cursor: a named portal, Execute with a row limit of 1, again and again
            ["fetch", "1", f"{query} LIMIT 5"],
            ["commit"],
            ["autocommit", "on"],
            # psqlODBC's shape: the whole sequence as one query string
            [
                "exec",
                f'BEGIN;declare "SQL_CUR0x7f2" cursor with hold for {query};'
                'fetch 2048 in "SQL_CUR0x7f2";close "SQL_CUR0x7f2";COMMIT',
            ],
        ],
    )
    assert failed == {}
    for step in (2, 5, 8):
        assert [r["sex"] for r in rows[step]] == ["Female", "Male"], step
        for row in rows[step]:
            assert abs(float(row["n"] or "nan") - truth[str(row["sex"])]) <= BOUND
