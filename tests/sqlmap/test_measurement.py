"""The plan-driven measurement SQL gives exactly ``q . x`` on the full histogram, on a real
PostgreSQL: random cubes over the Adult table, random vectors (boxes, sums of boxes, GROUP BY
batches, arbitrary weights), numeric edge values, NULL and implicit bins, broken promises."""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import psycopg
import pytest

from proxy.errors import DomainViolation
from sqlmap.canonical import measurement_sql
from sqlmap.cube import CategoricalDimension, Cube, Dimension, Measure, NumericDimension
from sqlmap.translate import Translator
from sqlmap.vector import LinearQuery

from .exactness import true_histogram
from .test_exact import DEMO_CUBE, OPEN_CUBE

INF = math.inf
WORKCLASS = ("Private", "Self-emp-not-inc", "Local-gov", "State-gov", "Federal-gov")
RACES = ("White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other")


@pytest.fixture(scope="module")
def conn(adult_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(adult_dsn, autocommit=True) as c:
        yield c


def measured(conn: psycopg.Connection, cube: Cube, queries: list[LinearQuery]) -> list[float]:
    m = measurement_sql(cube, queries)
    return m.answers(conn.execute(m.sql).fetchall() if m.sql else [])


def exact(q: LinearQuery, x: npt.NDArray[np.int64]) -> float:
    """``q . x`` rounded once (what ``evaluate`` gives whenever its float sums are exact)."""
    return float(sum(Fraction(float(w)) * int(x[c]) for c, w in zip(q.cells, q.weights)))


def assert_same(
    conn: psycopg.Connection, cube: Cube, queries: list[LinearQuery], x: npt.NDArray[np.int64]
) -> None:
    got = measured(conn, cube, queries)
    for q, answer in zip(queries, got, strict=True):
        if np.all(q.weights == np.trunc(q.weights)):
            assert answer == q.evaluate(x)  # bit for bit
        else:
            assert answer == exact(q, x)
            assert answer == pytest.approx(q.evaluate(x), rel=1e-12, abs=1e-9)


# -- random cubes and vectors ----------------------------------------------------------------


def random_dimension(rng: np.random.Generator, column: str) -> Dimension:
    """A dimension over an Adult column, closed or not-null only where the data keeps it."""
    if column == "age":  # 17..90, never NULL
        pool = [-INF, 10, 17, 20, 25, 30, 37.5, 45, 60, 91, 100, INF]
        edges = sorted(rng.choice(pool, size=int(rng.integers(2, 6)), replace=False))
        covers = edges[0] <= 17 and edges[-1] > 90
        return NumericDimension(
            "age", tuple(edges), closed=covers and bool(rng.integers(2)), nullable=False
        )
    if column == "hours_per_week":  # 1..99, integer
        pool = [-INF, 1, 20, 35, 40, 41, 60, 100, INF]
        edges = sorted(rng.choice(pool, size=int(rng.integers(2, 5)), replace=False))
        return NumericDimension("hours_per_week", tuple(edges), integer=True)
    if column == "education_num":  # 1..16, never NULL
        values = tuple(int(v) for v in rng.choice(np.arange(1, 17), 16, replace=False))
        if rng.integers(2):
            return CategoricalDimension("education_num", values, closed=True, nullable=False)
        return CategoricalDimension("education_num", values[: int(rng.integers(1, 6))])
    if column == "workclass":  # has NULLs and undeclared values
        k = int(rng.integers(1, len(WORKCLASS) + 1))
        return CategoricalDimension("workclass", tuple(rng.choice(WORKCLASS, k, replace=False)))
    if column == "race":
        if rng.integers(2):
            return CategoricalDimension("race", RACES, closed=True, nullable=False)
        return CategoricalDimension("race", tuple(rng.choice(RACES, 2, replace=False)))
    return CategoricalDimension(
        "sex", ("Male", "Female"), closed=True, nullable=bool(rng.integers(2))
    )


COLUMNS = ["age", "hours_per_week", "education_num", "workclass", "race", "sex"]


#: Integer columns of Adult as measures, with bounds that clamp some rows and not others
MEASURES = [
    Measure("capital_gain", 0, 20000),
    Measure("capital_loss", 100, 2000),  # a NULL would add 0, below the lower bound
    Measure("hours_per_week", 1, 99, nullable=False),
    Measure("age", 20, 60),
    Measure("fnlwgt", -5, 10**6),
    Measure("education_num", -3, 8, nullable=False),
]


def random_cube(rng: np.random.Generator) -> Cube:
    columns = rng.choice(COLUMNS, size=int(rng.integers(1, 5)), replace=False)
    picked = rng.choice(len(MEASURES), size=int(rng.integers(0, 3)), replace=False)
    return Cube(
        "public",
        "adult",
        tuple(random_dimension(rng, str(c)) for c in columns),
        measures=tuple(MEASURES[i] for i in picked),
    )


def box(rng: np.random.Generator, shape: tuple[int, ...]) -> npt.NDArray[np.bool_]:
    """A product of random bin sets, often the whole of a dimension (as SQL filters are)."""
    mask = np.ones(shape, dtype=bool)
    for axis, size in enumerate(shape):
        if rng.random() < 0.5:
            continue
        chosen = rng.random(size) < 0.5
        chosen[rng.integers(size)] = True
        index = [np.newaxis] * len(shape)
        index[axis] = slice(None)
        mask = mask & chosen[tuple(index)]
    return mask


def weight(rng: np.random.Generator) -> float:
    return float(rng.choice([1.0, 1.0, 1.0, -1.0, 2.0, 0.1, 17.25, -3.3, 1e-3]))


def random_batch(rng: np.random.Generator, cube: Cube) -> list[LinearQuery]:
    shape = cube.shape
    kind = rng.integers(6)
    if kind == 0:  # a (weighted) range count
        dense = [box(rng, shape) * weight(rng)]
    elif kind == 1:  # a sum of overlapping boxes (SUM(CASE ...), OR of ranges)
        dense = [sum((box(rng, shape) * weight(rng) for _ in range(3)), np.zeros(shape))]
    elif kind == 2:  # GROUP BY one or two dimensions within a box
        where = box(rng, shape)
        axes = rng.choice(len(shape), size=min(len(shape), int(rng.integers(1, 3))), replace=False)
        dense = []
        for key in np.ndindex(*(shape[a] for a in axes)):
            mask = where.copy()
            for a, k in zip(axes, key):
                index = [slice(None)] * len(shape)
                index[a] = np.arange(shape[a]) != k
                mask[tuple(index)] = False
            dense.append(mask * 1.0)
    elif kind == 3:  # weights that depend on one dimension (SUM of a numeric column)
        axis = int(rng.integers(len(shape)))
        index = [np.newaxis] * len(shape)
        index[axis] = slice(None)
        values = rng.integers(-3, 20, shape[axis]).astype(float)
        dense = [box(rng, shape) * values[tuple(index)]]
    elif kind == 4:  # arbitrary sparse weights
        dense = [np.where(rng.random(shape) < 0.2, rng.integers(1, 5, shape), 0) * 1.0]
    else:  # a few coordinates (the old engine benchmark's vectors)
        cells = np.unique(rng.integers(0, cube.n_coordinates, int(rng.integers(1, 10))))
        weights = np.array([weight(rng) for _ in cells])
        return [LinearQuery(cube.n_coordinates, cells, weights, measures=cube.measure_reach)]
    return [
        LinearQuery.from_dense(kinds(rng, cube, d).ravel(), measures=cube.measure_reach)
        for d in dense
    ]


def kinds(
    rng: np.random.Generator, cube: Cube, dense: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Weights over a cell's count, and over a measure's sums (SUM(measure)), or both."""
    stacked = np.zeros((1 + len(cube.measures), *cube.shape))
    if not cube.measures or rng.random() < 0.3:
        stacked[0] = dense
        return stacked
    stacked[1 + int(rng.integers(len(cube.measures)))] = dense
    if rng.random() < 0.5:  # COUNT(*) beside it, or a second measure
        stacked[int(rng.integers(1 + len(cube.measures)))] += box(rng, cube.shape) * weight(rng)
    return stacked


def test_random_vectors_on_random_cubes(conn: psycopg.Connection) -> None:
    rng = np.random.default_rng(20261123)
    for _ in range(60):
        cube = random_cube(rng)
        x = true_histogram(conn, cube)
        for _ in range(4):
            assert_same(conn, cube, random_batch(rng, cube), x)


def test_random_vectors_on_the_demo_and_open_cubes(conn: psycopg.Connection) -> None:
    rng = np.random.default_rng(7)
    for cube in (DEMO_CUBE, OPEN_CUBE):
        x = true_histogram(conn, cube)
        for _ in range(40):
            assert_same(conn, cube, random_batch(rng, cube), x)


def test_translated_queries_read_only_what_they_weigh(conn: psycopg.Connection) -> None:
    translator = Translator([DEMO_CUBE])
    x = true_histogram(conn, DEMO_CUBE)
    count = translator.translate("SELECT COUNT(*) FROM adult WHERE age >= 35 AND sex = 'Female'")
    m = measurement_sql(DEMO_CUBE, list(count.queries))
    assert m.sql is not None and "GROUP BY" not in m.sql  # one filtered count
    assert "n_inside" in m.sql  # ... and the rows that break age's or sex's promise
    assert "education" not in m.sql and "race" not in m.sql
    assert_same(conn, DEMO_CUBE, list(count.queries), x)

    grouped = translator.translate("SELECT race, sex, income, COUNT(*) FROM adult GROUP BY 1, 2, 3")
    m = measurement_sql(DEMO_CUBE, list(grouped.queries))
    assert m.sql is not None and "WHERE" not in m.sql and '"age"' not in m.sql
    assert_same(conn, DEMO_CUBE, list(grouped.queries), x)

    total = translator.translate("SELECT COUNT(*) FROM adult")
    assert measurement_sql(DEMO_CUBE, list(total.queries)).sql == (
        'SELECT count(*) AS n FROM "public"."adult"'
    )
    assert_same(conn, DEMO_CUBE, list(total.queries), x)


def test_no_weighed_cell_reads_nothing(conn: psycopg.Connection) -> None:
    n, reach = DEMO_CUBE.n_coordinates, DEMO_CUBE.measure_reach
    empty = LinearQuery(n, np.array([], np.int64), np.array([]), measures=reach)
    m = measurement_sql(DEMO_CUBE, [empty, empty])
    assert m.sql is None and m.answers([]) == [0.0, 0.0]
    x = true_histogram(conn, DEMO_CUBE)
    one = LinearQuery(n, np.array([5]), np.array([2.0]), measures=reach)
    assert_same(conn, DEMO_CUBE, [empty, one], x)


def test_offsets_and_foreign_vectors_are_refused() -> None:
    ones = np.ones(DEMO_CUBE.n_coordinates)
    reach = DEMO_CUBE.measure_reach
    with pytest.raises(ValueError, match="offset-free"):
        measurement_sql(DEMO_CUBE, [LinearQuery.from_dense(ones, 1.0, reach)])
    with pytest.raises(ValueError, match="offset-free"):
        measurement_sql(DEMO_CUBE, [LinearQuery.from_dense(np.ones(3))])
    with pytest.raises(ValueError, match="offset-free"):  # the counts' coordinates, no measures
        measurement_sql(DEMO_CUBE, [LinearQuery.from_dense(ones)])


# -- edge values and broken promises, on tables of their own ----------------------------------


@pytest.fixture()
def scratch(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn) as c:  # each test runs in a transaction that is rolled back
        yield c
        c.rollback()


def every_box(cube: Cube) -> Iterator[list[LinearQuery]]:
    """Every single-bin and every contiguous run of bins of each dimension, and GROUP BY each."""
    for axis, dim in enumerate(cube.dimensions):
        index = [np.newaxis] * len(cube.shape)
        index[axis] = slice(None)
        for lo in range(dim.size):
            for hi in range(lo + 1, dim.size + 1):
                chosen = np.zeros(dim.size)
                chosen[lo:hi] = 1.0
                yield [LinearQuery.from_dense(np.broadcast_to(chosen[tuple(index)], cube.shape))]
        yield [
            LinearQuery.from_dense(
                np.broadcast_to((np.arange(dim.size) == k)[tuple(index)], cube.shape)
            )
            for k in range(dim.size)
        ]


def test_numeric_edge_values(scratch: psycopg.Connection) -> None:
    scratch.execute("CREATE TEMP TABLE m (v float8, w int, s text)")
    scratch.execute(
        "INSERT INTO m VALUES (-1, 1, 'a'), (0, 2, 'b'), (0.5, NULL, 'a'), (1, 40, NULL), "
        "(2, 41, 'c'), (7, 39, 'a'), (NULL, -5, 'b'), ('NaN', 100, 'a'), ('Infinity', 3, 'a'), "
        "('-Infinity', 40, 'b')"
    )
    cubes = [
        Cube("pg_temp", "m", (NumericDimension("v", (0, 1, 2)), CategoricalDimension("s", ("a",)))),
        Cube(
            "pg_temp",
            "m",
            (
                NumericDimension("v", (-INF, 0.5, 1, INF)),
                NumericDimension("w", (-INF, 40, 41, INF), integer=True),
            ),
        ),
        Cube(
            "pg_temp",
            "m",
            (NumericDimension("w", (1, 40, 41)), CategoricalDimension("s", ("b", "a"))),
        ),
    ]
    for cube in cubes:
        x = true_histogram(scratch, cube)
        for queries in every_box(cube):
            assert_same(scratch, cube, queries, x)


@pytest.mark.parametrize(
    ("value", "dimension"),
    [
        ("'z'", CategoricalDimension("a", ("x", "y"), closed=True)),
        ("NULL", CategoricalDimension("a", ("x", "y"), nullable=False)),
        ("NULL", CategoricalDimension("a", ("x", "y", "z"), closed=True, nullable=False)),
    ],
)
def test_broken_promise_in_a_dimension_read(
    scratch: psycopg.Connection, value: str, dimension: CategoricalDimension
) -> None:
    """Refused whether the query groups by the dimension or only filters on it."""
    scratch.execute("CREATE TEMP TABLE c (a text, b int)")
    scratch.execute(f"INSERT INTO c VALUES ('x', 1), ('y', 2), ({value}, 1)")
    cube = Cube("pg_temp", "c", (dimension, CategoricalDimension("b", (1, 2))))
    shape = cube.shape
    only_x = np.zeros(shape)
    only_x[0, :] = 1  # a = 'x': the broken row lies outside, but may not be dropped silently
    per_b = [np.zeros(shape) for _ in range(shape[1])]
    for k, d in enumerate(per_b):
        d[:, k] = 1
    grouped_by_a = [np.zeros(shape) for _ in range(shape[0])]
    for k, d in enumerate(grouped_by_a):
        d[k, :] = 1
    for dense in ([only_x], grouped_by_a):
        with pytest.raises(DomainViolation, match="lie outside the domain"):
            measured(scratch, cube, [LinearQuery.from_dense(d.ravel()) for d in dense])
    # a query that does not depend on the dimension counts the row wherever its bin would be
    by_b = measured(scratch, cube, [LinearQuery.from_dense(d.ravel()) for d in per_b])
    assert by_b == [2, 1, 0, 0]  # b = 1, 2, other, NULL


def test_padded_text_groups_as_its_equality_does(scratch: psycopg.Connection) -> None:
    scratch.execute("CREATE TEMP TABLE p (a character(5), b int)")
    scratch.execute("INSERT INTO p VALUES ('x', 1), ('y  ', 2), ('x ', 2), (NULL, 1)")
    cube = Cube("pg_temp", "p", (CategoricalDimension("a", ("x", "y"), closed=True),))
    grouped = [LinearQuery.from_dense(np.arange(3) == k) for k in range(3)]
    assert measured(scratch, cube, grouped) == [2, 1, 1]  # x, y, NULL


def test_broken_numeric_promise(scratch: psycopg.Connection) -> None:
    scratch.execute("CREATE TEMP TABLE n (v int)")
    scratch.execute("INSERT INTO n VALUES (1), (5), (20)")
    cube = Cube("pg_temp", "n", (NumericDimension("v", (0, 4, 10), closed=True, nullable=False),))
    for chosen in ([1.0, 0.0], [0.0, 1.0]):  # 20 is in neither bin
        with pytest.raises(DomainViolation):
            measured(scratch, cube, [LinearQuery.from_dense(chosen)])
