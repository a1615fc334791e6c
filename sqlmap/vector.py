"""Sparse linear query vectors over the cells of a data cube.

A query answer is ``q . x + offset`` where ``x`` is the histogram of cell counts. This is the
papers' query vector (a row H_i of the history matrix) plus the constant part of the SQL
expression, which needs no privacy budget.

Over a cube with measures, ``x`` has more coordinates than cells: the ``n`` cell counts, then
for each measure the ``n`` cells' clamped sums of it (coordinate ``k`` belongs to cell ``k % n``).
A row of cell ``c`` then moves ``c``'s count by 1 and each of ``c``'s sums by at most that
measure's reach, so the answer moves by at most ``max |q_count + sum_m q_m v_m|`` over the box
of those reaches: the cell's sensitivity, which the privacy accounting charges per cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = ["LinearQuery"]


@dataclass(frozen=True, slots=True, eq=False)
class LinearQuery:
    """``answer = sum_j weights[k] * x[cells[k]] + offset`` over a cube of ``n_cells`` cells.

    ``cells`` is strictly increasing and ``weights`` holds no zeros, so two equal queries have
    equal arrays. Both arrays are read-only. ``measures`` is, per measure of the cube, the least
    and greatest amount one row adds to its cell's sum (:attr:`sqlmap.cube.Measure.reach`);
    ``n_cells`` counts coordinates, ``(1 + len(measures))`` per cell of the cube.

    >>> q = LinearQuery.from_dense(np.array([0.0, 2.0, 0.0, -3.0]), offset=5.0)
    >>> q
    LinearQuery(n_cells=4, nnz=2, sensitivity=3.0, offset=5.0)
    >>> q.evaluate(np.array([10, 20, 30, 40]))
    -75.0
    """

    n_cells: int
    cells: npt.NDArray[np.int64]
    weights: npt.NDArray[np.float64]
    offset: float = 0.0
    measures: tuple[tuple[int, int], ...] = ()
    _cell_sensitivities: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None = field(
        init=False, repr=False, compare=False, default=None
    )
    _row_range: tuple[float, float] | None = field(
        init=False, repr=False, compare=False, default=None
    )

    def __post_init__(self) -> None:
        cells = np.asarray(self.cells, dtype=np.int64)
        weights = np.asarray(self.weights, dtype=np.float64)
        if cells.ndim != 1 or cells.shape != weights.shape:
            raise ValueError("cells and weights must be 1-D arrays of equal length")
        if cells.size and (cells[0] < 0 or cells[-1] >= self.n_cells):
            raise ValueError(f"cell index out of range [0, {self.n_cells})")
        if cells.size > 1 and not np.all(np.diff(cells) > 0):
            raise ValueError("cells must be strictly increasing")
        if not np.all(np.isfinite(weights)) or np.any(weights == 0):
            raise ValueError("weights must be finite and non-zero")
        if not np.isfinite(self.offset):
            raise ValueError("offset must be finite")
        cells.flags.writeable = False
        weights.flags.writeable = False
        object.__setattr__(self, "cells", cells)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "offset", float(self.offset))
        if self.measures:
            reach = tuple((int(lo), int(hi)) for lo, hi in self.measures)
            object.__setattr__(self, "measures", reach)
            if self.n_cells % (1 + len(self.measures)):
                raise ValueError("n_cells must be a whole number of cells per coordinate kind")
            if not all(lo < hi for lo, hi in self.measures):
                raise ValueError("a measure's reach must be a range lo < hi")
            cells, magnitudes, row_range = _box_sensitivities(self)
            object.__setattr__(self, "_cell_sensitivities", (cells, magnitudes))
            object.__setattr__(self, "_row_range", row_range)

    @classmethod
    def from_dense(
        cls, dense: npt.ArrayLike, offset: float = 0.0, measures: tuple[tuple[int, int], ...] = ()
    ) -> LinearQuery:
        """Build from a dense weight per coordinate (zeros dropped)."""
        dense_arr = np.asarray(dense, dtype=np.float64).ravel()
        (cells,) = np.nonzero(dense_arr)
        return cls(dense_arr.size, cells, dense_arr[cells], offset, measures)

    @property
    def cube_cells(self) -> int:
        """The number of cells of the cube (coordinates per kind: counts, each measure's sums)."""
        return self.n_cells // (1 + len(self.measures))

    def cell_sensitivities(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Every cell a row of which moves the answer, and by how much at most (never less).

        Without measures, the cells weighed and ``|q_j|``; with them, the box maximum of
        ``|q_count + sum_m q_m v_m|`` over each measure's reach, rounded up to float8.
        """
        if self._cell_sensitivities is not None:
            return self._cell_sensitivities
        return self.cells, np.abs(self.weights)

    def row_range(self) -> tuple[float, float]:
        """The least and the greatest amount one row of a weighed cell adds to the answer.

        Without measures the least and greatest weight; with them, the box extremes over the
        cells (widened to the next float8 where not exact). (0, 0) for the zero vector.

        >>> LinearQuery.from_dense([2, 0, -1, 0], measures=((-3, 5),)).row_range()
        (-3.0, 5.0)
        """
        if self._row_range is not None:
            return self._row_range
        return float(self.weights.min(initial=0.0)), float(self.weights.max(initial=0.0))

    @property
    def sensitivity(self) -> float:
        """L1 sensitivity S under add/remove-one-row: the largest cell sensitivity.

        Without measures ``max_j |q_j|`` (papers' Lemma 3.1).
        """
        magnitudes = self.cell_sensitivities()[1]
        return float(np.max(magnitudes)) if magnitudes.size else 0.0

    def to_dense(self) -> npt.NDArray[np.float64]:
        """The weight of every cell, zeros included."""
        dense = np.zeros(self.n_cells)
        dense[self.cells] = self.weights
        return dense

    def evaluate(self, histogram: npt.ArrayLike) -> float:
        """The exact answer on a dense histogram of cell counts."""
        counts = np.asarray(histogram, dtype=np.float64)
        return float(self.weights @ counts[self.cells]) + self.offset

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LinearQuery):
            return NotImplemented
        return (
            self.n_cells == other.n_cells
            and self.measures == other.measures
            and self.offset == other.offset
            and np.array_equal(self.cells, other.cells)
            and np.array_equal(self.weights, other.weights)
        )

    def __repr__(self) -> str:
        return (
            f"LinearQuery(n_cells={self.n_cells}, nnz={self.cells.size}, "
            f"sensitivity={self.sensitivity}, offset={self.offset})"
        )


def _box_sensitivities(
    query: LinearQuery,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], tuple[float, float]]:
    """Per cell weighed, ``max |q_count + sum_m q_m v_m|`` with each ``v_m`` in its reach.

    Also the least and greatest value of ``q_count + sum_m q_m v_m`` over the cells. A linear
    function's extremes over a box lie at corners chosen per coordinate by the sign of its
    weight. Computed exactly (in fractions, weights read as the decimals they print as, as the
    budget and the noise lattice read them) once per distinct weight pattern, then rounded up,
    so that neither the noise nor a cell's charge is ever below the true sensitivity.

    >>> q = LinearQuery.from_dense([-1, 0, 0.025, 0], measures=((0, 99),))
    >>> q.cell_sensitivities()
    (array([0]), array([1.475]))
    """
    n = query.cube_cells
    kinds = 1 + len(query.measures)
    cell = query.cells % n
    cells, inverse = np.unique(cell, return_inverse=True)
    table = np.zeros((cells.size, kinds))
    table[inverse, query.cells // n] = query.weights
    patterns, back = _distinct_rows(table)
    bounds = [(Fraction(lo), Fraction(hi)) for lo, hi in query.measures]
    magnitudes = []
    tops, bottoms = [], []
    for row in patterns.tolist():
        count, weights = Fraction(repr(row[0])), [Fraction(repr(w)) for w in row[1:]]
        terms = [(w * lo, w * hi) for w, (lo, hi) in zip(weights, bounds)]
        top = count + sum((max(t) for t in terms), Fraction(0))
        bottom = count + sum((min(t) for t in terms), Fraction(0))
        tops.append(top)
        bottoms.append(bottom)
        exact = max(abs(top), abs(bottom))
        nearest = float(exact)  # read back as the decimal it prints as, it is never below
        magnitudes.append(
            math.nextafter(nearest, math.inf) if Fraction(repr(nearest)) < exact else nearest
        )
    least, largest = min(bottoms, default=Fraction(0)), max(tops, default=Fraction(0))
    low, high = float(least), float(largest)
    row_range = (
        math.nextafter(low, -math.inf) if Fraction(low) > least else low,
        math.nextafter(high, math.inf) if Fraction(high) < largest else high,
    )
    return cells.astype(np.int64), np.asarray(magnitudes, dtype=np.float64)[back], row_range


def _distinct_rows(
    table: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """The distinct rows of ``table`` and each row's index among them.

    Each column's distinct values are numbered and a row keyed by its numbers (mixed radix),
    so the sort is of integers: a row-wise ``np.unique`` is 100 times slower on a million rows.
    """
    key = np.zeros(table.shape[0], dtype=np.int64)
    radix = 1
    for column in table.T:
        values, ids = np.unique(column, return_inverse=True)
        radix *= values.size
        if radix >= 2**62:  # too many combinations for one integer key
            patterns, back = np.unique(table, axis=0, return_inverse=True)
            return patterns, back.ravel()
        key = key * values.size + ids.ravel()
    _, first, back = np.unique(key, return_index=True, return_inverse=True)
    return table[first], back.ravel()
