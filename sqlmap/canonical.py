"""The SQL that dpproxy itself runs on protected tables, generated from the cube alone.

This is the only SQL the privileged backend role ever executes. :func:`measurement_sql` computes
the true answers a plan needs: it reads only the rows the query vectors weigh and groups them only
by the dimensions their weights vary on. :func:`histogram_sql` counts the rows of every cell (a
reference for tests). No part of either comes from a user's query text: they are built from the
cube and the vectors, and identifiers and values come from config.yaml and are quoted here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from sqlmap.cube import (
    BinKind,
    CategoricalDimension,
    Cube,
    Dimension,
    Measure,
    NumericDimension,
    Scalar,
)
from sqlmap.errors import ConfigError, DomainViolation
from sqlmap.vector import LinearQuery

__all__ = [
    "quote_ident",
    "quote_literal",
    "cell_index_sql",
    "clamped_sum_sql",
    "histogram_sql",
    "histogram_from_rows",
    "MeasurementSql",
    "measurement_sql",
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


def clamped_sum_sql(measure: Measure) -> str:
    """The sum over a group's rows of a measure clamped to its bounds, NULLs adding 0.

    >>> print(clamped_sum_sql(Measure("gain", 0, 20000)))
    sum(least(greatest("gain", 0), 20000))
    """
    # least/greatest skip NULLs (greatest(NULL, 0) is 0): the column's NULLs are kept apart
    col = quote_ident(measure.name)
    clamped = f"least(greatest({col}, {measure.lower}), {measure.upper})"
    if measure.lower > 0 or measure.upper < 0:
        clamped = f"CASE WHEN {col} IS NULL THEN 0 ELSE {clamped} END"
    return f"sum({clamped})"


def _nulls_sql(measures: Iterable[Measure]) -> str | None:
    """Counts the rows where a measure promised NOT NULL (``nulls: never``) is NULL."""
    never = [f"{quote_ident(m.name)} IS NULL" for m in measures if not m.nullable]
    return f"count(*) FILTER (WHERE {' OR '.join(never)})" if never else None


def histogram_sql(cube: Cube) -> str:
    """The query returning ``(cell, n, sums...)`` for every non-empty cell of the cube.

    After the count, one clamped sum per measure (:func:`clamped_sum_sql`), and then, if some
    measure is promised NOT NULL, how many rows break that promise.
    """
    table = f"{quote_ident(cube.schema)}.{quote_ident(cube.table)}"
    sums = [clamped_sum_sql(m) for m in cube.measures]
    nulls = _nulls_sql(cube.measures)
    columns = ", ".join([f"{cell_index_sql(cube)} AS cell", "count(*) AS n", *sums])
    return f"SELECT {columns}{'' if nulls is None else ', ' + nulls} FROM {table} GROUP BY 1"


def histogram_from_rows(cube: Cube, rows: Iterable[Sequence[Any]]) -> npt.NDArray[np.int64]:
    """The dense vector x (counts, then each measure's sums) from the rows of :func:`histogram_sql`.

    Raises DomainViolation if some rows break a ``closed`` or ``nullable: false`` promise
    (their cell is NULL), or a measure's ``nulls: never``: counting them anywhere would make
    answers silently wrong.
    """
    x = np.zeros(cube.n_coordinates, dtype=np.int64)
    kinds = 1 + len(cube.measures)
    for row in rows:
        cell, n = row[0], row[1]
        if cell is None:
            _refuse_broken(cube, n)
        if len(row) > 1 + kinds and row[1 + kinds]:
            _refuse_broken(cube, row[1 + kinds])
        for kind in range(kinds):
            x[kind * cube.n_cells + cell] = row[1 + kind] or 0
    return x


def _refuse_broken(cube: Cube, rows: int) -> None:
    """Raise DomainViolation for ``rows`` rows that break a promise of the cube's config."""
    promised = [d.name for d in cube.dimensions if d.closed or not d.nullable]
    promised += [m.name for m in cube.measures if not m.nullable]
    raise DomainViolation(cube.qualified_name, promised, rows=rows)


def _numeric_segments(dim: NumericDimension) -> list[tuple[int | None, float, float]]:
    """The number line in order as ``(bin, lo, hi)``, following :func:`_bin_case`.

    ``bin`` is None for a segment a closed dimension rules out. PostgreSQL orders NaN above
    every number, so it lies in the last segment, as in the CASE.
    """
    index = {b: i for i, b in enumerate(dim.bins)}
    by_kind = {b.kind: i for b, i in index.items()}
    first, last = dim.edges[0], dim.edges[-1]
    segments: list[tuple[int | None, float, float]] = []
    if math.isfinite(first):
        segments.append((by_kind.get(BinKind.BELOW), -math.inf, first))
    segments += [(i, b.lo, b.hi) for b, i in index.items() if b.kind is BinKind.RANGE]
    if math.isfinite(last):
        segments.append((by_kind.get(BinKind.ABOVE), last, math.inf))
    return segments


def _bins_predicate(dim: Dimension, bins: set[int]) -> str:
    """A condition true exactly for the rows :func:`_bin_case` puts in one of ``bins``.

    False or NULL for every other row, including rows that break a closed domain.
    """
    col = quote_ident(dim.name)
    terms = []
    if isinstance(dim, NumericDimension):
        segments = _numeric_segments(dim)
        start = None
        for k, (b, _, _) in enumerate([*segments, (None, 0.0, 0.0)]):
            inside = b is not None and b in bins
            if inside and start is None:
                start = k
            elif not inside and start is not None:
                lo, hi = segments[start][1], segments[k - 1][2]
                bounds = ([f"{col} >= {quote_literal(lo)}"] if math.isfinite(lo) else []) + (
                    [f"{col} < {quote_literal(hi)}"] if math.isfinite(hi) else []
                )
                terms.append(" AND ".join(bounds) or f"{col} IS NOT NULL")
                start = None
    else:
        values = [
            quote_literal(b.value)
            for i, b in enumerate(dim.bins)
            if i in bins and b.kind is BinKind.VALUE and b.value is not None
        ]
        if values:
            terms.append(
                f"{col} = {values[0]}" if len(values) == 1 else f"{col} IN ({', '.join(values)})"
            )
        if any(dim.bins[i].kind is BinKind.OTHER for i in bins):
            declared = ", ".join(quote_literal(v) for v in dim.values)
            terms.append(f"{col} NOT IN ({declared})")
    if any(dim.bins[i].kind is BinKind.NULL for i in bins):
        terms.append(f"{col} IS NULL")
    return " OR ".join(f"({t})" for t in terms) if len(terms) > 1 else terms[0]


def _promised(dim: Dimension) -> bool:
    """Whether some value of the column lies in no bin (a closed or non-null domain)."""
    return dim.closed or not dim.nullable


@dataclass(frozen=True, slots=True, eq=False)
class MeasurementSql:
    """The SQL computing the true answers of some query vectors, and how to read its rows.

    ``sql`` returns one row per group of the dimensions the vectors' weights vary on: a key
    column per such dimension (its bin from :func:`_bin_case`, or the text value of a closed
    text dimension), the number of rows ``n``, when the rows of some other dimension must be
    checked against its promise ``n_inside`` (how many of them lie in the bins weighed; the
    others break a closed or non-null domain), the clamped sum of each measure the vectors
    weigh, and, if one of those is promised NOT NULL, how many rows break that promise. It is
    None when the vectors weigh no cell (every answer is 0 without reading anything).

    Attributes:
        cube: the cube.
        sql: the statement, or None.
        keys: per key column, its stride in the group number and, for a text value, the bin
            of every value a row may hold (a value not there breaks the promise).
        checked: whether the rows have ``n_inside``.
        kinds: the coordinate kinds the rows give after the count: each summed measure's
            kind (``1 + `` its position among the cube's measures).
        nulls: whether the rows end with the count of NULLs of measures promised NOT NULL.
        weights: per query, per kind (the count, then each measure's sums), its weight in each
            group it weighs, as ``(groups, weights)``.
    """

    cube: Cube
    sql: str | None
    keys: tuple[tuple[int, Mapping[str | None, int] | None], ...]
    checked: bool
    kinds: tuple[int, ...]
    nulls: bool
    weights: tuple[tuple[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]], ...], ...]

    def answers(self, rows: Iterable[Sequence[Any]]) -> list[float]:
        """Each query's exact answer ``q . x``, rounded once, from the rows of :attr:`sql`.

        Raises DomainViolation if some rows the vectors weigh break a ``closed`` or
        ``nullable: false`` promise, or a measure's ``nulls: never``, as
        :func:`histogram_from_rows` does.
        """
        values: list[dict[int, int]] = [{} for _ in range(1 + len(self.cube.measures))]
        broken = 0
        first_sum = len(self.keys) + 1 + self.checked
        for row in rows:
            n = int(row[len(self.keys)])
            group = self._group(row)
            if group is None:
                broken += n
                continue
            values[0][group] = n
            broken += n - int(row[len(self.keys) + 1]) if self.checked else 0
            for j, kind in enumerate(self.kinds):
                # an integer column's clamped sum is an integer (numeric past bigint's range)
                values[kind][group] = int(row[first_sum + j] or 0)
            broken += int(row[first_sum + len(self.kinds)]) if self.nulls else 0
        if broken:  # refused as the whole histogram refuses them (one error, one place)
            _refuse_broken(self.cube, broken)
        answers = []
        for parts in self.weights:
            terms: list[tuple[float, int]] = []
            for kind, (groups, weights) in enumerate(parts):
                if groups.size == 0:
                    continue
                known = values[kind]
                keys = np.fromiter(known, dtype=np.int64, count=len(known))
                sizes = list(known.values())
                at = np.minimum(np.searchsorted(groups, keys), groups.size - 1)
                hit = groups[at] == keys
                terms += [(weights[a], k) for a, k, h in zip(at, sizes, hit) if h]
            if all(float(w).is_integer() for w, _ in terms):  # integer weights: exact in ints
                answers.append(float(sum(int(w) * k for w, k in terms)))
            else:
                answers.append(float(sum(Fraction(float(w)) * k for w, k in terms)))
        return answers

    def _group(self, row: Sequence[Any]) -> int | None:
        """The group number of a row's keys; None if a key is no bin (a broken promise)."""
        group = 0
        for value, (stride, bins) in zip(row, self.keys):
            b = value if bins is None else bins.get(value)
            if b is None:
                return None
            group += int(b) * stride
        return group


