"""Statements translate to factored vectors: a tensor over the dimensions they name.

A wide cube's range count covers millions of cells; translation must not build them, and the
cells it builds on demand (for the reader's SQL) must be the statement's exact weights.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from sqlmap.cube import CategoricalDimension, Cube, Measure, NumericDimension
from sqlmap.translate import Translator
from sqlmap.vector import LinearQuery

SMALL = Cube(
    "public",
    "people",
    (
        NumericDimension("age", (0, 18, 65, 120), integer=True),
        CategoricalDimension("sex", ("M", "F")),
        CategoricalDimension("kids", (0, 1, 2, 3)),
        CategoricalDimension("rooms", (1, 2, 3), closed=True, nullable=False),
    ),
)
# income counts as a dimension's column nowhere: a measure only; debt may be negative
MEASURED = Cube(
    "public",
    "people",
    SMALL.dimensions,
    measures=(Measure("income", 0, 1000), Measure("debt", -50, 50, nullable=False)),
)
# 20 dimensions of 3 values: 3.5 billion cells, which no dense vector could hold
WIDE = Cube(
    "public",
    "wide",
    tuple(
        CategoricalDimension(f"d{i}", ("a", "b", "c"), closed=True, nullable=False)
        for i in range(20)
    ),
)


def _by_cell(cube: Cube, sql: str) -> list[np.ndarray]:
    """The statement's weight per cell, from the cube's bins one cell at a time (slowly)."""
    spec = Translator([cube]).translate(sql)
    return [q.to_dense() for q in spec.queries]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM people",
        "SELECT COUNT(*) FROM people WHERE age BETWEEN 18 AND 64 AND sex = 'F'",
        "SELECT sex, COUNT(*) FROM people WHERE rooms IN (1, 3) GROUP BY sex",
        "SELECT COUNT(*) FILTER (WHERE sex = 'M') * 2 - COUNT(*) FROM people WHERE kids IN (1, 2)",
        "SELECT SUM(CASE WHEN rooms = 2 THEN 2 ELSE 1 END) FROM people WHERE age < 18",
        "SELECT SUM(rooms) FROM people WHERE age >= 18 OR sex = 'M'",
    ],
)
def test_factored_vectors_are_the_statements_weights(sql: str) -> None:
    for q in Translator([SMALL]).translate(sql).queries:
        assert q.factored and q.shape == SMALL.shape
        dense = q.to_dense()
        plain = LinearQuery.from_dense(dense, q.offset)
        assert q == plain and plain == q
        assert np.array_equal(q.cells, plain.cells) and np.array_equal(q.weights, plain.weights)
        assert q.sensitivity == plain.sensitivity
        # the dimensions it names vary along its axes; the others are constant
        cube = dense.reshape(SMALL.shape)
        for d in range(len(SMALL.shape)):
            constant = np.all(cube == cube.take([0], axis=d))
            assert constant == (d not in q.axes)
        x = np.arange(SMALL.n_cells, dtype=np.float64) % 7
        assert q.evaluate(x) == pytest.approx(plain.evaluate(x), rel=1e-12)


def test_a_wide_cube_is_translated_without_its_cells() -> None:
    spec = Translator([WIDE]).translate(
        "SELECT d1, COUNT(*) FROM wide WHERE d3 IN ('a', 'b') AND d7 <> 'c' GROUP BY d1"
    )
    assert WIDE.n_cells == 3**20
    for q in spec.queries:
        assert q.factored and q.axes == (1, 3, 7)
        assert q.core is not None and q.core.size == 3**3
        assert q.sensitivity == 1.0
    # each group weighs one value of d1, two of d3 and two of d7
    counts = [int(q.nonzero_weights().size) for q in spec.queries]
    assert counts == [2 * 2] * 3


def test_equal_vectors_have_one_factored_form() -> None:
    a = LinearQuery.from_tensor((2, 3, 2), np.ones((2, 3, 1)) * np.array([[[1.0]], [[0.0]]]))
    b = LinearQuery.from_tensor((2, 3, 2), np.array([1.0, 0.0])[:, None, None])
    assert a.axes == b.axes == (0,) and a.key == b.key and a == b
    for shape in itertools.product((2, 3), repeat=2):
        zero = LinearQuery.from_tensor(shape, np.zeros(shape))
        assert zero.is_zero and zero.cells.size == 0 and zero.axes == ()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT SUM(income) FROM people WHERE age >= 18",
        "SELECT sex, SUM(income) - 2 * COUNT(*) FROM people WHERE rooms <> 2 GROUP BY sex",
        "SELECT SUM(debt) + 0.25 * SUM(income), COUNT(*) FROM people WHERE kids IN (1, 2)",
        "SELECT SUM(CASE WHEN sex = 'F' THEN debt ELSE 0 END) FROM people",
        "SELECT rooms, AVG(income) FROM people WHERE age < 65 GROUP BY rooms",
        "SELECT SUM(income) / COUNT(*) FROM people WHERE sex = 'M'",
    ],
)
def test_measured_vectors_are_tensors_over_a_kind_axis(sql: str) -> None:
    """A measure is one more axis: the factored vector's cells, sensitivities by the box of
    bounds and row range are those of the same weights held coordinate by coordinate."""
    spec = Translator([MEASURED]).translate(sql)
    vectors = [*spec.queries, *(q for row in spec.rows for ratio in row.ratios for q in ratio)]
    assert vectors
    reach = MEASURED.measure_reach
    x = np.arange(3 * MEASURED.n_cells, dtype=np.float64) % 11
    for q in vectors:
        assert q.factored and q.shape == MEASURED.shape and q.measures == reach
        assert q.core is not None and q.core.shape[0] == 1 + len(reach)
        plain = LinearQuery.from_dense(q.to_dense(), q.offset, reach)
        assert q == plain and plain == q and q.n_cells == plain.n_cells
        assert np.array_equal(q.cells, plain.cells) and np.array_equal(q.weights, plain.weights)
        for a, b in zip(q.cell_sensitivities(), plain.cell_sensitivities(), strict=True):
            assert np.array_equal(a, b)
        assert q.sensitivity == plain.sensitivity
        assert q.row_range() == plain.row_range()
        assert q.evaluate(x) == pytest.approx(plain.evaluate(x), rel=1e-12)


def _corner_values(kinds: list[float], measures: tuple[tuple[int, int], ...]) -> list[Fraction]:
    """Every corner of the box of measures' reaches, exactly (weights read as they print)."""
    count, weights = Fraction(repr(kinds[0])), [Fraction(repr(w)) for w in kinds[1:]]
    return [
        count + sum((w * v for w, v in zip(weights, corner)), Fraction(0))
        for corner in itertools.product(*measures)
    ]


