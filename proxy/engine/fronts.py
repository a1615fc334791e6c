"""Minimum-norm combinations of the history's distinct vectors, front by front of ANOVA blocks.

The problem :mod:`proxy.engine.span` solves (the minimum-norm ``u`` with ``sum_j u_j c_j h_j =
q``), solved without the span's ``r x r`` matrices: through an orthogonal factorization of the
weighed rows ``A = [c_j h_j]`` in the engine's ANOVA coordinates (:mod:`proxy.engine.factored`:
an isometry, one block of coordinates per set ``S`` of dimensions), the blocks taken highest
order first (a multifrontal QR). ``R^T R = A^T A``, with ``R`` held as one *front* per block
``T``: ``k_T`` rows that fix ``T``, ``R_T V_T`` over its coordinates (``V_T``: orthonormal
rows; ``R_T``: upper triangular) and ``C_T`` over the coordinates of the later blocks its rows
weigh. The blocks of a vector over dimensions ``D`` are the subsets of ``D``, so a front's rows
reach few blocks: a query reads the fronts on its path, not the history.

- *A row* (``sqrt(w) h_j`` for a measurement of vector ``j`` weighing ``w``: ``c_j^2`` grows
  by ``w``, ``A^T A`` by ``w h_j h_j^T``) enters at its first block ``T``. Its part there is
  split along ``V_T`` and off it (orthogonalised twice); past ``_RANK`` of the block's scale
  (the largest row it has met, and the scales of the blocks that passed rows on to it: their
  rounding came with them), the part off it is a new direction of the front (its rank
  grows), else rounding, dropped. The front and the row are then rotated (LAPACK's
  triangular-pentagonal QR, ``dtpqrt``/``dtpmqrt``) so that the row has nothing left at
  ``T``; what remains of it, over later blocks, is passed on to its next block. A block's
  incoming rows are taken together: weighs wait (pooled per vector) until the next use, so
  a restart's whole history is one pass over the blocks, a stack of rows and one
  factorization per block.
- *A query* ``q``: forward substitution ``R^T w = q`` from its first block: at ``T`` its part
  (less what earlier fronts took) is fitted along ``V_T`` (``w_T = R_T^{-T} V_T q_T``), the
  rest cannot be fitted (its squares, summed over the blocks, are the query's squared distance
  from the span: exact within it; outside it an upper bound, each block fitted after the
  earlier ones) and ``C_T^T w_T`` is taken off the later blocks. Then back substitution
  ``R z = w``, last block first (``z_T = V_T^T y_T``, ``y_T = R_T^{-1} (w_T - C_T z)``), over
  the fronts that ``w`` or ``z`` reach, and ``u_j / c_j = h_j^T z`` (``u = A z``: ``A^T u =
  R^T R z = q``, ``u`` in ``A``'s range: the minimum-norm solution; any ``z`` with ``R z = w``
  gives it). Both run in the fronts' directions, not over the coordinates: ``R_T^{-1} C_T z``
  as ``R_T^{-1} C_T``'s columns along the later fronts' directions times their ``y`` (``z``
  is zero in a block without a front), ``h_j^T z`` as ``sum_T (V_T h_j[T])^T y_T``; those
  products are kept (a front's rank is a few times below its block's coordinates) and
  extended as fronts change.
  Every vector's value is needed, so a solve reads them all: about ``r`` times the ranks of the
  lower fronts a front reaches, plus the classes of proportional parts per block (vectors
  measuring the same cells of the block's dimensions) times the ranks of their blocks.

Rank decisions: :class:`~proxy.engine.span.SpanSolver` admits a vector farther than
``_INDEPENDENT`` (3e-5) of its norm from the span of the earlier ones; here a block admits a
direction whose part off the front exceeds ``_RANK`` (1e-9) of the block's scale (the vector's
distance shows there scaled by its weight and by the rotations before).
On lattice-weight histories a dependent vector leaves rounding (about 1e-14 of that scale here,
1e-9 of its norm in the span solver's Gram route) and a new direction at least 1e-2 of its
norm times its weight's share of the block's largest: both rules decide alike
(tests/engine/test_fronts.py checks the ranks against the span solver's).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.linalg.lapack
from scipy import sparse

from proxy.engine.factored import AnovaCoordinates
from proxy.engine.snapshot import Array, FactorizationMismatch, Members, pack, unpack
from proxy.engine.span import BatchUpdates

__all__ = ["BlockFronts"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Rows = tuple[IntArray, FloatArray]  # rows over some coordinates: (coordinates, rows x them)

# A row's part off a front joins it past this share of the block's scale (its largest row):
# rounding leaves about 1e-14 of it, a lattice history's new directions 1e-2 of their norm.
_RANK = 1e-9
# Entries of a row passed on below this share of that largest row are rounding, set to zero,
# so that a row absorbed to rounding is not passed on through every later block.
_ZERO = 1e-13
_PANEL = 32  # dtpqrt's block size
_RUNS = 16  # runs of columns copied as slices, past which scattered


@dataclass(frozen=True, slots=True)
class _Front:
    """The rows of ``R`` that fix one block: ``[R_T V_T | C_T]``; replaced, never changed."""

    directions: FloatArray  # V_T: k x n_T, orthonormal rows
    factor: FloatArray  # R_T: k x k, upper triangular
    inverse: FloatArray  # R_T^{-1}: products rather than substitutions, at these orders
    columns: IntArray  # the later blocks' coordinates its rows weigh, increasing
    below: FloatArray  # C_T: k x columns
    reaches: IntArray  # the blocks of those coordinates
    scale: float  # the largest norm of a row that met the block


class _Room:
    """A buffer an array grows into, shared by the holders of its leading part.

    A holder keeps its own shape and writes past it in place only while the buffer is filled
    to that shape (no other holder wrote past it) and has room; else into a copy with a
    quarter more room: an append costs its own size, not the array's.
    """

    __slots__ = ("data", "filled")

    def __init__(self, data: FloatArray) -> None:
        self.data = data
        self.filled: tuple[int, ...] = data.shape

    def view(self, rows: int, columns: int) -> FloatArray:
        """The holder's part: its first ``rows`` x ``columns``."""
        return self.data[:rows, :columns]

    def grown(self, shape: tuple[int, int], new: tuple[int, int]) -> _Room:
        """A room with the holder's ``shape`` part of this one, for it to fill up to ``new``."""
        if self.filled == shape and new[0] <= self.data.shape[0] and new[1] <= self.data.shape[1]:
            self.filled = new
            return self
        room = _Room(
            np.empty(tuple(n if n == s else max(n, s + s // 4 + 8) for n, s in zip(new, shape)))
        )
        room.data[: shape[0], : shape[1]] = self.view(*shape)
        room.filled = new
        return room


@dataclass(frozen=True, slots=True)
class _Touching:
    """The vectors that weigh a block, their parts there taken as a factor times a class's row.

    Vectors measuring the same cells of the block's dimensions (a GROUP BY's groups over other
    dimensions, ranges over others) have proportional parts: on the wide cube's history of
    10,000 answers the 73,000 parts are 9,300 classes', and a solve reads 0.7 M products
    with the fronts' directions rather than 1.9 M.
    """

    vectors: IntArray  # in the order they were split
    classes: IntArray  # each vector's class
    factors: FloatArray  # its part over its class's row
    rows: _Room  # per class, the first member's part over its entry of largest magnitude
    count: int  # classes
    keys: dict[int, int]  # a class by a hash of its row rounded (to find a new vector's)


@dataclass(frozen=True, slots=True)
class _Spreading:
    """The vectors' factors over their classes' values (:meth:`BlockFronts._classes_matrix`)."""

    matrix: sparse.csr_array  # vectors x the blocks' classes, each block's after its first
    offsets: dict[int, int]  # each block's first column (blocks in any order, gaps between)
    rooms: dict[int, int]  # each block's columns (its classes, and room for more)
    lengths: dict[int, int]  # each block's vectors in it
    vectors: int  # its rows: the vectors split when it was made


class _Blocks:
    """The space's blocks as numbered when made: bounds, and each one's place in the order."""

    def __init__(self, space: AnovaCoordinates) -> None:
        numbered = space.blocks()
        self.size = space.size
        self.starts = np.array([start for _, start in numbered] + [space.size], dtype=np.int64)
        # each coordinate's block: a gather, where a search per coordinate cost a restart's
        # 8.9 million coordinates 0.5 s
        self.owner = np.repeat(np.arange(len(numbered), dtype=np.int64), np.diff(self.starts))
        self.keys = [key for key, _ in numbered]  # (kind, *S)
        keys = self.keys
        order = sorted(range(len(keys)), key=lambda b: (-len(keys[b]), keys[b]))
        self.place = np.empty(len(keys), dtype=np.int64)  # highest order first
        self.place[order] = np.arange(len(keys))

    def of(self, coordinates: IntArray) -> IntArray:
        """The block of each coordinate."""
        return self.owner[coordinates]

    def bounds(self, block: int) -> tuple[int, int]:
        """The block's first coordinate and the one past its last."""
        return int(self.starts[block]), int(self.starts[block + 1])


class BlockFronts:
    """Minimum-norm ``u`` with ``sum_j u_j c_j h_j = q``, through fronts of ANOVA blocks.

    The contract of :class:`~proxy.engine.span.SpanSolver`: :meth:`add` a distinct vector (its
    coordinates in ``space``), :meth:`weigh` it as its rows are measured, :meth:`solve_many`
    gives per query ``u_j / c_j`` for every vector within ``residual`` of the span (relative
    distance), and every query's relative distance.

    >>> from sqlmap.vector import LinearQuery
    >>> space = AnovaCoordinates((2,))
    >>> fronts = BlockFronts(space, residual=1e-6)
    >>> for tensor in ([1.0, 1.0], [0.0, 1.0], [1.0, 0.0]):
    ...     cells = LinearQuery.from_tensor((2,), np.array(tensor))
    ...     fronts.weigh(fronts.add(*space.of(cells)), 1.0)
    >>> fronts.rank, fronts.size
    (2, 3)
    >>> first_cell = space.of(LinearQuery.from_tensor((2,), np.array([1.0, 0.0])))
    >>> (g,), (distance,) = fronts.solve_many([first_cell])
    >>> g.round(9).tolist(), distance < 1e-12
    ([0.333333333, -0.333333333, 0.666666667], True)
    """

    def __init__(self, space: AnovaCoordinates, *, residual: float) -> None:
        self._space = space
        self._residual = residual
        self._blocks = _Blocks(space)
        self._fronts: dict[int, _Front] = {}
        self._sequence: IntArray | None = None  # the blocks with fronts, in order
        self._vectors: list[Rows] = []  # the distinct vectors h_j: (coordinates, values)
        self.size = 0
        self._pending: dict[int, float] = {}  # weights not yet rotated in, pooled per vector
        # per block, the vectors up to _split that weigh it (their parts there by class);
        # and the classes' rows along the front's directions, with their shape
        self._touching: dict[int, _Touching] = {}
        self._split = 0
        self._projected: dict[int, tuple[_Room, tuple[int, int], FloatArray]] = {}
        self._ranks: IntArray | None = None  # each block's front's rows, with the sequence
        # per front, R_T^{-1} C_T in the later fronts' directions: (the front, that, where,
        # and those fronts' blocks as bits)
        self._compressed: dict[int, tuple[_Front, FloatArray, IntArray, int]] = {}
        # the vectors' classes per block, as a matrix from the classes' values to the vectors'
        self._by_class: _Spreading | None = None
        # _class_rows', with the sequence, the matrix and the ranks they were taken with
        self._rows_of_classes: (
            tuple[IntArray, _Spreading, dict[int, tuple[int, FloatArray]], IntArray] | None
        ) = None
        # _rows_of_y's, with the sequence it was made for
        self._y_rows: (
            tuple[IntArray, IntArray, IntArray, dict[int, tuple[IntArray, IntArray]]] | None
        ) = None
        # per front, the runs of its columns (:meth:`_column_runs`), with those columns
        self._runs_of_columns: dict[int, tuple[IntArray, list[tuple[int, int, int]]]] = {}

    def copy(self) -> BlockFronts:
        """An independent solver with the same vectors and weights, sharing the fronts.

        Fronts are replaced, never changed, when rows are rotated in: the copy's costs a
        dictionary.
        """
        self._absorb()
        other = BlockFronts.__new__(BlockFronts)
        other.__dict__.update(self.__dict__)
        other._fronts = dict(self._fronts)
        other._vectors = list(self._vectors)
        other._pending = {}
        other._touching = dict(self._touching)
        other._projected = dict(self._projected)
        other._compressed = dict(self._compressed)
        other._runs_of_columns = dict(self._runs_of_columns)
        return other

    def export(self, into: dict[str, Array | Members]) -> dict[str, object]:
        """Everything this solver holds but its vectors, as ``into``'s arrays; the rest returned.

        Its fronts, the weights not yet rotated in, and the products solves read (each as it
        is: restored, they are read and extended as here, so answers are the same bitwise).
        Nothing is changed, and nothing exported is changed later in place (fronts and
        products are replaced; rooms are written past their holders' shapes only), so the
        arrays may be laid out after the caller's lock is released: ``into`` gets views.
        """
        fronts = self._fronts
        blocks = list(fronts)
        for name in ("directions", "factor", "inverse", "below"):
            pack(f"fronts.{name}", [getattr(fronts[b], name) for b in blocks], np.float64, into)
        for name in ("columns", "reaches"):
            pack(f"fronts.{name}", [getattr(fronts[b], name) for b in blocks], np.int64, into)
        into["fronts.block"] = np.array(blocks, dtype=np.int64)
        into["fronts.scale"] = np.array([fronts[b].scale for b in blocks])
        into["pending.vector"] = np.fromiter(self._pending, dtype=np.int64)
        into["pending.weight2"] = np.fromiter(self._pending.values(), dtype=np.float64)
        # the products of the current fronts (one whose front was replaced is not read again)
        compressed = [b for b, kept in self._compressed.items() if fronts.get(b) is kept[0]]
        kept = [self._compressed[b] for b in compressed]
        into["compressed.block"] = np.array(compressed, dtype=np.int64)
        pack("compressed.reduced", [k[1] for k in kept], np.float64, into)
        pack("compressed.where", [k[2] for k in kept], np.int64, into)
        reads = [[b for b in k[0].reaches.tolist() if k[3] >> b & 1] for k in kept]
        pack("compressed.reads", [np.array(r, dtype=np.int64) for r in reads], np.int64, into)
        touching = list(self._touching.values())
        into["touching.block"] = np.array(list(self._touching), dtype=np.int64)
        for name in ("vectors", "classes"):
            pack(f"touching.{name}", [getattr(t, name) for t in touching], np.int64, into)
        pack("touching.factors", [t.factors for t in touching], np.float64, into)
        pack("touching.rows", [t.rows.data[: t.count] for t in touching], np.float64, into)
        into["projected.block"] = np.array(list(self._projected), dtype=np.int64)
        pack("projected.rows", [p[2] for p in self._projected.values()], np.float64, into)
        spreading = self._by_class
        if spreading is not None:
            matrix = spreading.matrix
            into["by_class.data"] = matrix.data
            into["by_class.indices"] = matrix.indices
            into["by_class.indptr"] = matrix.indptr
            for name in ("offsets", "rooms", "lengths"):
                held: dict[int, int] = getattr(spreading, name)
                into[f"by_class.{name}"] = np.array(list(held.items()), dtype=np.int64)
        return {
            "vectors": self.size,
            "split": self._split,
            "by_class": None if spreading is None else [spreading.vectors, matrix.shape[1]],
        }

    @classmethod
    def restored(
        cls,
        space: AnovaCoordinates,
        vectors: list[Rows],
        meta: dict[str, object],
        arrays: Mapping[str, Array],
        *,
        residual: float,
    ) -> BlockFronts:
        """The solver :meth:`export` described, over ``space`` with ``vectors`` (``h_j``).

        Raises:
            FactorizationMismatch: the arrays do not describe fronts over these vectors.
        """
        fronts = cls(space, residual=residual)
        blocks = fronts._blocks
        count = len(blocks.keys)
        if meta.get("vectors") != len(vectors):
            raise FactorizationMismatch("its vectors are not the history's")
        fronts._vectors, fronts.size = vectors, len(vectors)
        split = meta.get("split")
        if not isinstance(split, int) or not 0 <= split <= len(vectors):
            raise FactorizationMismatch("malformed split")
        fronts._split = split

        def numbers(name: str, dtype: type, bound: int | None = None) -> Array:
            array = arrays.get(name)
            if array is None or array.dtype != dtype or array.ndim != 1:
                raise FactorizationMismatch(f"no {name}")
            if bound is not None and array.size and not (0 <= array.min() and array.max() < bound):
                raise FactorizationMismatch(f"{name}: out of range")
            return array

        front_blocks = numbers("fronts.block", np.int64, count).tolist()
        parts = {
            name: unpack(f"fronts.{name}", arrays, dtype)
            for name, dtype in (
                ("directions", np.float64),
                ("factor", np.float64),
                ("inverse", np.float64),
                ("below", np.float64),
                ("columns", np.int64),
                ("reaches", np.int64),
            )
        }
        scales = numbers("fronts.scale", np.float64).tolist()
        if any(len(p) != len(front_blocks) for p in parts.values()) or len(scales) != len(
            front_blocks
        ):
            raise FactorizationMismatch("fronts: their parts disagree")
        for at, block in enumerate(front_blocks):
            start, stop = blocks.bounds(block)
            front = _Front(scale=scales[at], **{name: p[at] for name, p in parts.items()})
            k = front.factor.shape[0]
            if (
                front.directions.shape != (k, stop - start)
                or front.factor.shape != (k, k)
                or front.inverse.shape != (k, k)
                or front.below.shape != (k, front.columns.size)
                or (front.columns.size and front.columns.max() >= blocks.size)
                or (front.reaches.size and front.reaches.max() >= count)
            ):
                raise FactorizationMismatch(f"front of block {blocks.keys[block]}: malformed")
            fronts._fronts[block] = front
        pending = numbers("pending.vector", np.int64, len(vectors))
        fronts._pending = dict(zip(pending.tolist(), numbers("pending.weight2", np.float64)))
        compressed = numbers("compressed.block", np.int64, count).tolist()
        reduced = unpack("compressed.reduced", arrays, np.float64)
        where = unpack("compressed.where", arrays, np.int64)
        reads = unpack("compressed.reads", arrays, np.int64)
        for block, r, w, bits in zip(compressed, reduced, where, reads, strict=True):
            if block not in fronts._fronts:
                raise FactorizationMismatch("a product of no front")
            bitset = sum(1 << b for b in bits.tolist())
            fronts._compressed[block] = (fronts._fronts[block], r, w, bitset)
        touching = numbers("touching.block", np.int64, count).tolist()
        members = [
            unpack(f"touching.{name}", arrays, dtype)
            for name, dtype in (
                ("vectors", np.int64),
                ("classes", np.int64),
                ("factors", np.float64),
                ("rows", np.float64),
            )
        ]
        for block, v, c, f, rows in zip(touching, *members, strict=True):
            start, stop = blocks.bounds(block)
            if (
                rows.ndim != 2
                or rows.shape[1] != stop - start
                or not v.size == c.size == f.size
                or (v.size and not (0 <= v.min() and v.max() < len(vectors)))
                or (c.size and not (0 <= c.min() and c.max() < rows.shape[0]))
            ):
                raise FactorizationMismatch(f"classes of block {blocks.keys[block]}: malformed")
            fronts._touching[block] = _Touching(
                v, c, f, _Room(rows), rows.shape[0], _class_keys(rows)
            )
        projected = numbers("projected.block", np.int64, count).tolist()
        for block, rows in zip(
            projected, unpack("projected.rows", arrays, np.float64), strict=True
        ):
            if block not in fronts._touching or block not in fronts._fronts:
                raise FactorizationMismatch("a projection of no front")
            fronts._projected[block] = (_Room(rows), rows.shape, rows)
        spread = meta.get("by_class")
        if spread is not None:
            if not (isinstance(spread, list) and len(spread) == 2):
                raise FactorizationMismatch("malformed by_class")
            by_vectors, columns = spread
            matrix = sparse.csr_array(
                (
                    numbers("by_class.data", np.float64),
                    arrays["by_class.indices"],
                    arrays["by_class.indptr"],
                ),
                shape=(by_vectors, columns),
            )
            offsets, rooms, lengths = (
                dict(arrays[f"by_class.{name}"].tolist())
                for name in ("offsets", "rooms", "lengths")
            )
            fronts._by_class = _Spreading(matrix, offsets, rooms, lengths, by_vectors)
        return fronts

    @property
    def rank(self) -> int:
        """The dimension of the span of the vectors weighed so far."""
        self._absorb()
        return sum(front.factor.shape[0] for front in self._fronts.values())

    def prepare(self) -> None:
        """Rotate the pending rows in and form what solves read, now rather than at one.

        A restart's first value would otherwise form it for every front.
        """
        self._absorb()
        blocks = self._table()
        order, ranks = self._order()
        for block in order.tolist():
            self._compressed_below(blocks, block, ranks)
        self._split_vectors(blocks)
        for block in order.tolist():
            if block in self._touching:
                self._projection(block)

    def layout(self) -> list[tuple[tuple[int, ...], int, int, int]]:
        """Per front, in the order: its block ``(kind, *S)``, rows, coordinates, columns below."""
        self._absorb()
        blocks = self._table()
        return [
            (
                blocks.keys[block],
                self._fronts[block].factor.shape[0],
                self._fronts[block].directions.shape[1],
                self._fronts[block].columns.size,
            )
            for block in self._order()[0].tolist()
        ]

    def add(self, coordinates: IntArray, values: FloatArray) -> int:
        """A new distinct vector (weight 0 until :meth:`weigh`); returns its index ``j``."""
        self._vectors.append((coordinates, values))
        self.size += 1
        return self.size - 1

    def weigh(self, j: int, weight2: float) -> None:
        """Add ``weight2`` to ``c_j^2`` (a row of vector ``j`` measured with that precision)."""
        self._pending[j] = self._pending.get(j, 0.0) + weight2

    def _table(self) -> _Blocks:
        """The blocks, renumbered if the space has met new ones."""
        if self._blocks.size != self._space.size:
            self._blocks = _Blocks(self._space)
            self._sequence = None
        return self._blocks

    def _absorb(self) -> None:
        """Rotate the pending rows into the fronts, block by block in order."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        blocks = self._table()
        waiting: dict[int, list[Rows]] = {}
        # per block, the largest scale of the blocks that passed rows on to it: their rounding
        carried: dict[int, float] = {}
        for j, weight2 in pending.items():
            coordinates, values = self._vectors[j]
            first = self._first(blocks, coordinates)
            rows = (coordinates, math.sqrt(weight2) * values[None, :])
            waiting.setdefault(first, []).append(rows)
        queue = [(int(blocks.place[b]), b) for b in waiting]
        heapq.heapify(queue)
        while queue:
            _, block = heapq.heappop(queue)
            passed, scale = self._fold(blocks, block, waiting.pop(block), carried.pop(block, 0.0))
            for later, rows in passed:
                if later not in waiting:
                    waiting[later] = []
                    heapq.heappush(queue, (int(blocks.place[later]), later))
                waiting[later].append(rows)
                carried[later] = max(carried.get(later, 0.0), scale)

    @staticmethod
    def _first(blocks: _Blocks, coordinates: IntArray) -> int:
        """The first block, in the order, of some coordinates."""
        weighed = blocks.of(coordinates)
        return int(weighed[np.argmin(blocks.place[weighed])])

    def _fold(
        self, blocks: _Blocks, block: int, incoming: list[Rows], carried: float
    ) -> tuple[list[tuple[int, Rows]], float]:
        """Rotate rows whose first block is ``block`` into its front; the rest, passed on.

        Returns the rows left over the later blocks, grouped by their first block, and the
        block's scale. ``carried``: the scale of the blocks that passed these rows on. Their
        rounding is of that size, not of the rows' own norms: with the block's scale taken
        from those alone, a restart's rows (taken together, each block left with rounding
        of the rows before) made rounding into directions of the later fronts (rank 43
        where the history has 26, biased weights: tests/engine/test_fronts.py).
        """
        columns, rows = _stacked(incoming, blocks.size)
        start, stop = blocks.bounds(block)
        lo, hi = np.searchsorted(columns, (start, stop)).tolist()  # the block's, in between
        if hi - lo == stop - start:  # every coordinate of the block (most rows weigh all)
            here = np.ascontiguousarray(rows[:, lo:hi])
        else:
            here = np.zeros((rows.shape[0], stop - start))
            here[:, columns[lo:hi] - start] = rows[:, lo:hi]
        later_columns = np.concatenate([columns[:lo], columns[hi:]])
        front = self._fronts.get(block)
        norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
        scale = max(front.scale if front is not None else 0.0, float(norms.max()), carried)
        if front is None and rows.shape[0] <= stop - start:
            # a new front over more coordinates than rows (a restart opens most so): the rows
            # by decreasing norm, as _directions takes them; if they are independent they are
            # the front's rows themselves, with no rotation and nothing passed on
            order = _by_decreasing_norm(here)
            here = here[order]
            new, off_along = _directions(here, _RANK * scale, ordered=True)
            if new.shape[0] == rows.shape[0]:
                stack = (later_columns, rows, order)
                self._opened(blocks, block, (new, off_along), stack, (lo, hi), scale)
                return [], scale
            rows, along, directions = rows[order], np.zeros((rows.shape[0], 0)), here[:0]
        elif front is None:
            along, off = np.zeros((rows.shape[0], 0)), here
            directions = here[:0]
            new, off_along = _directions(off, _RANK * scale)
        else:
            directions = front.directions
            along = here @ directions.T
            off = here - along @ directions
            again = off @ directions.T  # twice: off the front to rounding of the part off it
            off -= again @ directions
            along += again
            new, off_along = _directions(off, _RANK * scale)
        k, n = directions.shape[0], directions.shape[0] + new.shape[0]
        if n == 0:  # nothing fixes the block: the rows' parts there are rounding
            later = np.hstack([rows[:, :lo], rows[:, hi:]])
            return _passed_on(blocks, later_columns, later, scale), scale
        top = np.zeros((n, n), order="F")
        # column-major, as LAPACK takes them (else its wrappers copy them in and out); the
        # columns below row-major, rotated from the right as their transposes (below)
        bottom = np.asfortranarray(np.hstack([along, off_along]) if new.size else along)
        if front is None:
            merged, reaches = later_columns, None
            top_below = np.zeros((n, later_columns.size))
        else:
            top[:k, :k] = front.factor
            merged, top_below, reaches = _bordered(front, later_columns, n)
        if merged.size == later_columns.size:  # the rows' own columns: copied by slices
            rows_below = np.empty((rows.shape[0], merged.size))
            rows_below[:, :lo] = rows[:, :lo]
            rows_below[:, lo:] = rows[:, hi:]
        else:
            rows_below = np.zeros((rows.shape[0], merged.size))
            into = np.searchsorted(merged, later_columns)
            rows_below[:, into[:lo]] = rows[:, :lo]
            rows_below[:, into[lo:]] = rows[:, hi:]
        top, reflectors, panels, info = scipy.linalg.lapack.dtpqrt(
            0, min(_PANEL, n), top, bottom, overwrite_a=1
        )
        if info != 0:
            raise np.linalg.LinAlgError(f"dtpqrt failed (LAPACK info {info})")
        if merged.size:
            # [C_T; rows]' = Q^T [C_T; rows], taken as [C_T^T rows^T] Q: a reflector then reads
            # a column of C_T^T (consecutive numbers), not a row of C_T held by columns (one
            # cache line per number): a fresh value's row cost the wide cube's largest front
            # 5.6 ms there, not 8.7
            top_below, rows_below, info = scipy.linalg.lapack.dtpmqrt(
                0,
                reflectors,
                panels,
                top_below.T,
                rows_below.T,
                side="R",
                trans="N",
                overwrite_a=1,
                overwrite_b=1,
            )
            if info != 0:
                raise np.linalg.LinAlgError(f"dtpmqrt failed (LAPACK info {info})")
            top_below, rows_below = top_below.T, rows_below.T
        factor = top  # (dtpqrt leaves its strict lower triangle as given: zeros)
        inverse, info = scipy.linalg.lapack.dtrtri(factor, lower=0)
        if info != 0:
            raise np.linalg.LinAlgError(f"a front's factor is singular (LAPACK info {info})")
        self._fronts[block] = _Front(
            directions=np.vstack([directions, new]) if new.size else directions,
            factor=factor,
            inverse=inverse,
            columns=merged,
            below=top_below,
            reaches=np.unique(blocks.of(merged)) if reaches is None else reaches,
            scale=scale,
        )
        if front is None:
            self._new_front(block)
        elif new.size:
            self._sequence = None
            self._compressed_extended(blocks, block, new, k)
        return _passed_on(blocks, merged, rows_below, scale), scale

    def _opened(
        self,
        blocks: _Blocks,
        block: int,
        found: tuple[FloatArray, FloatArray],
        stack: tuple[IntArray, FloatArray, IntArray],
        cut: tuple[int, int],
        scale: float,
    ) -> None:
        """A new front of independent rows: ``found`` (their directions and parts along them).

        ``stack``: the later columns, the rows (``cut``: where their columns at the block
        start and end) and their order by decreasing norm at the block, in which their parts along
        the directions are lower triangular (the QR of their transpose): in reverse order,
        rows and directions, upper triangular. So the rows are ``[R_T V_T | C_T]`` as they
        are; rotated into an empty front (``dtpqrt``, ``dtpmqrt``) instead, their rest was
        rounding over every later column.
        """
        directions, along = found
        columns, rows, order = stack
        lo, hi = cut
        reverse = order[::-1]
        below = np.empty((rows.shape[0], columns.size))
        below[:, :lo] = rows[reverse, :lo]
        below[:, lo:] = rows[reverse, hi:]
        factor = np.asfortranarray(along[::-1, ::-1])
        inverse, info = scipy.linalg.lapack.dtrtri(factor, lower=0)
        if info != 0:
            raise np.linalg.LinAlgError(f"a front's factor is singular (LAPACK info {info})")
        self._fronts[block] = _Front(
            directions=np.ascontiguousarray(directions[::-1]),
            factor=factor,
            inverse=inverse,
            columns=columns,
            below=below,
            reaches=np.unique(blocks.of(columns)),
            scale=scale,
        )
        self._new_front(block)

    def _new_front(self, block: int) -> None:
        """Forget what a new front changes: the order, the products of fronts reaching it."""
        self._sequence = None
        # C_T in the directions: one more. The kept products' fronts looked up at once: one
        # test per front cost a new front of the wide cube 1.7 ms, a restart (nothing kept yet,
        # 169 new fronts) 0.1 s
        kept = list(self._compressed)
        if not kept:
            return
        reaches = [self._fronts[earlier].reaches for earlier in kept]
        reaching = np.concatenate(reaches) == block
        if reaching.any():
            owners = np.repeat(np.arange(len(kept)), [r.size for r in reaches])
            for at in np.unique(owners[reaching]).tolist():
                del self._compressed[kept[at]]

    def _order(self) -> tuple[IntArray, IntArray]:
        """The blocks with fronts, in the order (highest order first); each block's rank."""
        blocks = self._table()
        if self._sequence is None or self._ranks is None:
            held = np.fromiter(self._fronts, dtype=np.int64, count=len(self._fronts))
            self._sequence = held[np.argsort(blocks.place[held])]
            self._ranks = np.zeros(blocks.place.size, dtype=np.int64)
            for block, front in self._fronts.items():
                self._ranks[block] = front.factor.shape[0]
        return self._sequence, self._ranks

    def solve_many(self, queries: Sequence[Rows]) -> tuple[list[FloatArray | None], list[float]]:
        """Per query, ``u_j / c_j`` for every vector ``j`` and ``||q - proj q|| / ||q||``.

        Queries farther than ``residual`` from the span get ``None``; the distance of a
        query outside the span is bounded from above (see the module's docstring), and once
        every query of the batch is past ``residual`` the rest of the bound is not summed
        (the distance given is then only past ``residual``).
        """
        if not queries:
            return [], []
        self._absorb()
        blocks = self._table()
        work, norms = _columns(blocks, queries)
        fitted, unfitted = self._forward(blocks, work, queries, norms)
        residuals = np.sqrt(unfitted) / norms
        inside = residuals <= self._residual
        found: list[FloatArray | None] = [None] * len(queries)
        if np.any(inside) and fitted:
            along = self._back(blocks, {b: w[:, inside] for b, w in fitted.items()})
            values = self._values(blocks, along, int(inside.sum()))
            for column, i in enumerate(np.flatnonzero(inside).tolist()):
                found[i] = values[:, column]
        return found, residuals.tolist()

    def _forward(
        self,
        blocks: _Blocks,
        work: FloatArray,
        queries: Sequence[Rows],
        norms: FloatArray | None,
    ) -> tuple[dict[int, FloatArray], FloatArray]:
        """``w`` with ``R^T w = q`` per front reached, and the squares left unfitted.

        ``work``: the queries over the coordinates, as columns; taken (it ends as the part of
        the queries no front fits: at a front's block, the part off its directions, which
        :meth:`solve_batch` keeps; forming it again there took 2 ms of the wide cube's first
        GROUP BY). The squares only grow: at the queries' own blocks (where
        a new vector's part is not fitted), once every query is past ``residual`` of its
        ``norms`` the later blocks are not visited (``None``: every block reached is, for a
        batch whose far queries are solved again as values are measured).
        """
        fitted: dict[int, FloatArray] = {}
        unfitted = np.zeros(work.shape[1])
        met = np.unique(blocks.of(np.concatenate([c for c, _ in queries])))
        seen = np.zeros(blocks.place.size, dtype=bool)
        seen[met] = True
        own = set(met.tolist())
        queue = list(zip(blocks.place[met].tolist(), met.tolist()))
        heapq.heapify(queue)
        while queue:
            _, block = heapq.heappop(queue)
            start, stop = blocks.bounds(block)
            part = work[start:stop]
            front = self._fronts.get(block)
            if front is None:
                unfitted += np.einsum("ij,ij->j", part, part)
            else:
                along = front.directions @ part
                part -= front.directions.T @ along  # (a view: work's part off the front)
                unfitted += np.einsum("ij,ij->j", part, part)
            if (
                norms is not None
                and block in own
                and np.all(np.sqrt(unfitted) / norms > self._residual)
            ):
                break  # (the test solve_many makes: the same numbers, so the same answer)
            if front is None:
                continue
            w = front.inverse.T @ along
            fitted[block] = w
            if front.columns.size:
                # a later block's coordinates are consecutive, so are the columns there: a
                # few slices (7 runs per front on the wide cube) taken in place; gathered and
                # scattered instead, its 20-group GROUP BY's substitution took 6.9 ms, not 5.9
                product = front.below.T @ w
                for first, last, start in self._column_runs(block, front):
                    work[start : start + last - first] -= product[first:last]
                fresh = front.reaches[~seen[front.reaches]]
                seen[fresh] = True
                for later in fresh.tolist():
                    heapq.heappush(queue, (int(blocks.place[later]), later))
        return fitted, unfitted

    def _column_runs(self, block: int, front: _Front) -> list[tuple[int, int, int]]:
        """The runs of consecutive coordinates among the front's columns: (first, last, start).

        ``front.columns[first:last]`` are ``start, start + 1, ...``. Kept with the columns
        (a front replaced over the same columns shares them; holding the front would keep
        a replaced one's ``C_T``).
        """
        columns = front.columns
        known = self._runs_of_columns.get(block)
        if known is not None and known[0] is columns:
            return known[1]
        cuts = (np.flatnonzero(np.diff(columns) != 1) + 1).tolist()
        firsts = [0, *cuts]
        runs = list(zip(firsts, [*cuts, columns.size], columns[firsts].tolist()))
        self._runs_of_columns[block] = (columns, runs)
        return runs

    def _back(self, blocks: _Blocks, fitted: dict[int, FloatArray]) -> dict[int, FloatArray]:
        """``y_T`` per front, with ``z_T = V_T^T y_T`` solving ``R z = w`` (``w``: per front).

        Last block first; a front that ``w`` misses and whose later blocks ``z`` has not
        reached gives ``z`` nothing. ``z`` is never formed over the coordinates: a front's
        ``R_T^{-1} C_T z`` is read as ``R_T^{-1} C_T``'s columns in the later fronts' directions
        times their ``y`` (:meth:`_compressed_below`), a few times fewer numbers than ``C_T``;
        ``R_T^{-1}`` itself only for the fronts ``w`` reaches (few: the query's blocks').
        A solve visits every front (most reach the grand mean's block), so each costs little:
        those columns are kept negated, and ``y_T`` is one product written in place (then
        ``R_T^{-1} w_T`` added where ``w`` reaches), by ``np.dot`` (``np.matmul`` costs twice
        its overhead on a small matrix); a single query's ``y`` is a vector, not a column. The
        wide cube's single values took 2.0 ms in it rather than 2.6.

        ``y`` holds the fronts' ``y_T`` one after another in the order (:meth:`_rows_of_y`),
        not in the first rows of each block's coordinates: over every coordinate (most rows
        never written; 10 MB for 20 columns on the wide cube, rank 4,645 of 63,228) the
        substitutions of its history GROUP BYs of 20-70 groups took 8-17% longer.
        """
        order, ranks = self._order()
        count = next(iter(fitted.values())).shape[1]
        if count == 1:
            fitted = {block: w[:, 0] for block, w in fitted.items()}
        firsts, rows, gathers = self._rows_of_y(blocks)
        size = int(ranks.sum())
        y = np.zeros(size if count == 1 else (size, count))
        reached = 0  # the fronts given a y so far, as bits
        along: dict[int, FloatArray] = {}
        fronts, known = self._fronts, self._compressed
        backwards = order[::-1]
        for block, start in zip(backwards.tolist(), firsts[backwards].tolist()):
            front = fronts[block]
            below_of = known.get(block)
            if below_of is not None and below_of[0] is front:  # (_compressed_below's, kept)
                _, negated, positions, reads = below_of
            else:
                negated, positions, reads = self._compressed_below(blocks, block, ranks)
            w = fitted.get(block)
            part = y[start : start + front.factor.shape[0]]
            if reached & reads:
                gather = gathers.get(block)
                if gather is None or gather[0] is not positions:
                    gather = gathers[block] = (positions, rows[positions])
                # -R_T^{-1} C_T z; the rows read by take, not indexing: the same copy, 2.6
                # times faster with 20 columns (1.5 with one)
                np.dot(negated, y.take(gather[1], axis=0), out=part)
                if w is not None:
                    part += front.inverse @ w
            elif w is None:
                continue
            else:
                np.dot(front.inverse, w, out=part)
            along[block] = part
            reached |= 1 << block
        return along

    def _rows_of_y(
        self, blocks: _Blocks
    ) -> tuple[IntArray, IntArray, dict[int, tuple[IntArray, IntArray]]]:
        """Where :meth:`_back`'s ``y`` holds each front's ``y_T``: its first row, by block.

        Also the row of each of the first coordinates of a block with a front (the rows
        :meth:`_compressed_below` gives are those), and per front the rows of ``y`` it reads
        (filled as solves read them). Kept with the sequence (made again when a front comes or
        gains directions; a front replaced at the same rank reads its new rows).
        """
        sequence, ranks = self._order()
        kept = self._y_rows
        if kept is not None and kept[0] is sequence:
            return kept[1], kept[2], kept[3]
        counts = ranks[sequence]
        firsts = np.zeros(ranks.size, dtype=np.int64)
        firsts[sequence] = np.cumsum(counts) - counts
        rows = np.zeros(blocks.size, dtype=np.int64)
        rows[_runs(blocks.starts[sequence], counts)] = np.arange(int(counts.sum()))
        gathers: dict[int, tuple[IntArray, IntArray]] = {}
        self._y_rows = (sequence, firsts, rows, gathers)
        return firsts, rows, gathers

    def _compressed_below(
        self, blocks: _Blocks, block: int, ranks: IntArray
    ) -> tuple[FloatArray, IntArray, int]:
        """``-R_T^{-1} C_T [V_S^T]_S`` over the later fronts ``S`` it reaches, where ``y_S`` lie.

        And those fronts' blocks as bits (``1 << S``). (Negated: :meth:`_back` reads it so.)

        ``C_T z = sum_S C_T[S] V_S^T y_S`` exactly (``z`` is zero in blocks without a front).
        With ``R_T^{-1}`` taken in, a back substitution reads one matrix per front, not also
        ``R_T^{-1}`` (0.49 M numbers of the wide cube's 2.1 M, at rank 4,645). Kept until
        the front changes (or a later block gets a front: :meth:`_fold` drops it then); a later
        front's new directions extend it (:meth:`_compressed_extended`).
        """
        front = self._fronts[block]
        known = self._compressed.get(block)
        if known is not None and known[0] is front:
            return known[1], known[2], known[3]
        reached = ranks[front.reaches]
        held = reached > 0
        later_fronts, starts = front.reaches[held], blocks.starts[front.reaches[held]]
        counts = reached[held]
        # a block's coordinates are consecutive: so are its columns among the front's
        cuts = np.searchsorted(front.columns, np.stack([starts, blocks.starts[later_fronts + 1]]))
        pieces = [
            front.below[:, first:last]
            @ _at(self._fronts[later].directions, front.columns[first:last], start).T
            for later, start, first, last in zip(
                later_fronts.tolist(), starts.tolist(), cuts[0].tolist(), cuts[1].tolist()
            )
        ]
        k = front.factor.shape[0]
        reduced = front.inverse @ np.hstack(pieces) if pieces else np.zeros((k, 0))
        np.negative(reduced, out=reduced)
        where = _runs(starts, counts)  # (y_S's rows: each front's first coordinates)
        reads = sum(1 << b for b in later_fronts.tolist())
        self._compressed[block] = (front, reduced, where, reads)
        return reduced, where, reads

    def _compressed_extended(self, blocks: _Blocks, block: int, new: FloatArray, rank: int) -> None:
        """The kept :meth:`_compressed_below` that read ``block``, given its new directions.

        ``R_T^{-1} C_T [V_S^T]_S`` for an earlier front ``T`` gains the columns
        ``-R_T^{-1} C_T[S] new^T``, where ``y_S`` gains rows (after the ``rank`` before): its
        other columns are unchanged, as the fronts they read. Rebuilt instead, the products of
        most fronts (those reaching the grand mean's block) were made again after a wide
        cube's measuring GROUP BY: half of the time taking its rows in.
        """
        bit = 1 << block
        start, stop = blocks.bounds(block)
        where = np.arange(start + rank, start + rank + new.shape[0])
        for earlier, (front, reduced, positions, reads) in list(self._compressed.items()):
            if not reads & bit or self._fronts.get(earlier) is not front:
                continue  # (one no longer kept: its front was replaced since)
            first, last = np.searchsorted(front.columns, (start, stop)).tolist()
            part = front.below[:, first:last] @ _at(new, front.columns[first:last], start).T
            self._compressed[earlier] = (
                front,
                np.hstack([reduced, -(front.inverse @ part)]),
                np.concatenate([positions, where]),
                reads,
            )

    def _values(self, blocks: _Blocks, along: dict[int, FloatArray], count: int) -> FloatArray:
        """``h_j^T z`` for every vector ``j`` (rows): ``sum_T (V_T h_j[T])^T y_T``.

        ``along``: :meth:`_back`'s (vectors ``y_T`` for a single query).
        """
        self._split_vectors(blocks)
        spread, rows = self._class_rows()
        # h_c^T z per class (zero: no front)
        classes = np.zeros(spread.shape[1] if count == 1 else (spread.shape[1], count))
        for block, y in along.items():
            found = rows.get(block)
            if found is not None:
                at, projection = found
                np.dot(projection, y, out=classes[at : at + projection.shape[0]])
        values: FloatArray = spread @ classes
        return values.reshape(values.shape[0], count)

    def _class_rows(self) -> tuple[sparse.csr_array, dict[int, tuple[int, FloatArray]]]:
        """:meth:`_classes_matrix`; per block with a front, its classes' first and rows there.

        The rows along the front's directions (:meth:`_projection`). Kept while no vector is
        split and no front gains a direction (its sequence is made again then): a solve reads
        every front's, and looking each up again cost the wide cube's solves 0.4 ms of 4. Then
        only the blocks whose rank, vectors or columns changed are looked up again (all of
        them cost the wide cube's solve after a fresh value 0.5-1 ms).
        """
        by_class = self._classes_matrix()
        sequence, ranks = self._order()
        kept = self._rows_of_classes
        if kept is not None and kept[0] is sequence and kept[1] is by_class:
            return by_class.matrix, kept[2]
        offsets = by_class.offsets
        if kept is None:
            rows, changed = {}, list(offsets)
        else:
            _, before, known, known_ranks = kept
            rows = dict(known)
            ranked = np.flatnonzero(ranks[: known_ranks.size] != known_ranks).tolist()
            ranked += range(known_ranks.size, ranks.size)  # (blocks the space met since)
            changed = ranked + [
                block
                for block, at in offsets.items()
                if at != before.offsets.get(block)
                or by_class.lengths[block] != before.lengths.get(block)
            ]
        for block in changed:
            if block in self._fronts and block in offsets:
                rows[block] = (offsets[block], self._projection(block))
        self._rows_of_classes = (sequence, by_class, rows, ranks)
        return by_class.matrix, rows

    def _classes_matrix(self) -> _Spreading:
        """Each vector's factor over each class of its parts, and where a block's classes start.

        The vectors' values are this matrix times the classes' (one product rather than a
        gather per block). Vectors split since are rows added to it; a block's classes have
        room to grow into (a quarter more, and 8), and a block new or outgrowing its room is
        given columns after the others (its entries moved there). Made again instead, the
        matrix cost the wide cube's next solve 2.5-5 ms (a GROUP BY's new classes outgrow
        rooms), and scipy's conversions of a fresh vector's few entries 0.7 ms. The columns a
        block leaves stay empty: each room is a quarter larger than the one it left, so they
        are at most four times the rooms. A row's entries are in the order of the blocks
        (``_touching``'s), wherever their columns lie: its sum is rounded alike however the
        columns moved.
        """
        kept = self._by_class
        if kept is not None and kept.vectors == self._split:
            return kept
        touching = self._touching
        offsets: dict[int, int] = {}
        rooms: dict[int, int] = {}
        lengths: dict[int, int] = {}
        total, first, matrix = 0, 0, None
        if kept is not None:
            offsets, rooms, lengths = dict(kept.offsets), dict(kept.rooms), kept.lengths
            total, first, matrix = kept.matrix.shape[1], kept.vectors, kept.matrix
        moved = []  # (a block's first column before, its columns before, by how many moved)
        for block, t in touching.items():
            room = rooms.get(block)
            if room is None or t.count > room:
                if room is not None:
                    moved.append((offsets[block], room, total - offsets[block]))
                offsets[block], rooms[block] = total, t.count + t.count // 4 + 8
                total += rooms[block]
        vectors, columns = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
        factors = [np.zeros(0)]
        for block, t in touching.items():
            known = lengths.get(block, 0)
            if known < t.vectors.size:  # (a few blocks: the new vectors')
                vectors.append(t.vectors[known:] - first)
                columns.append(t.classes[known:] + offsets[block])
                factors.append(t.factors[known:])
        of_entry = np.concatenate(vectors)
        by_vector = np.argsort(of_entry, kind="stable")  # each vector's in the blocks' order
        indptr = np.zeros(self._split - first + 1, dtype=np.int64)
        np.cumsum(np.bincount(of_entry, minlength=self._split - first), out=indptr[1:])
        data, indices = np.concatenate(factors)[by_vector], np.concatenate(columns)[by_vector]
        if matrix is not None:  # (the new vectors' rows after the others')
            before = matrix.indices.astype(np.int64)  # (a copy: copies share the matrix)
            for start, width, shift in moved:
                before[(before >= start) & (before < start + width)] += shift
            data = np.concatenate([matrix.data, data])
            indices = np.concatenate([before, indices])
            indptr = np.concatenate([matrix.indptr, indptr[1:] + matrix.indptr[-1]])
        self._by_class = _Spreading(
            sparse.csr_array((data, indices, indptr), shape=(self._split, total)),
            offsets,
            rooms,
            {b: t.vectors.size for b, t in touching.items()},
            self._split,
        )
        return self._by_class

    def _projection(self, block: int) -> FloatArray:
        """The rows of block ``T``'s classes along its front's directions, extended as needed.

        A front's directions are only ever added to, and classes too: the rows and columns
        found before are kept (in a :class:`_Room`, so that a new class or direction costs
        its own products, not a copy of the others).
        """
        touching = self._touching[block]
        shape = (touching.count, self._fronts[block].directions.shape[0])
        known = self._projected.get(block)
        if known is not None and known[1] == shape:
            return known[2]
        rows = touching.rows.view(touching.count, touching.rows.data.shape[1])
        directions = self._fronts[block].directions
        if known is None:
            room = _Room(rows @ directions.T)
        else:
            room, (m, k), _ = known
            room = room.grown((m, k), shape)
            room.data[:m, k : shape[1]] = rows[:m] @ directions[k:].T
            room.data[m : shape[0], : shape[1]] = rows[m:] @ directions.T
        view = room.view(*shape)
        self._projected[block] = (room, shape, view)
        return view

    def _split_vectors(self, blocks: _Blocks) -> None:
        """Add the vectors since the last split to the blocks they weigh.

        Vector by vector, block by block: a restart's 6,000 vectors hold 8.9 million
        coordinates, which gathered at once took ~300 MB and a second.
        """
        if self._split == self.size:
            return
        new = self._vectors[self._split :]
        # a vector's coordinates increase, so do their blocks: its part in a block is a run,
        # from its edge there to the next block's
        edges = np.empty((len(new), blocks.starts.size), dtype=np.int64)
        for at, (coordinates, _) in enumerate(new):
            edges[at] = np.searchsorted(coordinates, blocks.starts)
        run_blocks, run_vectors = np.nonzero(np.diff(edges, axis=1).T)  # by block, then vector
        cuts = np.flatnonzero(np.diff(run_blocks)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), run_blocks.size]):
            block = int(run_blocks[lo])
            start, stop = blocks.bounds(block)
            found = run_vectors[lo:hi]
            parts = np.zeros((hi - lo, stop - start))
            firsts, lasts = edges[found, block].tolist(), edges[found, block + 1].tolist()
            for row, (vector, first, last) in enumerate(zip(found.tolist(), firsts, lasts)):
                coordinates, values = new[vector]
                if last - first == stop - start:  # the whole block, in order
                    parts[row] = values[first:last]
                else:
                    parts[row, coordinates[first:last] - start] = values[first:last]
            known = self._touching.get(block)
            self._touching[block] = _classed(known, found + self._split, parts)
        self._split = self.size

    def solve_batch(
        self, queries: Sequence[Rows]
    ) -> tuple[list[FloatArray | None], list[float], BatchUpdates]:
        """:meth:`solve_many`, keeping what corrects the batch's later solves.

        In the coordinates ``w`` of the forward substitution (``R^T w = q``) the span's ``K``
        is the identity: ``A^T A = R^T R``, so ``t = y = w`` and ``h_j^T z = w_j^T w``, and a
        measured value's row adds a rank-one term there (:class:`BatchUpdates`, each later
        solve corrected in ``O(vectors)``). What no front fits, ``q - R^T w`` (the parts off
        the fronts, block by block), stands for the remainder from the span: not orthogonal
        to it, but the forward substitution is linear, vanishes on the span and leaves those
        parts as they are, so a vector is in the span grown by fresh vectors iff its part off
        the fronts is in the span of theirs, and its coordinates there are the same: the
        values are the copy's (the minimum-norm solution is unique), to rounding. The
        relative size of that part decides whether a fresh vector joins the span (a new
        direction in some front of the copy) past ``residual``, or is in it within
        ``_RANK``; in between the copy decides. The far queries' values are found when needed
        (a fresh measurement may bring them into the span): most never are.
        """
        self._absorb()
        blocks = self._table()
        count = len(queries)
        work, norms = _columns(blocks, queries)
        fitted, unfitted = self._forward(blocks, work, queries, None)
        residuals = np.sqrt(unfitted) / norms
        # the blocks the substitution met (the queries', the fitted fronts' below): the rest
        # of the coordinates hold nothing of any query, nor of a combination of them
        # (a query's coordinates increase: the blocks it weighs are where its runs lie, found
        # against the blocks' starts; a sort of the batch's coordinates cost a wide cube's
        # 378 groups of 10,000 a third of a second)
        reached = np.zeros(blocks.place.size, dtype=bool)
        for coordinates, _ in queries:
            reached |= np.diff(np.searchsorted(coordinates, blocks.starts)) > 0
        for block in fitted:
            reached[self._fronts[block].reaches] = True
        held = np.flatnonzero(reached)
        bounds = np.stack([blocks.starts[held], blocks.starts[held + 1]]).T.tolist()
        rows = np.concatenate([np.arange(start, stop) for start, stop in bounds])
        remainders = work.take(rows, axis=0)  # (take: the copy indexing makes, faster)
        # the batch's coordinates t = y = w are the fitted fronts' alone: the others' are zero
        # for every query, and stay so as values are measured (corrections combine them)
        positions, end = [], 0
        for block in self._order()[0].tolist():
            w = fitted.get(block)
            if w is not None:
                positions.append((block, end, end + w.shape[0]))
                end += w.shape[0]
        target = np.zeros((end, count))
        for block, start, stop in positions:
            target[start:stop] = fitted[block]

        def values_of(w: FloatArray) -> FloatArray:
            """The values of queries of coordinates ``w`` (columns; ``y = w``)."""
            if not positions:  # no front fits any query of the batch: nor a combination
                return np.zeros((self.size, w.shape[1]))
            along = self._back(blocks, {b: w[start:stop] for b, start, stop in positions})
            return self._values(blocks, along, w.shape[1])

        values = np.zeros((self.size, count), order="F")  # (BatchUpdates' layout)
        inside = residuals <= self._residual
        if fitted and np.any(inside):
            values[:, inside] = values_of(target[:, inside])
        found: list[FloatArray | None] = [  # (copies: the corrections change values)
            values[:, i].copy() if inside[i] else None for i in range(count)
        ]
        updates = BatchUpdates(
            target,
            target.copy(),
            values,
            np.negative(remainders, out=remainders),
            norms,
            residual=self._residual,
            values_of=values_of,
            outside=None if not fitted or np.all(inside) else (~inside, np.copy),
            joins=(self._residual, _RANK),
        )
        return found, residuals.tolist(), updates


