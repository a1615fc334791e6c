"""Splitting statements into DP cores and a post-processing wrapper (sqlmap.postprocess)."""

from __future__ import annotations

import psycopg
import pytest

from proxy.errors import DpproxyError
from sqlmap.accuracy import AccuracyDefaults, DPPostgres
from sqlmap.cube import CategoricalDimension, Cube, NumericDimension
from sqlmap.postprocess import Wrapped, needs_wrapper, split, values_relation
from sqlmap.translate import OutputKind, Translator

CUBE = Cube(
    "public",
    "adult",
    (
        NumericDimension("age", (0, 18, 65, 120), integer=True),
        CategoricalDimension("sex", ("Male", "Female")),
        CategoricalDimension("income", ("<=50K", ">50K")),
    ),
)
T = Translator([CUBE], AccuracyDefaults(10))
D = DPPostgres()


def wrap(sql: str) -> Wrapped:
    wrapped = split(D.parse(sql)[0], T)
    assert wrapped is not None
    return wrapped


def rendered(wrapped: Wrapped) -> str:
    return wrapped.render([f"<core {i}>" for i in range(len(wrapped.cores))])


def test_superset_explore_keeps_the_plain_core_and_sorts_and_cuts_outside() -> None:
    w = wrap(
        'SELECT sex AS sex, COUNT(*) AS "COUNT(*)" FROM public.adult GROUP BY sex '
        'ORDER BY "COUNT(*)" DESC LIMIT 10000'
    )
    (core,) = w.cores
    assert core.columns == ("_k1", "_a1")
    assert rendered(w) == (
        'SELECT _dpproxy_1._k1 AS sex, _dpproxy_1._a1 AS "COUNT(*)" '
        "FROM <core 0> AS _dpproxy_1(_k1, _a1) "
        'ORDER BY "COUNT(*)" DESC LIMIT 10000'
    )
    # decided exactly as the query without its post-processing
    plain = T.translate("SELECT sex, COUNT(*) FROM public.adult GROUP BY sex")
    assert T.translate_parsed(core.select).queries == plain.queries


def test_plain_queries_need_no_wrapper() -> None:
    for sql in (
        "SELECT COUNT(*) FROM adult",
        "SELECT sex, COUNT(*) + 2 * SUM(CASE WHEN age >= 18 THEN 1 ELSE 0 END) FROM adult "
        "GROUP BY sex",
        "SELECT COUNT(*), DP_INTERVAL_LOW(COUNT(*)) FROM adult",
    ):
        assert not needs_wrapper(D.parse(sql)[0])
    for sql in (
        "SELECT COUNT(*) FROM adult LIMIT 1",
        "SELECT COUNT(*) / 2 FROM adult",
        "SELECT sex, COUNT(*) FROM adult GROUP BY sex HAVING COUNT(*) > 1",
        "SELECT * FROM (SELECT COUNT(*) FROM adult) s",
    ):
        assert needs_wrapper(D.parse(sql)[0])


def test_each_aggregate_inside_arithmetic_is_a_value_of_its_own_and_a_ratio_is_one() -> None:
    w = wrap(
        "SELECT sex, COUNT(*) FILTER (WHERE income = '>50K') * 100.0 / COUNT(*) AS pct, "
        "COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () AS share FROM adult GROUP BY sex "
        "HAVING COUNT(*) > 10 ORDER BY 2 DESC"
    )
    (core,) = w.cores
    assert [e.alias for e in core.select.expressions] == ["_k1", "pct", "COUNT(*)"]
    assert rendered(w) == (
        'SELECT _dpproxy_1._k1 AS "sex", _dpproxy_1._a1 AS pct, '
        "_dpproxy_1._a2 * 100.0 / SUM(_dpproxy_1._a2) OVER () AS share "
        "FROM <core 0> AS _dpproxy_1(_k1, _a1, _a2) WHERE _dpproxy_1._a2 > 10 ORDER BY 2 DESC"
    )


def test_a_linear_select_item_stays_one_value_with_its_interval() -> None:
    w = wrap(
        "SELECT income, 2 * COUNT(*) + 1 AS x, DP_INTERVAL_HIGH(2 * COUNT(*) + 1) "
        "FROM adult a WHERE a.age >= 18 GROUP BY 1 ORDER BY x LIMIT 1 WITH ACCURACY 5"
    )
    (core,) = w.cores
    spec = T.translate_parsed(core.select)
    assert spec.accuracy is not None and spec.accuracy.eps == 5
    assert [c.name for c in spec.columns] == ["_k1", "x", "_i1"]
    assert spec.rows[0].queries[0].offset == 1
    assert "dp_interval_high(" not in rendered(w).lower()  # the column keeps its name only


