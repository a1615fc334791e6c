"""The SQL that dpproxy itself runs on protected tables, generated from the cube alone.

This is the only SQL the privileged backend role ever executes: it maps every row to its cell
and counts rows per cell. No part of it comes from a user's query text; identifiers and values
come from config.yaml and are quoted here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from sqlmap.cube import BinKind, CategoricalDimension, Cube, Dimension, NumericDimension, Scalar
from sqlmap.errors import ConfigError, DomainViolation

__all__ = [
    "quote_ident",
    "quote_literal",
    "cell_index_sql",
    "histogram_sql",
    "histogram_from_rows",
    "COLUMN_TYPES_SQL",
    "check_column_types",
]


def quote_ident(name: str) -> str:
    """Quote an identifier for PostgreSQL.

    >>> quote_ident('age'), quote_ident('we"ird')
    ('"age"', '"we""ird"')
    """
    if "\0" in name:
        raise ValueError("identifiers may not contain NUL")
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: Scalar) -> str:
    """A SQL literal for a config value (strings assume standard_conforming_strings = on).

    >>> quote_literal("it's"), quote_literal(17.0), quote_literal(0.5)
    ("'it''s'", '17', '0.5')
    """
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError("strings may not contain NUL")
        return "'" + value.replace("'", "''") + "'"
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("only finite numbers have literals")
    return str(int(number)) if number.is_integer() else repr(number)


def _bin_case(dim: Dimension, stride: int) -> str:
    """CASE mapping the column to ``bin * stride``; NULL when the row breaks a closed domain."""
    col = quote_ident(dim.name)
    index = {b: i * stride for i, b in enumerate(dim.bins)}
    by_kind = {b.kind: v for b, v in index.items() if b.kind not in (BinKind.RANGE, BinKind.VALUE)}

    def result(kind: BinKind) -> str:
        return str(by_kind[kind]) if kind in by_kind else "NULL"

    whens = [f"WHEN {col} IS NULL THEN {result(BinKind.NULL)}"]
    if isinstance(dim, NumericDimension):
        ranges = [(b, v) for b, v in index.items() if b.kind is BinKind.RANGE]
        if math.isfinite(dim.edges[0]):
            whens.append(f"WHEN {col} < {quote_literal(dim.edges[0])} THEN {result(BinKind.BELOW)}")
        for b, v in ranges:
            if math.isfinite(b.hi):  # a last range open above is the ELSE
                whens.append(f"WHEN {col} < {quote_literal(b.hi)} THEN {v}")
        open_above = not math.isfinite(dim.edges[-1])
        otherwise = str(ranges[-1][1]) if open_above else result(BinKind.ABOVE)
    else:
        for b, v in index.items():
            if b.kind is BinKind.VALUE:
                assert b.value is not None
                whens.append(f"WHEN {col} = {quote_literal(b.value)} THEN {v}")
        otherwise = result(BinKind.OTHER)
    return f"CASE {' '.join(whens)} ELSE {otherwise} END"


def cell_index_sql(cube: Cube) -> str:
    """One SQL expression giving each row's cell index (row-major), NULL for a domain violation.

    >>> from sqlmap.cube import CategoricalDimension
    >>> cube = Cube("public", "t", (CategoricalDimension("s", ("a",), nullable=False),))
    >>> print(cell_index_sql(cube))
    (CASE WHEN "s" IS NULL THEN NULL WHEN "s" = 'a' THEN 0 ELSE 1 END)
    """
    strides = np.cumprod((cube.shape[1:] + (1,))[::-1])[::-1]
    terms = [_bin_case(d, int(s)) for d, s in zip(cube.dimensions, strides)]
    return " + ".join(f"({t})" for t in terms)


def histogram_sql(cube: Cube) -> str:
    """The query returning ``(cell, n)`` for every non-empty cell of the cube."""
    table = f"{quote_ident(cube.schema)}.{quote_ident(cube.table)}"
    return f"SELECT {cell_index_sql(cube)} AS cell, count(*) AS n FROM {table} GROUP BY 1"


def histogram_from_rows(
    cube: Cube, rows: Iterable[tuple[int | None, int]]
) -> npt.NDArray[np.int64]:
    """The dense histogram x from the rows of :func:`histogram_sql`.

    Raises DomainViolation if some rows break a ``closed`` or ``nullable: false`` promise
    (their cell is NULL): counting them anywhere would make answers silently wrong.
    """
    x = np.zeros(cube.n_cells, dtype=np.int64)
    for cell, n in rows:
        if cell is None:
            promised = [d.name for d in cube.dimensions if d.closed or not d.nullable]
            raise DomainViolation(cube.qualified_name, promised, rows=n)
        x[cell] = n
    return x


#: Column name -> type of a table; parameters $1 = schema, $2 = table.
COLUMN_TYPES_SQL = (
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
    "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped"
)

_INTEGER_TYPES = {"smallint", "integer", "bigint"}
_NUMERIC_PREFIXES = ("smallint", "integer", "bigint", "numeric", "real", "double precision")
_TEXT_PREFIXES = ("text", "character varying", "character", "citext", "name")


def check_column_types(cube: Cube, column_types: Mapping[str, str]) -> None:
    """Check each dimension against its backend column type (from :data:`COLUMN_TYPES_SQL`).

    Raises ConfigError when a column is missing or its type cannot hold what the dimension
    declares, e.g. ``integer: true`` on a ``double precision`` column.
    """
    where = f"tables.{cube.qualified_name}"
    if not column_types:
        raise ConfigError(f"{where}: table {cube.qualified_name} does not exist in the backend")
    for dim in cube.dimensions:
        key = f"{where}.dimensions.{dim.name}"
        sql_type = column_types.get(dim.name)
        if sql_type is None:
            raise ConfigError(f"{key}: the table has no column {dim.name!r}")
        numeric_dim = isinstance(dim, NumericDimension) or (
            isinstance(dim, CategoricalDimension) and dim.numeric
        )
        if numeric_dim and not sql_type.startswith(_NUMERIC_PREFIXES):
            raise ConfigError(f"{key}: numeric dimension on a column of type {sql_type}")
        if not numeric_dim and not sql_type.startswith(_TEXT_PREFIXES):
            raise ConfigError(f"{key}: text values declared on a column of type {sql_type}")
        if isinstance(dim, NumericDimension) and dim.integer and sql_type not in _INTEGER_TYPES:
            raise ConfigError(f"{key}: 'integer: true' on a column of type {sql_type}")