def _columns(blocks: _Blocks, queries: Sequence[Rows]) -> tuple[FloatArray, FloatArray]:
    """The queries over the blocks' coordinates, as columns (a solve takes them), and norms."""
    work = np.zeros((blocks.size, len(queries)))
    for i, (coordinates, values) in enumerate(queries):
        work[coordinates, i] = values
    return work, np.sqrt(np.array([values @ values for _, values in queries]))


def _runs(starts: IntArray, counts: IntArray) -> IntArray:
    """``start, start + 1, ..., start + count - 1`` for each, one after another.

    (One ``np.arange`` per front: 0.29 ms for the wide cube's 173 fronts, this 0.06.)
    """
    ends = np.cumsum(counts)
    out: IntArray = np.repeat(starts - (ends - counts), counts) + np.arange(
        int(ends[-1]) if ends.size else 0
    )
    return out


def _at(rows: FloatArray, columns: IntArray, start: int) -> FloatArray:
    """A later front's ``rows`` (over its block, from coordinate ``start``) at ``columns``.

    As they are when ``columns`` are all of the block's (increasing, distinct), as most often
    (rows weigh whole blocks): the copies gathers made cost forming the wide cube's products
    (:meth:`BlockFronts._compressed_below`) a fifth of its time.
    """
    return rows if columns.size == rows.shape[1] else rows[:, columns - start]