def test_cores_in_subqueries_ctes_and_joins_are_replaced_in_place() -> None:
    w = wrap(
        "WITH x AS (SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex) "
        "SELECT p.label, x.n FROM x JOIN labels p ON p.sex = x.sex "
        "WHERE x.n > (SELECT COUNT(*) / 4 FROM adult) ORDER BY x.n"
    )
    assert len(w.cores) == 2
    text = rendered(w)
    assert "adult" not in text and "JOIN labels AS p ON p.sex = x.sex" in text
    assert "(SELECT _dpproxy_1._a1 / 4 FROM <core 0> AS _dpproxy_1(_a1))" in text


def test_avg_and_ratios_are_values_of_the_core_wherever_they_appear() -> None:
    cube = Cube("public", "adult", (CategoricalDimension("kids", (0, 1, 2), closed=True),))
    w = split(
        D.parse(
            "SELECT AVG(kids), COUNT(*) FROM adult HAVING AVG(kids) > 1 "
            "ORDER BY SUM(kids) / COUNT(kids)"
        )[0],
        Translator([cube]),
    )
    assert w is not None
    assert [e.alias for e in w.cores[0].select.expressions] == [
        "avg",
        "count",
        "SUM(kids) / COUNT(kids)",
    ]
    assert rendered(w) == (
        'SELECT _dpproxy_1._a1 AS "avg", _dpproxy_1._a2 AS "count" '
        "FROM <core 0> AS _dpproxy_1(_a1, _a2, _a3) WHERE _dpproxy_1._a1 > 1 "
        "ORDER BY _dpproxy_1._a3"
    )
    kinds = [c.kind for c in Translator([cube]).translate_parsed(w.cores[0].select).columns]
    assert kinds == [OutputKind.RATIO, OutputKind.AGGREGATE, OutputKind.RATIO]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM adult ORDER BY 1",
        "SELECT COUNT(*) FROM adult JOIN t ON true",
        "SELECT x.n FROM t JOIN (SELECT * FROM adult) x ON true",
        "WITH adult AS (SELECT 1 AS a) SELECT COUNT(*) FROM adult",
        "SELECT age, COUNT(*) OVER () FROM adult",
        "SELECT 1 FROM other_table",
    ],
)
def test_anything_but_aggregating_cores_is_left_to_the_router(sql: str) -> None:
    assert split(D.parse(sql)[0], T) is None


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELECT age, COUNT(*) FROM adult ORDER BY 2", "column age must appear in the GROUP BY"),
        ("SELECT DISTINCT age FROM adult", "only the declared values of a dimension"),
        ("SELECT DISTINCT sex FROM adult WHERE age > 18", "cannot be filtered"),
        ("SELECT *, COUNT(*) FROM adult LIMIT 1", "SELECT *"),
    ],
)
def test_cores_that_release_rows_are_refused(sql: str, words: str) -> None:
    with pytest.raises(DpproxyError, match=words) as info:
        split(D.parse(sql)[0], T)
    assert info.value.sqlstate == "0A000" and info.value.position is not None


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT DISTINCT sex FROM adult ORDER BY 1 LIMIT 10",
        "SELECT sex AS sex FROM public.adult GROUP BY sex ORDER BY sex ASC LIMIT 1000",
    ],
)
def test_a_dimension_s_values_are_listed_from_the_config(sql: str) -> None:
    (core,) = wrap(sql).cores
    assert core.rows == (("Male",), ("Female",), (None,)) and core.types == ("text",)
    assert "LIMIT" in rendered(wrap(sql))


def test_values_of_two_dimensions_are_every_combination() -> None:
    (core,) = wrap("SELECT DISTINCT sex, income FROM adult").cores
    assert core.rows is not None and len(core.rows) == 9


def test_values_relation_casts_and_escapes() -> None:
    assert values_relation([("it's \\ here", None)], ["text", "float8"]) == (
        "(VALUES (E'it''s \\\\ here'::text, NULL::float8))"
    )
    with pytest.raises(ValueError):
        values_relation([(float("nan"),)], ["float8"])


def test_postgres_reads_the_rendered_wrapper(pg_dsn: str) -> None:
    w = wrap(
        "SELECT sex, COUNT(*) AS n, COUNT(*) / SUM(COUNT(*)) OVER () AS share FROM adult "
        "GROUP BY sex ORDER BY n DESC LIMIT 2"
    )
    rows = [("Male", 30.5), ("it's \\", 10.0), (None, 0.0)]
    sql = w.render([values_relation(rows, ["text", "float8"])])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET standard_conforming_strings = off")
        cur = conn.execute(sql)
        assert [c.name for c in cur.description or ()] == ["sex", "n", "share"]
        assert cur.fetchall() == [("Male", 30.5, 30.5 / 40.5), ("it's \\", 10.0, 10.0 / 40.5)]