@pytest.mark.parametrize("cells", [12, 700])  # a factored vector's few cells; a long table
def test_box_sensitivities_are_the_corners_rounded_up(cells: int) -> None:
    """Each cell's sensitivity is the least float8 (as printed) not below its exact largest
    corner; the row range the extremes over every corner, widened to float8 the same way."""
    rng = np.random.default_rng(cells)
    measures = ((0, 1000), (-50, 50), (3, 7))
    for _ in range(20):
        pool = np.array([0.0, 0.0, 1.0, -1.0, 0.1, 1 / 3, -2.5, 17.25, 1e-3])
        table = rng.choice(pool, size=(cells, 1 + len(measures)))
        table[rng.integers(cells)] = (0.1, 0.2, 0.0, -0.3)
        dense = np.concatenate([table[:, k] for k in range(table.shape[1])])
        q = LinearQuery.from_dense(dense, measures=measures)
        owners, magnitudes = q.cell_sensitivities()
        low, high = q.row_range()
        corners = {c: _corner_values(table[c].tolist(), measures) for c in range(cells)}
        weighed = [c for c in range(cells) if np.any(table[c])]
        assert owners.tolist() == weighed
        for c, got in zip(weighed, magnitudes.tolist(), strict=True):
            exact = max(abs(v) for v in corners[c])
            assert Fraction(repr(got)) >= exact
            assert Fraction(repr(math.nextafter(got, -math.inf))) < exact
        least = min(v for c in weighed for v in corners[c])
        largest = max(v for c in weighed for v in corners[c])
        assert Fraction(low) <= least and Fraction(math.nextafter(low, math.inf)) > least
        assert Fraction(high) >= largest and Fraction(math.nextafter(high, -math.inf)) < largest


@pytest.mark.parametrize("seed", range(4))
def test_a_stored_core_is_the_query_from_tensor_built(seed: int) -> None:
    """``from_core`` of a core (as the ledger stores it) is the query ``from_tensor`` gives of
    it spread over the cube: same axes, core, key, sensitivities and range; a core constant
    along an axis it names (not as ``from_tensor`` holds it) comes out as that one too."""
    rng = np.random.default_rng(seed)
    shape = (3, 2, 4, 5)
    reach = ((0, 99), (-20, 7)) if seed % 2 else ()
    kinds = 1 + len(reach)
    for _ in range(40):
        axes = tuple(sorted(rng.choice(len(shape), int(rng.integers(0, 4)), replace=False)))
        core = rng.choice([0.0, 1.0, -0.5, 2.0], (kinds, *(shape[d] for d in axes)))
        if axes and rng.random() < 0.3:  # constant along one of its axes
            position = 1 + int(rng.integers(len(axes)))
            core = np.repeat(core.take([0], axis=position), core.shape[position], position)
        spread = [shape[d] if d in axes else 1 for d in range(len(shape))]
        expected = LinearQuery.from_tensor(shape, core.reshape(kinds, *spread), measures=reach)
        found = LinearQuery.from_core(shape, axes, core, measures=reach)
        assert found == expected and found.key == expected.key
        assert found.axes == expected.axes and found.n_cells == expected.n_cells
        assert found.sensitivity == expected.sensitivity
        assert found.row_range() == expected.row_range()
        assert np.array_equal(found.sensitivity_tensor(), expected.sensitivity_tensor())
        assert found.core is not None and not found.core.flags.writeable
        if not expected.is_zero:
            assert np.array_equal(found.cells, expected.cells)


@pytest.mark.parametrize(
    ("axes", "core"),
    [
        ((0,), np.ones((1, 2))),  # dimension 0 has 3 values
        ((1, 0), np.ones((1, 2, 3))),  # axes not increasing
        ((4,), np.ones((1, 2))),  # no such dimension
        ((0,), np.array([[1.0, np.inf, 2.0]])),
    ],
)
def test_a_stored_core_that_does_not_fit_is_refused(
    axes: tuple[int, ...], core: np.ndarray
) -> None:
    with pytest.raises(ValueError):
        LinearQuery.from_core((3, 2, 4, 5), axes, core)