def _classed(known: _Touching | None, vectors: IntArray, parts: FloatArray) -> _Touching:
    """``known`` with ``vectors`` added: each one's part (a row of ``parts``) in a class.

    A part is its entry of largest magnitude times its row over that entry; rows that round
    alike to 9 decimals (found by a hash of that) and agree to 1e-13 (rounding: proportional
    parts are one row times different factors) are one class.
    """
    pivots = np.argmax(np.abs(parts), axis=1)
    factors = parts[np.arange(parts.shape[0]), pivots]
    normal = parts / factors[:, None]
    rounded = np.ascontiguousarray(np.round(normal, 9) + 0.0)  # (-0.0 as 0.0)
    width = parts.shape[1]
    keys = dict(known.keys) if known is not None else {}
    count = known.count if known is not None else 0
    classes = np.empty(parts.shape[0], dtype=np.int64)
    firsts: list[int] = []  # the rows that start new classes
    for i, key in enumerate(hash(row.tobytes()) for row in rounded):
        found = keys.get(key)
        if found is None:
            found = keys[key] = count + len(firsts)
            firsts.append(i)
        classes[i] = found
    room = known.rows if known is not None else _Room(np.empty((0, width)))
    room = room.grown((count, width), (count + len(firsts), width))
    np.take(normal, firsts, axis=0, out=room.data[count : count + len(firsts)])
    total = count + len(firsts)
    # a row that rounds as its class's but is farther from it: a class of its own (in place:
    # a restart's parts are 73,000 rows)
    gap = room.data[classes]
    np.abs(np.subtract(normal, gap, out=gap), out=gap)
    far = np.flatnonzero(gap.max(axis=1) > 1e-13)
    if far.size:
        room = room.grown((total, width), (total + far.size, width))
        room.data[total : total + far.size] = normal[far]
        classes[far] = np.arange(total, total + far.size)
        total += far.size
    if known is not None:
        vectors = np.concatenate([known.vectors, vectors])
        classes = np.concatenate([known.classes, classes])
        factors = np.concatenate([known.factors, factors])
    return _Touching(vectors, classes, factors, room, total, keys)


