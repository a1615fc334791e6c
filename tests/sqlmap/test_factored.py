"""Statements translate to factored vectors: a tensor over the dimensions they name.

A wide cube's range count covers millions of cells; translation must not build them, and the
cells it builds on demand (for the reader's SQL) must be the statement's exact weights.
"""

from __future__ import annotations

import itertools

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