def _raw_key(dim: Dimension) -> Mapping[str | None, int] | None:
    """The bin of each value of a closed text dimension, whose rows are grouped by value.

    PostgreSQL groups such a column as cheaply as the analyst's GROUP BY, where a CASE would
    compare each row with every declared value. Values compare as text (``::text`` drops a
    ``character(n)`` column's padding, as its ``=`` does); a value that is not byte for byte a
    declared one breaks the promise (under a case-insensitive type or collation, too).
    """
    if not (isinstance(dim, CategoricalDimension) and dim.closed and not dim.numeric):
        return None
    return {None if b.kind is BinKind.NULL else str(b.value): i for i, b in enumerate(dim.bins)}


Part = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]


def _grid(
    shape: tuple[int, ...], kinds: int, query: LinearQuery, union: Sequence[int]
) -> npt.NDArray[np.float64]:
    """A vector's weights over ``(kind, *the dimensions in union)``, constant along the others.

    A vector held cell by cell is a tensor over every dimension (``union`` is then all of them).
    """
    if query.core is None or query.shape != shape:
        return query.to_dense().reshape((kinds, *shape))
    core = query.core.reshape([kinds] + [shape[d] if d in query.axes else 1 for d in union])
    return np.broadcast_to(core, (kinds, *(shape[d] for d in union)))


