"""Checks a translation against PostgreSQL running the same SQL on the same rows."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import psycopg
from sqlglot import exp

from sqlmap.accuracy import CLAUSE_KEY
from sqlmap.canonical import histogram_from_rows, histogram_sql
from sqlmap.cube import BinKind, CategoricalDimension, Cube
from sqlmap.translate import AnswerSpec, GroupValue, OutputKind, Translator


def true_histogram(conn: psycopg.Connection, cube: Cube) -> npt.NDArray[np.int64]:
    """x, computed by the canonical SQL."""
    return histogram_from_rows(cube, conn.execute(histogram_sql(cube)).fetchall())


def reference_sql(
    sql: str, group_dims: tuple[str, ...], sum_of_nothing_is_zero: bool = True
) -> str:
    """The SQL to run on PostgreSQL: the user's, minus the accuracy clause, with the grouped
    columns put first (so every row is labelled) and SUM over nothing read as 0 (dpproxy's
    documented semantics; PostgreSQL says NULL)."""
    statement = Translator.parse(sql)
    statement.set(CLAUSE_KEY, None)
    keys = [exp.column(d, quoted=True) for d in group_dims]
    statement.set("expressions", keys + list(statement.expressions))
    if not sum_of_nothing_is_zero:
        return statement.sql("postgres")

    def coalesce(node: exp.Expr) -> exp.Expr:
        wrap = isinstance(node, exp.Filter) and isinstance(node.this, exp.Sum)
        wrap = wrap or (isinstance(node, exp.Sum) and not isinstance(node.parent, exp.Filter))
        return exp.func("COALESCE", node, exp.Literal.number(0)) if wrap else node

    return statement.transform(coalesce).sql("postgres")


def group_of(dim: CategoricalDimension, value: object) -> GroupValue:
    """The GROUP BY key dpproxy reports for a value PostgreSQL grouped on."""
    if value is None:
        return GroupValue(BinKind.NULL, None)
    for declared in dim.values:
        if declared == value or (dim.numeric and Fraction(str(value)) == Fraction(declared)):
            return GroupValue(BinKind.VALUE, declared)
    return GroupValue(BinKind.OTHER, None)


def assert_exact(
    conn: psycopg.Connection, spec: AnswerSpec, sql: str, x: npt.NDArray[np.int64]
) -> int:
    """Assert that q.x + c equals PostgreSQL's answer for every row and column; return #rows."""
    n_keys = len(spec.group_dims)
    agg_positions = [
        n_keys + i for i, c in enumerate(spec.columns) if c.kind is OutputKind.AGGREGATE
    ]
    dims = [spec.cube.dimension(d) for d in spec.group_dims]
    offsets = [q.offset for q in spec.rows[0].queries]
    # PostgreSQL's rows, mapped to dpproxy's groups; linear parts (answer - offset) add up
    expected: dict[tuple[GroupValue, ...], list[Fraction]] = defaultdict(
        lambda: [Fraction(0)] * len(agg_positions)
    )
    described = conn.execute(
        reference_sql(sql, spec.group_dims, sum_of_nothing_is_zero=False) + " LIMIT 0"
    )
    names = [d.name for d in described.description or []][n_keys:]
    assert names == [c.name for c in spec.columns], (
        f"column names {[c.name for c in spec.columns]}, PostgreSQL: {names}"
    )
    for pg_row in conn.execute(reference_sql(sql, spec.group_dims)).fetchall():
        key = tuple(group_of(d, v) for d, v in zip(dims, pg_row))  # type: ignore[arg-type]
        for j, i in enumerate(agg_positions):
            value = pg_row[i]
            assert value is not None, f"PostgreSQL returned NULL for {spec.columns[i].name}"
            expected[key][j] += Fraction(str(value)) - Fraction(offsets[j])
    seen = set()
    for row in spec.rows:
        seen.add(row.keys)
        want = expected.get(row.keys, [Fraction(0)] * len(agg_positions))
        for j, q in enumerate(row.queries):
            got = q.evaluate(x) - q.offset
            assert got == float(want[j]) or abs(got - float(want[j])) <= 1e-9 * max(
                1.0, abs(float(want[j]))
            ), (
                f"{spec.columns[agg_positions[j] - n_keys].name} for group {row.keys}: "
                f"vector gives {got}, "
                f"PostgreSQL {float(want[j])}\n{sql}"
            )
    assert set(expected) <= seen, (
        f"PostgreSQL groups {set(expected) - seen} missing from the answer"
    )
    return len(spec.rows)