def _class_keys(rows: FloatArray) -> dict[int, int]:
    """The keys :func:`_classed` made for classes whose rows are ``rows`` (normal, in order).

    A class is keyed by its row rounded unless an earlier class has that key (one far from
    it: a class of its own); the hash of bytes is the process's own, so a restored solver
    keys its classes again.
    """
    keys: dict[int, int] = {}
    rounded = np.ascontiguousarray(np.round(rows, 9) + 0.0)
    for at, row in enumerate(rounded):
        keys.setdefault(hash(row.tobytes()), at)
    return keys


def _directions(
    off: FloatArray, threshold: float, *, ordered: bool = False
) -> tuple[FloatArray, FloatArray]:
    """Orthonormal directions of the rows ``off`` past ``threshold`` (singular values).

    And ``off`` along them. Both from a triangle of the smaller side: with fewer rows than
    coordinates, ``off = L Q^T`` (the QR of ``off^T``), whose directions are ``L``'s carried
    by ``Q^T``; else ``off^T off = R^T R``, whose directions are ``R``'s. Rows independent
    past ``threshold`` keep ``Q^T`` and ``L`` (or, as many as the coordinates, those) without
    an SVD. An SVD of ``off`` itself formed its left vectors too: a restart opens every
    block so, 0.75 s of the wide cube's 4.6 s. ``ordered``: the rows are by decreasing norm
    already, and ``off``'s lower triangle ``L`` is returned as it is (not as ``L`` with its
    rows back in the order given) when they are independent.
    """
    rows, width = off.shape
    if rows == 1:  # a single row's singular value is its norm
        norm = float(np.linalg.norm(off))
        return (off / norm, np.array([[norm]])) if norm > threshold else (off[:0], off[:, :0])
    if np.linalg.norm(off) <= threshold / 2:
        # no singular value is past the rows' norm (Frobenius), nor, with the rounding of a
        # factorization of them, past twice it: rows in the span to rounding (history
        # vectors measured again: a tightening GROUP BY's, a QR and two SVDs per fold) give
        # none
        return off[:0], off[:, :0]
    if rows <= width:
        # the rows by decreasing norm (_by_decreasing_norm), unless they are already
        if ordered:
            q, upper = scipy.linalg.qr(off.T, mode="economic", check_finite=False)
            triangle = upper.T
        else:
            order = _by_decreasing_norm(off)
            q, upper = scipy.linalg.qr(off[order].T, mode="economic", check_finite=False)
            triangle = np.empty_like(upper.T)  # L, its rows back in the order given
            triangle[order] = upper.T
    else:
        triangle = np.linalg.qr(off, mode="r")
    if np.linalg.svd(triangle, compute_uv=False)[-1] > threshold:  # all of them independent
        return (q.T, triangle) if rows <= width else (np.eye(width), off)
    try:
        left, singular, right = np.linalg.svd(triangle)
    except np.linalg.LinAlgError:  # (LAPACK's divide and conquer fails on some triangles)
        left, singular, right = scipy.linalg.svd(triangle, lapack_driver="gesvd")
    kept = singular > threshold
    if rows <= width:  # off = L Q^T = U S (Q W)^T
        return right[kept] @ q.T, left[:, kept] * singular[kept]
    directions = right[kept]
    return directions, off @ directions.T