def _by_kind(grid: npt.NDArray[np.float64]) -> list[Part]:
    """A vector's weighed points of the grid and their weights, per kind (``grid[kind]``)."""
    kind, points = np.nonzero(grid)
    ends = np.searchsorted(kind, np.arange(grid.shape[0] + 1))
    weights = grid[kind, points]
    return [(points[a:b], weights[a:b]) for a, b in zip(ends[:-1], ends[1:])]


def _atoms(parts: Iterable[Part], size: int) -> npt.NDArray[np.int64]:
    """Ids such that points with equal weights in every part share one (0: weighed by none).

    Linear time in the common cases (equal weights, disjoint supports), a sort otherwise.
    """
    atom = np.zeros(size, dtype=np.int64)
    next_id = 1
    for points, weights in parts:
        if not points.size:
            continue
        before = atom[points]
        if weights.min() == weights.max() and before.min() == before.max():
            atom[points] = next_id
            next_id += 1
            continue
        weight_ids = np.unique(weights, return_inverse=True)[1]
        distinct, inverse = np.unique(before * (points.size + 1) + weight_ids, return_inverse=True)
        atom[points] = next_id + inverse
        next_id += distinct.size
    return atom


def measurement_sql(cube: Cube, queries: Sequence[LinearQuery]) -> MeasurementSql:
    """The SQL that computes ``q . x`` for each query, reading only what the queries weigh.

    The hull of the queries' support (per dimension, the bins some weighted cell lies in)
    restricts the rows; within it, the query weights vary along only some dimensions, and the
    SQL groups by those dimensions' bins alone. A range count over the bins of a few
    dimensions is then one filtered count, a GROUP BY one group per key, as PostgreSQL would
    compute the user's own query. A vector weighing a measure's sums adds that measure's
    clamped sum per group (:func:`clamped_sum_sql`); its weights, too, decide the grouping.

    All of it is worked out on the grid of the dimensions some factored vector depends on (a
    vector held cell by cell depends on all of them), never over the cube's cells: along any
    other dimension every vector is constant, so its hull is all bins and it is not grouped.

    Domain violations are refused as by :func:`histogram_from_rows` in every dimension the
    queries read: the restriction lets through rows that break a dimension's promise (it
    excludes only rows in declared bins outside the hull), and such rows fall in no group or
    outside ``n_inside``. Rows breaking the promise of a dimension the queries do not depend
    on count where any of its bins would put them, which every answer of such queries agrees
    with.
    """
    shape, n_coordinates, reach = cube.shape, cube.n_coordinates, cube.measure_reach
    if any(q.n_cells != n_coordinates or q.measures != reach or q.offset for q in queries):
        raise ValueError("measurements are offset-free vectors over this cube's coordinates")
    axes = range(len(shape))
    if all(q.core is not None and q.shape == shape for q in queries):
        union = sorted({d for q in queries for d in q.axes})
    else:
        union = list(axes)
    kinds_n = 1 + len(cube.measures)
    grid_shape = tuple(shape[d] for d in union)
    size = math.prod(grid_shape)
    # per query, per kind: the points of the grid it weighs, and their weights
    parts = [_by_kind(_grid(shape, kinds_n, q, union).reshape(kinds_n, size)) for q in queries]
    weighed = np.zeros(size, dtype=bool)
    for points, _ in (part for by_kind in parts for part in by_kind):
        weighed[points] = True
    if not weighed.any():
        return MeasurementSql(cube, None, (), False, (), False, tuple(map(tuple, parts)))
    atom = _atoms((part for by_kind in parts for part in by_kind), size)

    # the hull: per dimension, the bins some weighed cell lies in; the atoms over it
    on_grid = range(len(union))
    weighed_grid = weighed.reshape(grid_shape)
    hull = [np.arange(n) for n in shape]
    for g, d in enumerate(union):
        hull[d] = np.flatnonzero(weighed_grid.any(axis=tuple(e for e in on_grid if e != g)))
    dense = atom.reshape(grid_shape)
    if any(hull[d].size < shape[d] for d in union):
        dense = dense[np.ix_(*(hull[d] for d in union))]
    varies = dense.min() != dense.max()  # else (a range count) no dimension is grouped
    grouped = [
        d
        for g, d in enumerate(union)
        if varies and hull[d].size > 1 and not np.all(dense == dense.take([0], axis=g))
    ]
    restricted = [d for d, dim in enumerate(cube.dimensions) if hull[d].size < dim.size]

    strides = {d: math.prod(shape[e] for e in grouped if e > d) for d in grouped}
    columns, key_bins = [], []
    for d in grouped:
        dim = cube.dimensions[d]
        bins = _raw_key(dim)
        columns.append(f"{quote_ident(dim.name)}::text" if bins else f"({_bin_case(dim, 1)})")
        key_bins.append((strides[d], bins))
    where, inside = [], []
    for d in restricted:
        dim, chosen = cube.dimensions[d], {int(b) for b in hull[d]}
        if _promised(dim):
            # exclude only rows in declared bins outside the hull: violations get through
            outside = set(range(dim.size)) - chosen
            where.append(f"({_bins_predicate(dim, outside)}) IS NOT TRUE")
            if d not in grouped:
                inside.append(f"({_bins_predicate(dim, chosen)})")
        else:
            where.append(f"({_bins_predicate(dim, chosen)})")
    table = f"{quote_ident(cube.schema)}.{quote_ident(cube.table)}"
    counts = ["count(*) AS n"]
    if inside:
        counts.append(f"count(*) FILTER (WHERE {' AND '.join(inside)}) AS n_inside")
    kinds = tuple(k for k in range(1, kinds_n) if any(p[k][0].size for p in parts))
    summed = [cube.measures[k - 1] for k in kinds]
    counts += [clamped_sum_sql(m) for m in summed]
    nulls = _nulls_sql(summed)
    if nulls is not None:
        counts.append(nulls)
    sql = f"SELECT {', '.join(columns + counts)} FROM {table}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if columns:
        sql += " GROUP BY " + ", ".join(str(k + 1) for k in range(len(columns)))

    group_of = np.zeros(grid_shape, dtype=np.int64)
    for g, d in enumerate(union):
        if d in strides:
            spread = [-1 if e == g else 1 for e in on_grid]
            group_of += (np.arange(shape[d]) * strides[d]).reshape(spread)
    group_of = group_of.reshape(-1)
    n_groups = math.prod(shape[d] for d in grouped)
    per_group = tuple(
        tuple(_group_weights(points, w, group_of, n_groups) for points, w in by_kind)
        for by_kind in parts
    )
    return MeasurementSql(
        cube, sql, tuple(key_bins), bool(inside), kinds, nulls is not None, per_group
    )


