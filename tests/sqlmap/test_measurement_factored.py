"""The reader's SQL from factored vectors is the SQL the cell-by-cell reference builds.

:func:`measurement_sql` works on the grid of the dimensions the vectors depend on; the reference
(:mod:`.cellwise_measurement`) lists every weighed cell of the cube. On random factored vectors
(zeros in places, measures, batches), translated statements (GROUP BYs, FILTER and CASE sums,
AVG's two halves) and the same vectors held cell by cell, both give the same statement and the
same way of reading its rows. On a cube too big to list, the reference runs on the cube of the
dimensions named, which the statement cannot tell apart from the big one.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from sqlmap.canonical import MeasurementSql, measurement_sql
from sqlmap.cube import Cube, Measure
from sqlmap.errors import DpproxyError
from sqlmap.translate import Translator
from sqlmap.vector import LinearQuery

from .cellwise_measurement import cellwise_measurement_sql
from .corpus import read_corpus
from .test_exact import DEMO_CUBE, OPEN_CUBE
from .test_factored import MEASURED, WIDE
from .test_measurement import random_cube


def assert_same(got: MeasurementSql, want: MeasurementSql) -> None:
    assert got.sql == want.sql
    assert got.keys == want.keys
    assert (got.checked, got.kinds, got.nulls) == (want.checked, want.kinds, want.nulls)
    assert len(got.weights) == len(want.weights)
    for ours, theirs in zip(got.weights, want.weights, strict=True):
        assert len(ours) == len(theirs)
        for (groups, weights), (their_groups, their_weights) in zip(ours, theirs, strict=True):
            assert groups.dtype == their_groups.dtype and weights.dtype == their_weights.dtype
            assert np.array_equal(groups, their_groups)
            assert np.array_equal(weights, their_weights)


def by_cell(q: LinearQuery) -> LinearQuery:
    return LinearQuery(q.n_cells, q.cells, q.weights, q.offset, q.measures)


def check(cube: Cube, queries: list[LinearQuery]) -> MeasurementSql:
    """The factored, cell-held and mixed batches all agree with the reference."""
    want = cellwise_measurement_sql(cube, queries)
    assert_same(measurement_sql(cube, queries), want)
    assert_same(measurement_sql(cube, [by_cell(q) for q in queries]), want)
    if len(queries) > 1:
        assert_same(measurement_sql(cube, [by_cell(queries[0]), *queries[1:]]), want)
    return want


def random_core(
    rng: np.random.Generator, cube: Cube, axes: tuple[int, ...]
) -> npt.NDArray[np.float64]:
    """Weights over (kind, axes): boxes, slabs of zeros, a few distinct values, measures."""
    kinds = 1 + len(cube.measures)
    shape = (kinds, *(cube.shape[d] for d in axes))
    values = rng.choice([1.0, 1.0, -1.0, 2.0, 0.5, 0.1, 17.25, -3.3], size=shape)
    mask = rng.random(shape) < rng.choice([0.3, 0.7, 1.0])
    for position in range(1, len(shape)):  # whole bins unweighed: the hull shrinks
        if rng.random() < 0.5:
            dropped = rng.random(shape[position]) < 0.4
            index = [slice(None)] * len(shape)
            index[position] = dropped
            mask[tuple(index)] = False
    if rng.random() < 0.6:  # the count alone, or the count and one measure
        kept = [0] if rng.random() < 0.5 or kinds == 1 else [0, int(rng.integers(1, kinds))]
        mask[[k for k in range(kinds) if k not in kept]] = False
    if rng.random() < 0.3:  # one weight everywhere weighed (a range count)
        values = np.full(shape, float(rng.choice([1.0, -2.0])))
    return np.where(mask, values, 0.0)


def random_factored(rng: np.random.Generator, cube: Cube) -> LinearQuery:
    n_axes = int(rng.integers(0, min(3, len(cube.shape)) + 1))
    axes = tuple(sorted(int(a) for a in rng.choice(len(cube.shape), n_axes, replace=False)))
    core = random_core(rng, cube, axes)
    spread = [core.shape[0]] + [cube.shape[d] if d in axes else 1 for d in range(len(cube.shape))]
    return LinearQuery.from_tensor(cube.shape, core.reshape(spread), measures=cube.measure_reach)


def random_group_by(rng: np.random.Generator, cube: Cube) -> list[LinearQuery]:
    """One vector per key of a dimension, within a shared filter (a GROUP BY's batch)."""
    where = random_factored(rng, cube)
    key = int(rng.integers(len(cube.shape)))
    batch = []
    for value in range(cube.shape[key]):
        picked = np.zeros(cube.shape[key])
        picked[value] = 1.0
        spread = [1] * (1 + len(cube.shape))
        spread[1 + key] = cube.shape[key]
        tensor = where.tensor() * picked.reshape(spread)
        batch.append(LinearQuery.from_tensor(cube.shape, tensor, measures=cube.measure_reach))
    return batch


def test_random_factored_batches_on_random_cubes() -> None:
    rng = np.random.default_rng(20261124)
    cubes = [DEMO_CUBE, OPEN_CUBE, MEASURED] + [random_cube(rng) for _ in range(40)]
    batches = 0
    for cube in cubes:
        for _ in range(8):
            if rng.random() < 0.3:
                queries = random_group_by(rng, cube)
            else:
                queries = [random_factored(rng, cube) for _ in range(int(rng.integers(1, 5)))]
            assert all(q.factored for q in queries)
            check(cube, queries)
            batches += 1
    assert batches == 8 * len(cubes)


@pytest.mark.parametrize(
    ("cube", "corpus"), [(DEMO_CUBE, "exact_demo.sql"), (OPEN_CUBE, "exact_open.sql")]
)
def test_translated_statements(cube: Cube, corpus: str) -> None:
    """Every statement of the exactness corpora: its aggregates, and AVG's two halves."""
    translator = Translator([cube])
    checked = 0
    for case in read_corpus(corpus):
        try:
            spec = translator.translate(case.sql)
        except DpproxyError:
            continue
        queries = [q.without_offset() for q in spec.queries]
        halves = [q.without_offset() for row in spec.rows for r in row.ratios for q in r]
        for batch in (queries, halves, queries[:1]):
            if batch:
                check(cube, batch)
                checked += 1
    assert checked > 40


MEASURED_STATEMENTS = [
    "SELECT SUM(income) FROM people WHERE age >= 18",
    "SELECT sex, SUM(income) - 2 * COUNT(*) FROM people WHERE rooms <> 2 GROUP BY sex",
    "SELECT SUM(debt) + 0.25 * SUM(income), COUNT(*) FROM people WHERE kids IN (1, 2)",
    "SELECT SUM(CASE WHEN sex = 'F' THEN debt ELSE 0 END) FROM people",
    "SELECT COUNT(*) FILTER (WHERE sex = 'M') * 2 - COUNT(*) FROM people WHERE kids IN (1, 2)",
    "SELECT kids, sex, COUNT(*), SUM(income) FROM people WHERE rooms IN (1, 3) GROUP BY kids, sex",
    "SELECT SUM(CASE WHEN rooms = 2 THEN 2 ELSE 1 END) FROM people WHERE age < 18",
    "SELECT COUNT(*) FROM people WHERE sex = 'M' AND sex = 'F'",
]


@pytest.mark.parametrize("sql", MEASURED_STATEMENTS)
def test_translated_statements_with_measures(sql: str) -> None:
    spec = Translator([MEASURED]).translate(sql)
    check(MEASURED, [q.without_offset() for q in spec.queries])


def test_no_weight_reads_nothing() -> None:
    zero = LinearQuery.from_tensor(MEASURED.shape, np.zeros(1), measures=MEASURED.measure_reach)
    got = check(MEASURED, [zero, zero])
    assert got.sql is None and all(g.size == 0 for part in got.weights for g, _ in part)


# a cube too big to list: 3 ** 20 cells, with a measure
WIDE_MEASURED = Cube(WIDE.schema, WIDE.table, WIDE.dimensions, measures=(Measure("v", -5, 9),))


def named_only(cube: Cube, queries: list[LinearQuery]) -> tuple[Cube, list[LinearQuery]]:
    """The cube of the dimensions the queries name, and the queries over it."""
    union = sorted({d for q in queries for d in q.axes})
    union = union or [0]  # a cube has a dimension; one no query names changes no statement
    dimensions = tuple(cube.dimensions[d] for d in union)
    small = Cube(cube.schema, cube.table, dimensions, measures=cube.measures)
    kinds = 1 + len(cube.measures)
    out = []
    for q in queries:
        assert q.core is not None
        spread = [kinds] + [cube.shape[d] if d in q.axes else 1 for d in union]
        out.append(
            LinearQuery.from_tensor(small.shape, q.core.reshape(spread), measures=q.measures)
        )
    return small, out


@pytest.mark.parametrize("cube", [WIDE, WIDE_MEASURED])
def test_a_cube_too_big_to_list(cube: Cube) -> None:
    assert cube.n_cells == 3**20
    rng = np.random.default_rng(3)
    batches = [
        Translator([cube])
        .translate(
            "SELECT d1, COUNT(*) FROM wide WHERE d3 IN ('a', 'b') AND d17 <> 'c' GROUP BY d1"
        )
        .queries,
        Translator([cube])
        .translate("SELECT COUNT(*) FILTER (WHERE d0 = 'a' OR d5 = 'b') FROM wide WHERE d9 = 'c'")
        .queries,
    ]
    for _ in range(30):
        if rng.random() < 0.3:
            batches.append(random_group_by(rng, cube))
        else:
            batches.append([random_factored(rng, cube) for _ in range(int(rng.integers(1, 4)))])
    for queries in batches:
        got = measurement_sql(cube, list(queries))
        small, over_small = named_only(cube, list(queries))
        want = cellwise_measurement_sql(small, over_small)
        assert_same(got, want)
        for q in queries:
            assert q._cells is None  # no cell of the big cube was listed
