"""Linear query vectors over the coordinates of a data cube, sparse or factored.

A query answer is ``q . x + offset`` where ``x`` is the histogram of cell counts. This is the
papers' query vector (a row H_i of the history matrix) plus the constant part of the SQL
expression, which needs no privacy budget.

Over a cube with measures, ``x`` has more coordinates than cells: the ``n`` cell counts, then
for each measure the ``n`` cells' clamped sums of it (coordinate ``k`` belongs to cell ``k % n``).
A row of cell ``c`` then moves ``c``'s count by 1 and each of ``c``'s sums by at most that
measure's reach, so the answer moves by at most ``max |q_count + sum_m q_m v_m|`` over the box
of those reaches: the cell's sensitivity, which the privacy accounting charges per cell.

The coordinates are thus a tensor of shape ``(1 + measures, *cube.shape)`` in C order: the
*kind* (count, then each measure) is one more axis before the cube's dimensions. A factored
query (:meth:`LinearQuery.from_tensor`) keeps its weights as such a tensor over the kind axis
and the few dimensions it depends on.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = ["LinearQuery"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Reach = tuple[tuple[int, int], ...]


class LinearQuery:
    """``answer = sum_j weights[k] * x[cells[k]] + offset`` over ``n_cells`` coordinates.

    ``cells`` is strictly increasing and ``weights`` holds no zeros, so two equal queries have
    equal arrays. Both arrays are read-only. ``measures`` is, per measure of the cube, the least
    and greatest amount one row adds to its cell's sum (:attr:`sqlmap.cube.Measure.reach`);
    ``n_cells`` counts coordinates, ``(1 + len(measures))`` per cell of the cube.

    A query over a cube can also be held *factored* (:meth:`from_tensor`): its weights are a
    tensor ``core`` over the kind axis (count, then each measure) and the few dimensions of the
    cube it depends on (``axes``), constant along every other one. SQL over a wide cube touches
    millions of cells but depends on a handful of dimensions, so ``core`` stays small;
    ``cells`` and ``weights`` are then built on first use (the reader's SQL needs them, the
    engine does not), and the per-cell sensitivities are a tensor over ``axes`` too.

    >>> q = LinearQuery.from_dense(np.array([0.0, 2.0, 0.0, -3.0]), offset=5.0)
    >>> q
    LinearQuery(n_cells=4, nnz=2, sensitivity=3.0, offset=5.0)
    >>> q.evaluate(np.array([10, 20, 30, 40]))
    -75.0
    >>> f = LinearQuery.from_tensor((2, 3), np.array([[1.0], [2.0]]))
    >>> f.axes, f.core.tolist(), f.cells.tolist(), f.weights.tolist()
    ((0,), [[1.0, 2.0]], [0, 1, 2, 3, 4, 5], [1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
    """

    __slots__ = (
        "n_cells",
        "offset",
        "measures",
        "shape",
        "axes",
        "core",
        "_cells",
        "_weights",
        "_cell_sensitivities",
        "_magnitudes",
        "_row_range",
        "_key",
        "_nonzero",
        "_sensitivity",
    )

    n_cells: int
    offset: float
    measures: Reach
    shape: tuple[int, ...] | None  # the cube's, for a factored query
    axes: tuple[int, ...]  # the cube's dimensions a factored query depends on, increasing
    core: FloatArray | None  # its weights over (kind, *those dimensions)
    _cells: IntArray | None  # built on first use for a factored query
    _weights: FloatArray | None
    _cell_sensitivities: tuple[IntArray, FloatArray] | None  # with measures, cell by cell
    _magnitudes: FloatArray | None  # factored: each cell's sensitivity over ``axes``
    _row_range: tuple[float, float]
    # derived on first use (a restart asks each shared vector for them once per entry)
    _key: bytes | None
    _nonzero: FloatArray | None
    _sensitivity: float | None  # asked by every decision, budget check and charge

    def __init__(
        self,
        n_cells: int,
        cells: npt.ArrayLike,
        weights: npt.ArrayLike,
        offset: float = 0.0,
        measures: Reach = (),
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
        reach = _checked_reach(measures)
        if n_cells % (1 + len(reach)):
            raise ValueError("n_cells must be a whole number of cells per coordinate kind")
        self._set(n_cells, offset, reach, None, (), None, cells, weights)
        if reach:
            owners, magnitudes, row_range = _cell_box(cells, weights, n_cells, reach)
            object.__setattr__(self, "_cell_sensitivities", (owners, magnitudes))
        else:
            row_range = (float(weights.min(initial=0.0)), float(weights.max(initial=0.0)))
        object.__setattr__(self, "_row_range", row_range)

    def _set(
        self,
        n_cells: int,
        offset: float,
        measures: Reach,
        shape: tuple[int, ...] | None,
        axes: tuple[int, ...],
        core: FloatArray | None,
        cells: IntArray | None,
        weights: FloatArray | None,
    ) -> None:
        if not np.isfinite(offset):
            raise ValueError("offset must be finite")
        for name, value in (
            ("n_cells", n_cells),
            ("offset", float(offset)),
            ("measures", measures),
            ("shape", shape),
            ("axes", axes),
            ("core", core),
            ("_cells", cells),
            ("_weights", weights),
            ("_cell_sensitivities", None),
            ("_magnitudes", None),
            ("_key", None),
            ("_nonzero", None),
            ("_sensitivity", None),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"LinearQuery is immutable: cannot set {name}")

    @classmethod
    def from_dense(
        cls, dense: npt.ArrayLike, offset: float = 0.0, measures: Reach = ()
    ) -> LinearQuery:
        """Build from a dense weight per coordinate (zeros dropped)."""
        dense_arr = np.asarray(dense, dtype=np.float64).ravel()
        (cells,) = np.nonzero(dense_arr)
        return cls(dense_arr.size, cells, dense_arr[cells], offset, measures)

    @classmethod
    def from_tensor(
        cls,
        shape: tuple[int, ...],
        tensor: npt.ArrayLike,
        offset: float = 0.0,
        measures: Reach = (),
    ) -> LinearQuery:
        """A factored query over a cube of ``shape``.

        ``tensor`` broadcasts to the coordinates' shape ``(1 + len(measures), *shape)`` (C
        order, as coordinates are numbered); a tensor with fewer axes is aligned to the right,
        so without measures one over the cube's dimensions will do. Dimensions along which the
        weights do not vary are dropped, so one vector has one ``(axes, core)``.

        COUNT(*) + SUM(v) / 2 over the first value of dimension 0, SUM(v) / 2 over its second,
        with ``v`` in [0, 4]:

        >>> tensor = [[[1.0], [0.0]], [[0.5], [0.5]]]  # (kind, dimension 0, dimension 1)
        >>> q = LinearQuery.from_tensor((2, 3), tensor, measures=((0, 4),))
        >>> q.axes, q.core.tolist(), q.sensitivity_tensor().tolist(), q.row_range()
        ((0,), [[1.0, 0.0], [0.5, 0.5]], [3.0, 2.0], (0.0, 3.0))
        """
        shape = tuple(int(s) for s in shape)
        reach = _checked_reach(measures)
        full = (1 + len(reach), *shape)
        t = np.asarray(tensor, dtype=np.float64)
        if t.ndim > len(full):
            raise ValueError("tensor has more dimensions than the cube's coordinates")
        t = t.reshape((1,) * (len(full) - t.ndim) + t.shape)
        if any(s not in (1, n) for s, n in zip(t.shape, full)):
            raise ValueError(f"a tensor of shape {t.shape} does not broadcast to {full}")
        if not np.isfinite(t).all():
            raise ValueError("weights must be finite")
        t = np.broadcast_to(t, (full[0], *t.shape[1:]))  # every kind has its own weights
        axes = []
        for d in range(len(shape)):
            position = 1 + d
            if t.shape[position] == 1:
                continue
            first = t[(slice(None),) * position + (slice(0, 1),)]
            if (t == first).all():
                t = first
            else:
                axes.append(d)
        core = np.ascontiguousarray(t.reshape([full[0]] + [shape[d] for d in axes]))
        return cls._of_core(shape, reach, tuple(axes), core, offset)

    @classmethod
    def from_core(
        cls,
        shape: tuple[int, ...],
        axes: Sequence[int],
        core: npt.ArrayLike,
        measures: Reach = (),
    ) -> LinearQuery:
        """The factored query ``(axes, core)`` over a cube of ``shape``, as it was stored.

        :meth:`from_tensor` of the core spread over the cube, without the spreading: ``core``
        is over the kind axis and ``axes`` (increasing). A core that does not vary along one
        of its axes is not as :meth:`from_tensor` holds it, and is taken through it.

        >>> q = LinearQuery.from_tensor((2, 3), [[1.0, 0.0, 2.0]])
        >>> LinearQuery.from_core((2, 3), q.axes, q.core) == q
        True
        >>> LinearQuery.from_core((2, 3), (0, 1), [[[1.0, 0.0, 2.0]] * 2]).axes
        (1,)
        """
        shape = tuple(int(s) for s in shape)
        reach = _checked_reach(measures)
        axes = tuple(int(d) for d in axes)
        c = np.array(core, dtype=np.float64)  # a copy: the query's own
        expected = (1 + len(reach), *(shape[d] if 0 <= d < len(shape) else -1 for d in axes))
        if c.shape != expected or any(b <= a for a, b in zip(axes, axes[1:])):
            raise ValueError(f"a core of shape {c.shape} over axes {axes} of a cube {shape}")
        if not np.isfinite(c).all():
            raise ValueError("weights must be finite")
        for position in range(1, c.ndim):
            if (c == c[(slice(None),) * position + (slice(0, 1),)]).all():
                spread = [1] * len(shape)
                for d, n in zip(axes, c.shape[1:]):
                    spread[d] = n
                return cls.from_tensor(shape, c.reshape([c.shape[0], *spread]), 0.0, reach)
        return cls._of_core(shape, reach, axes, c, 0.0)

    @classmethod
    def _of_core(
        cls,
        shape: tuple[int, ...],
        reach: Reach,
        axes: tuple[int, ...],
        core: FloatArray,
        offset: float,
    ) -> LinearQuery:
        """The query over ``axes`` with ``core`` (contiguous, as :meth:`from_tensor` holds it).

        Its cells' sensitivities are worked out over ``axes``.
        """
        core.flags.writeable = False
        query = cls.__new__(cls)
        query._set(core.shape[0] * math.prod(shape), offset, reach, shape, axes, core, None, None)
        per_cell = core.reshape(core.shape[0], -1).T  # a row per cell of ``axes``: its kinds
        weighed = (per_cell != 0).any(axis=1)
        magnitudes = np.zeros(per_cell.shape[0])
        if reach:
            magnitudes[weighed], row_range = _box(per_cell[weighed], reach)
        else:
            magnitudes = np.abs(per_cell[:, 0])
            row_range = (float(core.min(initial=0.0)), float(core.max(initial=0.0)))
        over_axes = magnitudes.reshape(core.shape[1:])
        over_axes.flags.writeable = False
        object.__setattr__(query, "_magnitudes", over_axes)
        object.__setattr__(query, "_row_range", row_range)
        return query

    @property
    def factored(self) -> bool:
        """Whether the query is held as ``(axes, core)`` over a cube."""
        return self.core is not None

    @property
    def kinds(self) -> int:
        """Coordinates per cell: the count, then each measure's sum."""
        return 1 + len(self.measures)

    @property
    def cube_cells(self) -> int:
        """The number of cells of the cube (coordinates per kind: counts, each measure's sums)."""
        return self.n_cells // self.kinds

    def tensor(self) -> FloatArray:
        """A factored query's weights, broadcasting to ``(kinds, *shape)``."""
        assert self.core is not None and self.shape is not None
        return self.core.reshape(
            [self.kinds] + [n if d in self.axes else 1 for d, n in enumerate(self.shape)]
        )

    def sensitivity_tensor(self) -> FloatArray:
        """A factored query's cell sensitivities over ``axes`` (0 where no cell is weighed)."""
        assert self._magnitudes is not None
        return self._magnitudes

    @property
    def cells(self) -> IntArray:
        """The coordinates with a non-zero weight, increasing."""
        if self._cells is None:
            self._expand()
        assert self._cells is not None
        return self._cells

    @property
    def weights(self) -> FloatArray:
        """Their weights."""
        if self._weights is None:
            self._expand()
        assert self._weights is not None
        return self._weights

    def _expand(self) -> None:
        dense = self.to_dense()
        (cells,) = np.nonzero(dense)
        weights = dense[cells]
        cells = cells.astype(np.int64)
        cells.flags.writeable = False
        weights.flags.writeable = False
        object.__setattr__(self, "_cells", cells)
        object.__setattr__(self, "_weights", weights)

    def cell_sensitivities(self) -> tuple[IntArray, FloatArray]:
        """Every cell a row of which moves the answer, and by how much at most (never less).

        Without measures, the cells weighed and ``|q_j|``; with them, the box maximum of
        ``|q_count + sum_m q_m v_m|`` over each measure's reach, rounded up to float8. (A
        factored query's are built from its sensitivity tensor, cell by cell.)
        """
        if self._magnitudes is not None and self.shape is not None:
            spread = self._magnitudes.reshape(
                [n if d in self.axes else 1 for d, n in enumerate(self.shape)]
            )
            dense = np.broadcast_to(spread, self.shape).ravel()
            (owners,) = np.nonzero(dense)
            return owners.astype(np.int64), dense[owners]
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
        return self._row_range

    def nonzero_weights(self) -> FloatArray:
        """The non-zero weights, one per coordinate (or per entry of the core, if factored)."""
        if self.core is None:
            return self.weights
        if self._nonzero is None:
            nonzero = self.core[self.core != 0]
            nonzero.flags.writeable = False
            object.__setattr__(self, "_nonzero", nonzero)
        return self._nonzero  # type: ignore[return-value]

    @property
    def is_zero(self) -> bool:
        """Whether every weight is zero."""
        return not self.nonzero_weights().size

    @property
    def key(self) -> bytes:
        """Equal for equal queries held the same way (factored or not), offset aside."""
        if self._key is None:
            if self.core is not None:
                head = np.array((self.kinds, *self.axes), dtype=np.int64).tobytes()
                key = head + b"|" + self.core.tobytes()
            else:
                key = self.cells.tobytes() + self.weights.tobytes()
            object.__setattr__(self, "_key", key)
        return self._key  # type: ignore[return-value]

    def without_offset(self) -> LinearQuery:
        """The same weights, offset 0 (what is measured)."""
        if self.offset == 0:
            return self
        query = LinearQuery.__new__(LinearQuery)
        for name in self.__slots__:
            object.__setattr__(query, name, getattr(self, name))
        object.__setattr__(query, "offset", 0.0)
        return query

    @property
    def sensitivity(self) -> float:
        """L1 sensitivity S under add/remove-one-row: the largest cell sensitivity.

        Without measures ``max_j |q_j|`` (papers' Lemma 3.1).
        """
        if self._sensitivity is None:
            if self._magnitudes is not None:
                sensitivity = float(np.max(self._magnitudes, initial=0.0))
            else:
                magnitudes = self.cell_sensitivities()[1]
                sensitivity = float(np.max(magnitudes)) if magnitudes.size else 0.0
            object.__setattr__(self, "_sensitivity", sensitivity)
        return self._sensitivity  # type: ignore[return-value]

    def to_dense(self) -> FloatArray:
        """The weight of every coordinate, zeros included."""
        if self.shape is not None:
            full = (self.kinds, *self.shape)
            return np.broadcast_to(self.tensor(), full).ravel().copy()
        dense = np.zeros(self.n_cells)
        dense[self.cells] = self.weights
        return dense

    def evaluate(self, histogram: npt.ArrayLike) -> float:
        """The exact answer on a dense histogram of every coordinate (cell counts, sums)."""
        counts = np.asarray(histogram, dtype=np.float64)
        if self.core is not None and self.shape is not None:
            full = counts.reshape((self.kinds, *self.shape))
            return float(np.sum(full * self.tensor())) + self.offset
        return float(self.weights @ counts[self.cells]) + self.offset

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LinearQuery):
            return NotImplemented
        if self.measures != other.measures or self.offset != other.offset:
            return False
        if self.core is not None and other.core is not None:
            return (
                self.shape == other.shape
                and self.axes == other.axes
                and np.array_equal(self.core, other.core)
            )
        return (
            self.n_cells == other.n_cells
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


def _checked_reach(measures: Reach) -> Reach:
    reach = tuple((int(lo), int(hi)) for lo, hi in measures)
    if not all(lo < hi for lo, hi in reach):
        raise ValueError("a measure's reach must be a range lo < hi")
    return reach


def _cell_box(
    coordinates: IntArray, weights: FloatArray, n_coordinates: int, measures: Reach
) -> tuple[IntArray, FloatArray, tuple[float, float]]:
    """Per cell weighed (by any of its coordinates), its :func:`_box` sensitivity; the range.

    >>> q = LinearQuery.from_dense([-1, 0, 0.025, 0], measures=((0, 99),))
    >>> q.cell_sensitivities()
    (array([0]), array([1.475]))
    """
    kinds = 1 + len(measures)
    n = n_coordinates // kinds
    cells, inverse = np.unique(coordinates % n, return_inverse=True)
    table = np.zeros((cells.size, kinds))
    table[inverse, coordinates // n] = weights
    magnitudes, row_range = _box(table, measures)
    return cells.astype(np.int64), magnitudes, row_range


def _box(table: FloatArray, measures: Reach) -> tuple[FloatArray, tuple[float, float]]:
    """Per row of kinds' weights, ``max |q_count + sum_m q_m v_m|`` with each ``v_m`` in its reach.

    Also the least and greatest value of ``q_count + sum_m q_m v_m`` over the rows, both
    worked out once per distinct row (:func:`_corners`).
    """
    # a measure no row weighs adds 0 at every corner: left out (a count over a measured cube)
    weighed = np.flatnonzero(table[:, 1:].any(axis=0)).tolist()
    kept = table[:, [0, *(1 + m for m in weighed)]]
    reach = tuple(measures[m] for m in weighed)
    if kept.shape[0] > 1024:  # many cells (a vector held cell by cell): sorted into patterns
        patterns, back = _distinct_rows(kept)
        rows = list(map(tuple, patterns.tolist()))
    else:  # a factored vector's few cells: a dict is 5x faster than the sorts
        index: dict[tuple[float, ...], int] = {}
        keys = map(tuple, kept.tolist())
        back = np.array([index.setdefault(r, len(index)) for r in keys], dtype=np.int64)
        rows = list(index)
        if len(rows) <= 8:  # SQL's vectors share their few patterns (a GROUP BY's groups)
            magnitudes, row_range = _few_rows_box(tuple(rows), reach)
            return np.array(magnitudes)[back], row_range
    magnitudes, row_range = _rows_box(rows, reach)
    return np.array(magnitudes)[back], row_range


@functools.lru_cache(maxsize=4096)
def _few_rows_box(
    rows: tuple[tuple[float, ...], ...], measures: Reach
) -> tuple[tuple[float, ...], tuple[float, float]]:
    """:func:`_rows_box` of a few distinct rows, remembered."""
    return _rows_box(rows, measures)


def _rows_box(
    rows: Sequence[tuple[float, ...]], measures: Reach
) -> tuple[tuple[float, ...], tuple[float, float]]:
    """Each distinct row's sensitivity, and the least and greatest value over all of them."""
    corners = [_corners(row, measures) for row in rows]
    least = min((c[2] for c in corners), default=Fraction(0))
    largest = max((c[1] for c in corners), default=Fraction(0))
    low, high = float(least), float(largest)
    row_range = (
        math.nextafter(low, -math.inf) if Fraction(low) > least else low,
        math.nextafter(high, math.inf) if Fraction(high) < largest else high,
    )
    return tuple(c[0] for c in corners), row_range


@functools.lru_cache(maxsize=65536)
def _corners(row: tuple[float, ...], measures: Reach) -> tuple[float, Fraction, Fraction]:
    """One row's sensitivity (rounded up to float8), and its exact greatest and least value.

    A linear function's extremes over a box lie at corners chosen per coordinate by the sign
    of its weight. Computed exactly (in fractions, weights read as the decimals they print as,
    as the budget and the noise lattice read them), then rounded up, so that neither the noise
    nor a cell's charge is ever below the true sensitivity. Vectors share few distinct rows
    (one per weight pattern), hence the cache.
    """
    count = Fraction(repr(row[0]))
    top = bottom = count
    for w, (lo, hi) in zip(row[1:], measures):
        if w:
            weight = Fraction(repr(w))
            low, high = sorted((weight * lo, weight * hi))
            top, bottom = top + high, bottom + low
    exact = max(abs(top), abs(bottom))
    nearest = float(exact)  # read back as the decimal it prints as, it is never below
    magnitude = math.nextafter(nearest, math.inf) if Fraction(repr(nearest)) < exact else nearest
    return magnitude, top, bottom


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