def _group_weights(
    points: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
    group_of: npt.NDArray[np.int64],
    n_groups: int,
) -> Part:
    """A vector part's weight per group (within the hull a group's points weigh alike)."""
    group = group_of[points]
    if n_groups <= 4 * points.size + 4096:
        weight_of = np.zeros(n_groups)
        weight_of[group] = weights
        present = np.zeros(n_groups, dtype=bool)
        present[group] = True
        groups = np.flatnonzero(present)
        return groups, weight_of[groups]
    groups, first = np.unique(group, return_index=True)
    return groups, weights[first]


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
    """Check each dimension and measure against its column's type (:data:`COLUMN_TYPES_SQL`).

    Raises ConfigError when a column is missing or its type cannot hold what the dimension
    declares, e.g. ``integer: true`` on a ``double precision`` column, or a measure is not
    of an integer type.
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
    for measure in cube.measures:
        key = f"{where}.measures.{measure.name}"
        sql_type = column_types.get(measure.name)
        if sql_type is None:
            raise ConfigError(f"{key}: the table has no column {measure.name!r}")
        if sql_type not in _INTEGER_TYPES:  # sums of integers are exact, and lie on a lattice
            raise ConfigError(
                f"{key}: a measure sums an integer column, not one of type {sql_type}",
                hint="store the column in integer units (e.g. cents), or declare a view that "
                "rounds it to integers and protect the view",
            )