def _by_decreasing_norm(rows: FloatArray) -> IntArray:
    """The rows' order by decreasing norm (ties as given), in which a block takes them.

    So that the first directions are the largest rows': in the order given, rows of precisions
    1e6 apart solved 1.5e-6 off the copy's solve after the front's rotation
    (tests/engine/test_batch_updates.py, seed 8).
    """
    order: IntArray = np.argsort(-np.einsum("ij,ij->i", rows, rows), kind="stable")
    return order


def _bordered(
    front: _Front, columns: IntArray, n: int
) -> tuple[IntArray, FloatArray, IntArray | None]:
    """The front's columns below joined by ``columns``; its ``C_T`` over them with ``n`` rows.

    Also the blocks they reach when those are the front's (None: to be found).
    """
    k = front.factor.shape[0]
    at = np.searchsorted(front.columns, columns)
    if np.all(at < front.columns.size) and np.array_equal(
        front.columns[at % max(1, front.columns.size)], columns
    ):
        below = np.empty((n, front.columns.size))
        below[:k] = front.below
        below[k:] = 0.0
        return front.columns, below, front.reaches
    merged = np.union1d(front.columns, columns)
    below = np.zeros((n, merged.size))
    below[:k, np.searchsorted(merged, front.columns)] = front.below
    return merged, below, None


