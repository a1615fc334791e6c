"""Routing of DP queries with post-processing: cores, wrappers, cursors, and what stays refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import load_config
from proxy.dp.routing import Route, Router
from proxy.errors import DpproxyError

CONFIG = load_config(Path(__file__).parent.parent / "config.yaml")
ROUTER = Router(CONFIG.translator(), CONFIG.cubes)


@pytest.mark.parametrize(
    "sql",
    [
        'SELECT sex AS sex, COUNT(*) AS "COUNT(*)" FROM public.adult GROUP BY sex '
        'ORDER BY "COUNT(*)" DESC LIMIT 10000',
        "SELECT COUNT(*) FROM adult UNION SELECT 1",
        "SELECT * FROM (SELECT sex, COUNT(*) FROM adult GROUP BY sex) s",
        "SELECT DISTINCT income AS column_values FROM public.adult LIMIT 10000",
        'declare "SQL_CUR0x1" cursor with hold for SELECT COUNT(*) FROM adult',
        "DECLARE c BINARY SCROLL CURSOR WITHOUT HOLD FOR SELECT COUNT(*) FROM adult",
    ],
)
def test_post_processing_routes_as_dp_with_its_split(sql: str) -> None:
    (statement,) = ROUTER.route(sql)
    assert statement.route is Route.DP and statement.wrapped is not None


def test_plain_dp_queries_have_no_wrapper() -> None:
    (statement,) = ROUTER.route("SELECT sex, COUNT(*) FROM adult GROUP BY sex")
    assert statement.route is Route.DP and statement.wrapped is None


def test_a_cursor_keeps_its_declaration_verbatim() -> None:
    (statement,) = ROUTER.route(
        'declare "SQL_CUR0x1" cursor with hold for SELECT COUNT(*) FROM adult'
    )
    assert statement.wrapped is not None
    rendered = statement.wrapped.render(["(VALUES (1.0))"])
    assert rendered.startswith('declare "SQL_CUR0x1" cursor with hold for SELECT _dpproxy_1._a1')


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*), (SELECT reltuples FROM pg_class WHERE relname = 'adult') FROM adult",
        "SELECT COUNT(*) FROM adult ORDER BY (SELECT n_live_tup FROM pg_stat_user_tables)",
        "INSERT INTO t SELECT COUNT(*) FROM adult",
        "CREATE TABLE t AS SELECT COUNT(*) FROM adult",
        "DECLARE c CURSOR FOR SELECT * FROM adult",
        "SELECT * FROM adult ORDER BY 1",
        "SELECT a.age FROM adult a, (SELECT COUNT(*) FROM adult) c",
        # EXPLAIN of a DP query is a preview of its plan (test_routing); with options it is not
        "EXPLAIN (ANALYZE) SELECT COUNT(*) FROM adult ORDER BY 1",
        "EXPLAIN ANALYZE SELECT COUNT(*) FROM adult ORDER BY 1",
    ],
)
def test_what_is_not_post_processing_stays_refused(sql: str) -> None:
    with pytest.raises(DpproxyError) as info:
        ROUTER.route(sql)
    assert info.value.sqlstate == "42501"


def test_errors_in_a_cursor_s_query_point_into_the_statement() -> None:
    sql = "DECLARE c CURSOR FOR SELECT age, COUNT(*) FROM adult ORDER BY 2"
    with pytest.raises(DpproxyError) as info:
        ROUTER.route(sql)
    assert info.value.sqlstate == "0A000" and info.value.position == sql.index("age")
