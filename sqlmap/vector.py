"""Sparse linear query vectors over the cells of a data cube.

A query answer is ``q . x + offset`` where ``x`` is the histogram of cell counts. This is the
papers' query vector (a row H_i of the history matrix) plus the constant part of the SQL
expression, which needs no privacy budget.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["LinearQuery"]


class LinearQuery:
    """``answer = sum_j weights[k] * x[cells[k]] + offset`` over a cube of ``n_cells`` cells.

    ``cells`` is strictly increasing and ``weights`` holds no zeros, so two equal queries have
    equal arrays. Both arrays are read-only.

    A query over a cube can also be held *factored* (:meth:`from_tensor`): its weight per cell
    is a tensor over the few dimensions it depends on (``axes``), constant along every other
    one. SQL over a wide cube touches millions of cells but depends on a handful of
    dimensions, so ``core`` stays small; ``cells`` and ``weights`` are then built on first use
    (the reader's SQL needs them, the engine does not).

    >>> q = LinearQuery.from_dense(np.array([0.0, 2.0, 0.0, -3.0]), offset=5.0)
    >>> q
    LinearQuery(n_cells=4, nnz=2, sensitivity=3.0, offset=5.0)
    >>> q.evaluate(np.array([10, 20, 30, 40]))
    -75.0
    >>> f = LinearQuery.from_tensor((2, 3), np.array([[1.0], [2.0]]))
    >>> f.axes, f.core.tolist(), f.cells.tolist(), f.weights.tolist()
    ((0,), [1.0, 2.0], [0, 1, 2, 3, 4, 5], [1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
    """

    __slots__ = ("n_cells", "offset", "shape", "axes", "core", "_cells", "_weights")

    n_cells: int
    offset: float
    shape: tuple[int, ...] | None  # the cube's, for a factored query
    axes: tuple[int, ...]  # the dimensions a factored query depends on, increasing
    core: npt.NDArray[np.float64] | None  # its weight per cell of those dimensions
    _cells: npt.NDArray[np.int64] | None  # built on first use for a factored query
    _weights: npt.NDArray[np.float64] | None

    def __init__(
        self,
        n_cells: int,
        cells: npt.ArrayLike,
        weights: npt.ArrayLike,
        offset: float = 0.0,
    ) -> None:
        cells = np.asarray(cells, dtype=np.int64)
        weights = np.asarray(weights, dtype=np.float64)
        if cells.ndim != 1 or cells.shape != weights.shape:
            raise ValueError("cells and weights must be 1-D arrays of equal length")
        if cells.size and (cells[0] < 0 or cells[-1] >= n_cells):
            raise ValueError(f"cell index out of range [0, {n_cells})")
        if cells.size > 1 and not np.all(np.diff(cells) > 0):
            raise ValueError("cells must be strictly increasing")
        if not np.all(np.isfinite(weights)) or np.any(weights == 0):
            raise ValueError("weights must be finite and non-zero")
        cells.flags.writeable = False
        weights.flags.writeable = False
        self._set(n_cells, offset, None, (), None, cells, weights)

    def _set(
        self,
        n_cells: int,
        offset: float,
        shape: tuple[int, ...] | None,
        axes: tuple[int, ...],
        core: npt.NDArray[np.float64] | None,
        cells: npt.NDArray[np.int64] | None,
        weights: npt.NDArray[np.float64] | None,
    ) -> None:
        if not np.isfinite(offset):
            raise ValueError("offset must be finite")
        for name, value in (
            ("n_cells", n_cells),
            ("offset", float(offset)),
            ("shape", shape),
            ("axes", axes),
            ("core", core),
            ("_cells", cells),
            ("_weights", weights),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"LinearQuery is immutable: cannot set {name}")

    @classmethod
    def from_dense(cls, dense: npt.ArrayLike, offset: float = 0.0) -> LinearQuery:
        """Build from a dense weight per cell (zeros dropped)."""
        dense_arr = np.asarray(dense, dtype=np.float64).ravel()
        (cells,) = np.nonzero(dense_arr)
        return cls(dense_arr.size, cells, dense_arr[cells], offset)

    @classmethod
    def from_tensor(
        cls, shape: tuple[int, ...], tensor: npt.ArrayLike, offset: float = 0.0
    ) -> LinearQuery:
        """A factored query: ``tensor`` broadcasts to ``shape`` (C order, as cells are numbered).

        Dimensions along which the weights do not vary are dropped, so one vector has one
        ``(axes, core)``.
        """
        shape = tuple(int(s) for s in shape)
        t = np.asarray(tensor, dtype=np.float64)
        if t.ndim > len(shape):
            raise ValueError("tensor has more dimensions than the cube")
        t = t.reshape((1,) * (len(shape) - t.ndim) + t.shape)
        if any(s not in (1, n) for s, n in zip(t.shape, shape)):
            raise ValueError(f"a tensor of shape {t.shape} does not broadcast to {shape}")
        if not np.all(np.isfinite(t)):
            raise ValueError("weights must be finite")
        axes = []
        for d in range(len(shape)):
            if t.shape[d] == 1:
                continue
            first = t[(slice(None),) * d + (slice(0, 1),)]
            if np.array_equal(t, np.broadcast_to(first, t.shape)):
                t = first
            else:
                axes.append(d)
        core = np.ascontiguousarray(t.reshape([shape[d] for d in axes]))
        core.flags.writeable = False
        query = cls.__new__(cls)
        query._set(math.prod(shape), offset, shape, tuple(axes), core, None, None)
        return query

    @property
    def factored(self) -> bool:
        """Whether the query is held as ``(axes, core)`` over a cube."""
        return self.core is not None

    def tensor(self) -> npt.NDArray[np.float64]:
        """A factored query's weights as a tensor broadcasting to its cube's shape."""
        assert self.core is not None and self.shape is not None
        return self.core.reshape([n if d in self.axes else 1 for d, n in enumerate(self.shape)])

    @property
    def cells(self) -> npt.NDArray[np.int64]:
        """The cells with a non-zero weight, increasing."""
        if self._cells is None:
            self._expand()
        assert self._cells is not None
        return self._cells

    @property
    def weights(self) -> npt.NDArray[np.float64]:
        """Their weights."""
        if self._weights is None:
            self._expand()
        assert self._weights is not None
        return self._weights

    def _expand(self) -> None:
        assert self.shape is not None
        dense = np.broadcast_to(self.tensor(), self.shape).ravel()
        (cells,) = np.nonzero(dense)
        weights = dense[cells]
        cells = cells.astype(np.int64)
        cells.flags.writeable = False
        weights.flags.writeable = False
        object.__setattr__(self, "_cells", cells)
        object.__setattr__(self, "_weights", weights)

    def nonzero_weights(self) -> npt.NDArray[np.float64]:
        """The non-zero weights, one per cell (or per cell of the core, if factored)."""
        if self.core is not None:
            nonzero: npt.NDArray[np.float64] = self.core[self.core != 0]
            return nonzero
        return self.weights

    @property
    def is_zero(self) -> bool:
        """Whether every weight is zero."""
        return not self.nonzero_weights().size

    @property
    def key(self) -> bytes:
        """Equal for equal queries held the same way (factored or not), offset aside."""
        if self.core is not None:
            return np.array(self.axes, dtype=np.int64).tobytes() + b"|" + self.core.tobytes()
        return self.cells.tobytes() + self.weights.tobytes()

    def without_offset(self) -> LinearQuery:
        """The same weights, offset 0 (what is measured)."""
        if self.offset == 0:
            return self
        query = LinearQuery.__new__(LinearQuery)
        query._set(self.n_cells, 0.0, self.shape, self.axes, self.core, self._cells, self._weights)
        return query

    @property
    def sensitivity(self) -> float:
        """L1 sensitivity S = max_j |q_j| under add/remove-one-row (papers' Lemma 3.1)."""
        weights = self.nonzero_weights()
        return float(np.max(np.abs(weights))) if weights.size else 0.0

    def to_dense(self) -> npt.NDArray[np.float64]:
        """The weight of every cell, zeros included."""
        if self.shape is not None:
            return np.broadcast_to(self.tensor(), self.shape).ravel().copy()
        dense = np.zeros(self.n_cells)
        dense[self.cells] = self.weights
        return dense

    def evaluate(self, histogram: npt.ArrayLike) -> float:
        """The exact answer on a dense histogram of cell counts."""
        counts = np.asarray(histogram, dtype=np.float64)
        if self.core is not None and self.shape is not None:
            return float(np.sum(counts.reshape(self.shape) * self.tensor())) + self.offset
        return float(self.weights @ counts[self.cells]) + self.offset

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LinearQuery):
            return NotImplemented
        if self.core is not None and other.core is not None:
            return (
                self.shape == other.shape
                and self.offset == other.offset
                and self.axes == other.axes
                and np.array_equal(self.core, other.core)
            )
        return (
            self.n_cells == other.n_cells
            and self.offset == other.offset
            and np.array_equal(self.cells, other.cells)
            and np.array_equal(self.weights, other.weights)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        nnz = (
            f"axes={self.axes}, core={self.core.size}"
            if self.core is not None
            else f"nnz={self.cells.size}"
        )
        return (
            f"LinearQuery(n_cells={self.n_cells}, {nnz}, "
            f"sensitivity={self.sensitivity}, offset={self.offset})"
        )
