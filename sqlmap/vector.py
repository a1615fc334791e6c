"""Sparse linear query vectors over the cells of a data cube.

A query answer is ``q . x + offset`` where ``x`` is the histogram of cell counts. This is the
papers' query vector (a row H_i of the history matrix) plus the constant part of the SQL
expression, which needs no privacy budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["LinearQuery"]


@dataclass(frozen=True, slots=True, eq=False)
class LinearQuery:
    """``answer = sum_j weights[k] * x[cells[k]] + offset`` over a cube of ``n_cells`` cells.

    ``cells`` is strictly increasing and ``weights`` holds no zeros, so two equal queries have
    equal arrays. Both arrays are read-only.

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

    @classmethod
    def from_dense(cls, dense: npt.ArrayLike, offset: float = 0.0) -> LinearQuery:
        """Build from a dense weight per cell (zeros dropped)."""
        dense_arr = np.asarray(dense, dtype=np.float64).ravel()
        (cells,) = np.nonzero(dense_arr)
        return cls(dense_arr.size, cells, dense_arr[cells], offset)

    @property
    def sensitivity(self) -> float:
        """L1 sensitivity S = max_j |q_j| under add/remove-one-row (papers' Lemma 3.1)."""
        return float(np.max(np.abs(self.weights))) if self.weights.size else 0.0

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
            and self.offset == other.offset
            and np.array_equal(self.cells, other.cells)
            and np.array_equal(self.weights, other.weights)
        )

    def __repr__(self) -> str:
        return (
            f"LinearQuery(n_cells={self.n_cells}, nnz={self.cells.size}, "
            f"sensitivity={self.sensitivity}, offset={self.offset})"
        )