def _stacked(incoming: list[Rows], size: int) -> Rows:
    """Rows over different coordinates (below ``size``), stacked over the union of them.

    The union is marked over the coordinates rather than sorted: a restart's block can take
    hundreds of vectors of a thousand coordinates each. Their columns there are a few runs
    (the blocks they weigh), copied as slices: scattered one by one, they cost a restart
    a third of a second.
    """
    if len(incoming) == 1:
        return incoming[0]
    weighed = np.zeros(size, dtype=bool)
    for c, _ in incoming:
        weighed[c] = True
    columns = np.flatnonzero(weighed)
    position = np.zeros(size, dtype=np.int64)
    position[columns] = np.arange(columns.size)
    rows = np.zeros((sum(r.shape[0] for _, r in incoming), columns.size))
    first = 0
    for c, r in incoming:
        at, last = position[c], first + r.shape[0]
        cuts = (np.flatnonzero(np.diff(at) != 1) + 1).tolist()
        if len(cuts) < _RUNS:
            for lo, hi in zip([0, *cuts], [*cuts, at.size]):
                begin = int(at[lo])
                rows[first:last, begin : begin + hi - lo] = r[:, lo:hi]
        else:
            rows[first:last, at] = r
        first = last
    return columns, rows


def _passed_on(
    blocks: _Blocks, columns: IntArray, rows: FloatArray, scale: float
) -> list[tuple[int, Rows]]:
    """Rows left over later blocks, rounding dropped, grouped by their first block.

    ``rows`` is taken: its rounding is set to zero in place (one pass over the rows, whose
    mask of what is left also tells which blocks and columns they weigh). A single row (a
    fresh value's, passed from front to front) goes to one block, its rounding dropped with
    its columns: grouping it as many rows cost each of its folds 0.1 ms.
    """
    if not columns.size:
        return []
    if rows.shape[0] == 1:
        left = np.abs(rows[0]) > _ZERO * scale
        if left.all():
            return [(BlockFronts._first(blocks, columns), (columns, rows))]
        if not left.any():
            return []
        kept = columns[left]
        return [(BlockFronts._first(blocks, kept), (kept, rows[:, left]))]
    if rows.shape[0] > 2 * columns.size:
        rows = _fewer(blocks, columns, rows)
    left = np.abs(rows) > _ZERO * scale
    np.copyto(rows, 0.0, where=~left)
    # a block's columns are consecutive: which blocks each row weighs, then the first in order
    owners = blocks.of(columns)
    starts = np.flatnonzero(np.diff(owners, prepend=-1))
    weighs = np.logical_or.reduceat(left, starts, axis=1)
    by_place = np.argsort(blocks.place[owners[starts]])
    weighs = weighs[:, by_place]
    first = np.argmax(weighs, axis=1)  # a row of zeros (absorbed) goes nowhere
    going = np.flatnonzero(weighs[np.arange(rows.shape[0]), first])
    if not going.size:
        return []
    order = going[np.argsort(first[going], kind="stable")]  # rows kept in order per block
    first = first[order]
    cuts = np.flatnonzero(np.diff(first)) + 1
    out = []
    for begin, end in zip([0, *cuts.tolist()], [*cuts.tolist(), order.size]):
        # most often every row goes on to one block, over every column: then not copied
        every = end - begin == rows.shape[0]
        group = rows if every else rows[order[begin:end]]
        kept = np.any(left if every else left[order[begin:end]], axis=0)
        block = int(owners[starts[by_place[first[begin]]]])
        out.append((block, (columns, group) if kept.all() else (columns[kept], group[:, kept])))
    return out


def _fewer(blocks: _Blocks, columns: IntArray, rows: FloatArray) -> FloatArray:
    """Rows with the same ``rows^T rows`` over ``columns``, as many as the columns.

    The triangle of their QR, the columns taken in the blocks' order: each row starts at a
    later block than the one before, so the rows that a block passes on, more than the
    coordinates they weigh (a restart's: thousands over hundreds), visit fewer blocks.
    """
    order = np.argsort(blocks.place[blocks.of(columns)], kind="stable")
    (triangle,) = scipy.linalg.qr(rows[:, order], mode="r", overwrite_a=True, check_finite=False)
    fewer: FloatArray = np.empty_like(triangle)
    fewer[:, order] = triangle
    return fewer
