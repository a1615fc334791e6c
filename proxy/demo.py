"""Loads the UCI Adult demo table (shipped in ``proxy/demo_data``) into PostgreSQL."""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from importlib import resources

import psycopg
from psycopg import sql

__all__ = ["ADULT_COLUMNS", "ADULT_ROWS", "adult_rows", "load_adult"]

#: The demo table's columns, in file order, with their SQL types.
ADULT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("age", "int"),
    ("workclass", "text"),
    ("fnlwgt", "int"),
    ("education", "text"),
    ("education_num", "int"),
    ("marital_status", "text"),
    ("occupation", "text"),
    ("relationship", "text"),
    ("race", "text"),
    ("sex", "text"),
    ("capital_gain", "int"),
    ("capital_loss", "int"),
    ("hours_per_week", "int"),
    ("native_country", "text"),
    ("income", "text"),
)

#: Rows in ``adult.data``.
ADULT_ROWS = 32_561


def adult_rows() -> Iterator[list[str | None]]:
    """The rows of ``adult.data``: leading spaces stripped, ``?`` as None, blank lines skipped."""
    raw = resources.files("proxy").joinpath("demo_data/adult.data.gz").read_bytes()
    text = io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(raw)), encoding="ascii", newline="")
    for record in csv.reader(text, skipinitialspace=True):
        if not record:
            continue
        if len(record) != len(ADULT_COLUMNS):
            raise ValueError(f"adult.data: expected {len(ADULT_COLUMNS)} fields, got {len(record)}")
        yield [None if field == "?" else field for field in record]


def load_adult(dsn: str, table: str = "adult", schema: str = "public") -> int:
    """Create ``schema.table`` and fill it with the Adult rows unless it already holds them.

    Returns the number of rows in the table. Idempotent: a complete table is left alone, a
    partial one (an interrupted load) is replaced, all in one transaction.
    """
    name = sql.Identifier(schema, table)
    columns = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in ADULT_COLUMNS
    )
    with psycopg.connect(dsn) as conn:
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (name.as_string(conn),)
        ).fetchone()
        if exists and exists[0]:
            count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(name)).fetchone()
            if count and count[0] == ADULT_ROWS:
                return ADULT_ROWS
            conn.execute(sql.SQL("DROP TABLE {}").format(name))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(name, columns))
        with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(name)) as copy:
            for row in adult_rows():
                copy.write_row(row)
        conn.execute(sql.SQL("ANALYZE {}").format(name))
    return ADULT_ROWS
