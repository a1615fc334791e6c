"""GROUP BY expressions decided per cell: CASE over dimensions, CAST of a dimension."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from proxy.config import load_config
from proxy.errors import DpproxyError
from sqlmap.accuracy import AccuracyDefaults
from sqlmap.cube import BinKind
from sqlmap.postprocess import split
from sqlmap.translate import GroupValue, OutputKind, Translator

from .exactness import true_histogram

ROOT = Path(__file__).parent.parent.parent
CUBE = load_config(ROOT / "config.yaml").cubes[0]
T = Translator([CUBE], AccuracyDefaults(10))

AGE_GROUPS = (
    "CASE WHEN age < 25 THEN 'young' WHEN age < 55 AND sex = 'Female' THEN 'woman' "
    "WHEN age >= 65 THEN NULL ELSE 'other' END"
)


@pytest.fixture(scope="module")
def conn(adult_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(adult_dsn, autocommit=True) as c:
        yield c


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT {AGE_GROUPS} AS g, COUNT(*), SUM(CASE WHEN income = '>50K' THEN 1 ELSE 0 END) "
        "FROM adult GROUP BY 1",
        f"SELECT race, {AGE_GROUPS}, COUNT(*) FROM adult WHERE hours_per_week >= 35 "
        f"GROUP BY race, {AGE_GROUPS}",
        "SELECT CASE sex WHEN 'Male' THEN 1 ELSE 2 END AS s, COUNT(*) FROM adult GROUP BY s",
    ],
)
def test_case_groups_are_exact(conn: psycopg.Connection, sql: str) -> None:
    spec = T.translate(sql)
    x = true_histogram(conn, CUBE)
    keys = [i for i, c in enumerate(spec.columns) if c.kind is OutputKind.GROUP_KEY]
    aggregates = [i for i, c in enumerate(spec.columns) if c.kind is OutputKind.AGGREGATE]
    truth = {
        tuple(row[i] for i in keys): [row[i] for i in aggregates]
        for row in conn.execute(sql).fetchall()
    }
    for row in spec.rows:
        key = tuple(None if k.kind is BinKind.NULL else k.value for k in row.keys)
        key = tuple(float(k) if isinstance(k, float) else k for k in key)
        want = truth.get(key, [0] * len(aggregates))  # a group no row falls in counts 0
        assert [q.evaluate(x) for q in row.queries] == [float(w) for w in want], key
    # every group PostgreSQL sees is one of the answer's, found from the cube alone
    found = {tuple(None if k.kind is BinKind.NULL else k.value for k in r.keys) for r in spec.rows}
    assert {tuple(float(v) if isinstance(v, int) else v for v in k) for k in truth} <= found


def test_case_groups_are_the_values_some_cell_can_take_in_case_order() -> None:
    spec = T.translate(f"SELECT {AGE_GROUPS} AS g, COUNT(*) FROM adult GROUP BY g")
    assert [r.keys for r in spec.rows] == [
        (GroupValue(BinKind.VALUE, "young"),),
        (GroupValue(BinKind.VALUE, "woman"),),
        (GroupValue(BinKind.NULL, None),),
        (GroupValue(BinKind.VALUE, "other"),),
    ]
    assert spec.columns[0].text and spec.columns[0].kind is OutputKind.GROUP_KEY
    # a branch no cell can reach has no row
    spec = T.translate(
        "SELECT CASE WHEN age >= 17 THEN 'all' ELSE 'none' END, COUNT(*) FROM adult GROUP BY 1"
    )
    assert len(spec.rows) == 1


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("SELECT CASE WHEN age < 30 THEN 1 END, COUNT(*) FROM adult GROUP BY 1", "0A000"),
        (
            "SELECT CASE WHEN sex = 'Male' THEN 'a' ELSE 1 END, COUNT(*) FROM adult GROUP BY 1",
            "42804",
        ),
        ("SELECT CASE WHEN sex = 'Male' THEN age END, COUNT(*) FROM adult GROUP BY 1", "0A000"),
        ("SELECT age + 1, COUNT(*) FROM adult GROUP BY 1", "0A000"),
    ],
)
def test_undecidable_or_row_level_keys_are_refused(sql: str, sqlstate: str) -> None:
    with pytest.raises(DpproxyError) as info:
        T.translate(sql)
    assert info.value.sqlstate == sqlstate


def test_cast_of_a_dimension_groups_by_the_dimension_and_casts_outside() -> None:
    tree = T.parse(
        "SELECT CAST(education AS varchar(3)) AS e, COUNT(*) FROM adult "
        "GROUP BY CAST(education AS varchar(3)) ORDER BY 2 DESC"
    )
    wrapped = split(tree, T)
    assert wrapped is not None
    (core,) = wrapped.cores
    spec = T.translate_parsed(core.select)
    assert spec.group_dims == ("education",) and len(spec.rows) == 16
    assert "CAST(_dpproxy_1._k1 AS VARCHAR(3)) AS e" in wrapped.template
