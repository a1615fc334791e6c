"""The generated histogram SQL puts every row in exactly the right cell, on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from proxy.errors import ConfigError, DomainViolation
from sqlmap.canonical import (
    COLUMN_TYPES_SQL,
    check_column_types,
    histogram_from_rows,
    histogram_sql,
)
from sqlmap.cube import CategoricalDimension, Cube, NumericDimension

from .test_exact import DEMO_CUBE


@pytest.fixture()
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn) as c:  # each test runs in a transaction that is rolled back
        yield c
        c.rollback()


def histogram(conn: psycopg.Connection, cube: Cube) -> list[int]:
    return histogram_from_rows(cube, conn.execute(histogram_sql(cube)).fetchall()).tolist()


def test_numeric_edges_below_above_null_and_nan(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TEMP TABLE m (v float8)")
    conn.execute("INSERT INTO m VALUES (-1), (0), (0.5), (0.999), (1), (2), (7), (NULL), ('NaN')")
    cube = Cube("pg_temp", "m", (NumericDimension("v", (0, 1, 2)),))
    # bins: [0,1) [1,2) below above NULL; PostgreSQL orders NaN above every number
    assert histogram(conn, cube) == [3, 1, 1, 3, 1]


def test_open_ended_edges(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TEMP TABLE m (v int)")
    conn.execute("INSERT INTO m VALUES (-100), (39), (40), (41), (1000), (NULL)")
    cube = Cube(
        "pg_temp",
        "m",
        (NumericDimension("v", (float("-inf"), 40, 41, float("inf")), integer=True),),
    )
    assert histogram(conn, cube) == [2, 1, 2, 1]


def test_quoting_of_identifiers_and_values(conn: psycopg.Connection) -> None:
    conn.execute('CREATE TEMP TABLE "we""ird" ("Sex ""x""" text)')
    conn.execute(
        """INSERT INTO "we""ird" VALUES ('it''s'), ('a\\b'), ('it''s'), ('other'), (NULL)"""
    )
    cube = Cube("pg_temp", 'we"ird', (CategoricalDimension('Sex "x"', ("it's", "a\\b")),))
    assert histogram(conn, cube) == [2, 1, 1, 1]


def test_cells_are_row_major(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TEMP TABLE g (a text, b int)")
    conn.execute("INSERT INTO g VALUES ('x', 1), ('y', 2), ('y', 2), ('y', 3)")
    cube = Cube(
        "pg_temp",
        "g",
        (
            CategoricalDimension("a", ("x", "y"), closed=True, nullable=False),
            CategoricalDimension("b", (1, 2, 3), closed=True, nullable=False),
        ),
    )
    assert histogram(conn, cube) == [1, 0, 0, 0, 2, 1]


@pytest.mark.parametrize(
    ("value", "dimension"),
    [
        ("'z'", CategoricalDimension("a", ("x", "y"), closed=True)),
        ("NULL", CategoricalDimension("a", ("x", "y"), nullable=False)),
    ],
)
def test_broken_domain_promise_is_refused(
    conn: psycopg.Connection, value: str, dimension: CategoricalDimension
) -> None:
    conn.execute("CREATE TEMP TABLE c (a text)")
    conn.execute(f"INSERT INTO c VALUES ('x'), ({value})")
    with pytest.raises(DomainViolation, match="rows of pg_temp.c lie outside the domain") as e:
        histogram(conn, Cube("pg_temp", "c", (dimension,)))
    assert not any(c.isdigit() for c in str(e.value))  # the count is for the DBA's log only
    assert e.value.rows == 1


def column_types(conn: psycopg.Connection, schema: str, table: str) -> dict[str, str]:
    rows = conn.execute(
        COLUMN_TYPES_SQL.replace("$1", "%s").replace("$2", "%s"), (schema, table)
    ).fetchall()
    return dict(rows)


def test_demo_cube_matches_adult_columns(adult_dsn: str) -> None:
    with psycopg.connect(adult_dsn) as c:
        check_column_types(DEMO_CUBE, column_types(c, "public", "adult"))


@pytest.mark.parametrize(
    ("dimension", "message"),
    [
        (NumericDimension("nope", (0, 1)), "the table has no column 'nope'"),
        (
            NumericDimension("f", (0, 1), integer=True),
            "'integer: true' on a column of type double precision",
        ),
        (NumericDimension("t", (0, 1)), "numeric dimension on a column of type text"),
        (CategoricalDimension("i", ("a",)), "text values declared on a column of type integer"),
    ],
)
def test_column_type_mismatch(
    conn: psycopg.Connection, dimension: NumericDimension, message: str
) -> None:
    conn.execute("CREATE TABLE typed (f float8, t text, i int)")
    with pytest.raises(ConfigError, match=message):
        check_column_types(
            Cube("public", "typed", (dimension,)), column_types(conn, "public", "typed")
        )


def test_missing_table(conn: psycopg.Connection) -> None:
    cube = Cube("public", "absent", (NumericDimension("x", (0, 1)),))
    with pytest.raises(ConfigError, match="table public.absent does not exist in the backend"):
        check_column_types(cube, column_types(conn, "public", "absent"))
