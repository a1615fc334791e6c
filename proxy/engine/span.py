"""Minimum-norm combinations of the history's distinct vectors, solved in the space they span.

The BLUE of a query ``q`` (:mod:`proxy.engine.estimator`) is the minimum-norm ``u`` with
``sum_j u_j c_j h_j = q``, over the distinct history vectors ``h_j`` weighed by their pooled
precisions ``c_j``. That problem depends on the vectors only through inner products, so it is
solved in their span, whose dimension ``r`` (the rank of the history) stays small however many
cells the vectors cover or how often they are measured:

- a *basis*: the vectors, in order of arrival, that are not in the span of the earlier ones
  (their squared distance from it exceeds ``_INDEPENDENT`` of their squared norm: far above the
  rounding of the Gram route, far below the distance of any genuinely new direction of lattice
  weights; a vector within it of the span is taken as in it, and a query equal to it is still
  answered from its own rows as a repeat).
  Their Gram matrix ``G = H_B^T H_B`` over cells is kept with its Cholesky factor ``L`` and
  ``L^{-1}``, all bordered by one row per new basis vector (inner products of lattice weights
  are exact in floating point);
- *coordinates*: ``h_j = H_B beta_j``, with ``beta_j = e_j`` for a basis vector and
  ``G^{-1} H_B^T h_j`` for the others;
- a query is in the span iff its squared distance ``||q||^2 - b^T G^{-1} b`` (``b = H_B^T q``)
  vanishes, and then ``q = H_B beta_q`` with ``beta_q = G^{-1} b``;
- the constraint reads ``sum_j u_j c_j beta_j = beta_q``, whose minimum-norm solution is
  ``u_j = c_j beta_j^T y`` with ``K y = beta_q``, ``K = sum_j c_j^2 beta_j beta_j^T``. ``K`` is
  positive definite (each basis vector puts ``c_j^2`` on its diagonal alone), changes by one
  rank-one term per measurement, and is kept densely with its inverse, updated term by term
  and inverted anew from ``K`` now and then (:meth:`SpanSolver.prepare`).

A solve costs the basis vectors' weights on the query's cells (a sparse row slice), one sparse
product over the basis for the distance and a few dense matrix-vector products of order ``r``
(explicit inverses rather than triangular solves: at these orders a triangular solve runs far
below the memory's speed), each reading one triangle of its symmetric or triangular matrix
(:mod:`proxy.engine.blas`: they run at the memory's speed, so half the bytes is about half
the time at a wide cube's rank); each solve with ``G`` or ``K`` is refined once against the
matrix itself, so distances and weights are accurate to rounding, not to the conditioning.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Literal, overload

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.linalg.blas
import scipy.linalg.lapack
from scipy import sparse

from proxy.engine.blas import (
    add_gram,
    lower_product,
    rank_one_update,
    symmetric_product,
)

__all__ = ["SpanSolver", "BatchUpdates"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
# a batch's queries outside the span, and what gives their y from t
Outside = tuple[npt.NDArray[np.bool_], Callable[[FloatArray], FloatArray]]

# Relative distance from the span above which a vector joins the basis. On Adult-like histories
# dependent vectors land below 1e-9 and new directions above 1e-2; a vector admitted on rounding
# alone would make the basis nearly singular.
_INDEPENDENT = 3e-5
# With a max_rank, the solver also overflows once the basis vectors are far sparser than the
# span is large (rank^2 over _SPARSE times their non-zeros, from rank _SPARSE_FROM): rows of a
# few scattered cells, which a sparse factorization over cells handles far more cheaply.
_SPARSE = 4
_SPARSE_FROM = 256
_BLOCK = 64  # vectors placed together
_PENDING = 32  # basis vectors kept outside the sparse row index's parts before they are merged
_MIDDLE = 4  # the index's middle part joins the first once it is a quarter of its size
_GATHERED = 16_384  # index entries up to which a single vector's rows are gathered by hand
_MAX_UPDATES = 48  # terms added to K^{-1} as updates before its accuracy is checked
# Error ||I - K^{-1} K|| (estimated) past which the kept inverse is formed anew from K: one
# refinement against K squares it, so results stay at rounding. Fresh inverses of Adult-like
# histories sit near 1e-11 and drift by about 1e-13 per update; the estimate runs 5-10 times
# below the 2-norm there, which the margin to 1e-7 (1e-14 once refined) covers.
_INVERSE_ERROR = 1e-8
# A restart's placement (SpanSolver.place_all) takes distances from inner products while L's
# condition number is within _SCREEN_COND (their rounding, about eps cond(L) of ||v||^2, then
# stays near _SCREEN^2 and far below _INDEPENDENT^2): within _SCREEN of ||v|| a vector is in the
# span, past _JOINS a new direction (its distance then at rounding), between them measured over
# the cells.
_SCREEN = 1e-5
_SCREEN_COND = 1e6
_JOINS = 1e-2
_GRAM_BYTES = 2**28  # past this, a restart's inner products are not formed at once: _place
# Cells that the same vectors weigh are multiplied densely in groups (the blocks of ANOVA
# coordinates); a group is added into the vectors' inner products at a cost per product of
# about _SCATTER multiply-adds, so a group of few cells weighed by most vectors is taken into
# one dense product over every vector instead.
_SCATTER = 1000
_DENSE_BYTES = 2**25  # that dense product is taken over this much of the cells at a time
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # the power method's start: x_i = (i * _GOLDEN) mod 1
_STAIR = 256  # vectors whose coordinates' reach is kept together (SpanSolver._values)
_REWEIGH = 8  # pending rank-one terms of K, as a fraction of r, past which K is formed anew
# Rank-one terms of K and of K^{-1} held apart (products add them in O(r) each) until this many
# are added to the matrix in one dsyrk: at rank 2,831 one dsyr costs 2.2 ms, a dsyrk of 16
# columns 7.5 ms. Below rank _HELD_FROM each is added at once: at rank 621 a dsyrk of one
# column costs 0.1 ms, about what the terms held would add to a solve's three products.
_LOW_RANK = 16
_HELD_FROM = 1024
_SCALED_COLUMNS = 256  # vectors' weighed coordinates added to K together when it is formed anew
# A batch's corrected solve (BatchUpdates) is given up once it is this many times smaller than
# a term it was formed from: its rounding, relative to it, is then that much larger.
_GROWTH = 1e3
# A batch's distance from the span grown by its fresh directions is taken from its remainder's
# squares while the directions left at least this share of them (the difference then carries
# at most its terms' rounding over that share: 1e-14 here), or while all of it is below
# _NEGLIGIBLE of the query's norm (in the span for every threshold); nearer the directions,
# the remainder left is formed over the cells. A direction nearer than that to the earlier
# ones would give the later queries coordinates with as much of the rounding: the copy decides.
_SETTLED = 1e-2
_NEGLIGIBLE = 1e-10


class SpanSolver:
    """Minimum-norm ``u`` with ``sum_j u_j c_j h_j = q`` for distinct vectors ``h_j``.

    ``c_j^2`` grows by :meth:`weigh` as rows of vector ``j`` are measured. :meth:`solve_many`
    returns ``z_j^T y`` per vector (``u_j / c_j``) for the queries within ``residual`` of the
    span (relative distance), and every query's relative distance.

    >>> solver = SpanSolver(3, residual=1e-6)
    >>> for cells, weights in (([0, 1], [1.0, 1.0]), ([1], [1.0]), ([0], [1.0])):
    ...     j = solver.add(np.array(cells), np.array(weights))
    ...     solver.weigh(j, 1.0)
    >>> solver.rank, solver.size
    (2, 3)
    >>> (g,), (distance,) = solver.solve_many([(np.array([0]), np.array([1.0]))])
    >>> g.round(9).tolist(), distance < 1e-12
    ([0.333333333, -0.333333333, 0.666666667], True)
    """

    def __init__(self, n_cells: int, *, residual: float, max_rank: int | None = None) -> None:
        """``max_rank``: past it (or ``_SPARSE``) the solver stops placing and overflows."""
        self.n_cells = n_cells
        self._residual = residual
        self._max_rank = max_rank
        self.overflowed = False
        self._basis_nnz = 0  # non-zero weights of the basis vectors
        self.size = 0  # distinct vectors
        self._rank = 0  # basis vectors
        self._placed = 0  # vectors with coordinates; the others wait in the queue
        self._queue: list[tuple[IntArray, FloatArray]] = []
        self._vectors: list[tuple[IntArray, FloatArray]] = []  # the basis vectors
        # r x r matrices over the basis, kept in the leading block of buffers with room to grow
        self._gram = np.zeros((16, 16))  # G
        self._lower = np.zeros((16, 16))  # G's Cholesky factor L
        self._lower_inv = np.zeros((16, 16))  # L^{-1}, bordered with L
        # K = sum_j c_j^2 z_j z_j^T, up to the pending terms, and K^{-1} of order _k_dim, up to
        # the same terms: each in its lower triangle (written and read alone; above it, stale),
        # plus the rank-one terms held apart (a v v^T as (v, a), v shorter than the order where
        # the order grew since: zero past its end)
        self._k = np.zeros((16, 16))
        self._k_inv = np.zeros((16, 16))
        self._k_terms = _Terms()
        self._k_inv_terms = _Terms()
        self._coords = np.zeros((16, 16))  # z_j = L^T beta_j of every vector, as columns
        # the rows of the coordinates' buffer anyone wrote (shared with the copies sharing it):
        # past them, its columns not placed yet are zero still
        self._coords_written = [0]
        self._stairs: tuple[int, ...] = ()  # per _STAIR columns placed, the rows they reach
        self._weight2 = np.zeros(16)  # c_j^2
        self._k_pending: list[tuple[int, float]] = []
        self._k_dim = 0  # the order K^{-1} has reached (0: not inverted yet)
        self._k_updates = 0  # terms added to K^{-1} since it was last inverted from K or checked
        self._index: sparse.csr_array | None = None  # cells x (indexed basis vectors)
        self._indexed = 0
        self._middle: sparse.csr_array | None = None  # cells x (the next ones, to _middled)
        self._middled = 0
        self._recent: sparse.csr_array | None = None  # cells x (the basis vectors after those)
        # the last single vector solved: (rank, its weights, H_B^T v, t, H_B beta - v, distance)
        self._projected: tuple[int, FloatArray, FloatArray, FloatArray, FloatArray, float] | None
        self._projected = None
        self._scaled: dict[int, tuple[FloatArray, float]] = {}  # j -> (v, f): queued as v / f
        # this solver and its live copies: they share the matrices until one changes them
        self._family: weakref.WeakSet[SpanSolver] | None = None

    def copy(self) -> SpanSolver:
        """An independent solver with the same vectors, sharing its matrices until written.

        A plan's copy mostly borders them (new basis vectors and vectors placed: rows and
        columns past the original's), which it does in the buffers' spare room when no other
        live solver of the family has written there (:meth:`_claim`); ``K`` and ``K^{-1}``
        change throughout and are copied at their first change (:meth:`_private`).
        """
        other = SpanSolver.__new__(SpanSolver)
        other.__dict__.update(self.__dict__)
        other._vectors = list(self._vectors)
        other._queue = list(self._queue)
        other._k_pending = list(self._k_pending)
        other._k_terms = self._k_terms.copy()
        other._k_inv_terms = self._k_inv_terms.copy()
        other._scaled = dict(self._scaled)
        other._weight2 = self._weight2.copy()
        family = self._family if self._family is not None else weakref.WeakSet([self])
        family.add(other)
        self._family = other._family = family
        return other

    def _others(self) -> list[SpanSolver]:
        """The live solvers that may share this one's matrices."""
        return [] if self._family is None else [s for s in self._family if s is not self]

    def _claim(self) -> None:
        """Before bordering ``G``, ``L``, ``L^{-1}`` and the coordinates: copy those shared.

        Shared, that is, with a live solver that has more basis vectors or vectors placed
        (it wrote past this one's). Bordering writes only past this solver's rank and
        vectors, where no solver that has not grown past it looks: the others keep sharing.
        """
        for name in ("_gram", "_lower", "_lower_inv", "_coords"):
            array = getattr(self, name)
            if any(
                getattr(other, name) is array
                and (other._rank > self._rank or other._placed > self._placed)
                for other in self._others()
            ):
                columns = self._placed if name == "_coords" else self._rank
                setattr(self, name, _compact(array, self._rank, columns, _BLOCK))
                if name == "_coords":
                    self._coords_written = [self._rank]

    def _coords_room(self, rows: int, columns: int) -> None:
        """Room for ``rows`` x ``columns`` coordinates: a new buffer, if grown, with its mark."""
        grown = _grown(self._coords, rows, columns, (self._rank, self._placed))
        if grown is not self._coords:
            self._coords, self._coords_written = grown, [self._rank]

    def _private(self) -> None:
        """Copy ``K`` and ``K^{-1}`` before changing them if another live solver holds them.

        Only their order ``r`` is copied, not the buffer's room (which doubles as the basis
        grows): a plan's copy borders few basis vectors, with ``_BLOCK`` rows to spare (as
        :meth:`_claim` copies).
        """
        for name in ("_k", "_k_inv"):
            array = getattr(self, name)
            if any(getattr(other, name) is array for other in self._others()):
                setattr(self, name, _compact(array, self._rank, self._rank, _BLOCK))

    def resize(self, n_cells: int) -> None:
        """Allow for ``n_cells`` cells (coordinates), more than before."""
        self.n_cells = n_cells
        self._index = None  # rebuilt with as many rows at its next use

    @property
    def rank(self) -> int:
        """The number of basis vectors: the dimension of the span."""
        self._place()
        return self._rank

    def fits(self) -> bool:
        """Whether every vector added so far is placed within ``max_rank``."""
        self._place()
        return not self.overflowed

    def add(
        self,
        cells: IntArray,
        weights: FloatArray,
        *,
        scaled_from: tuple[FloatArray, float] | None = None,
    ) -> int:
        """A new distinct vector (weight 0 until :meth:`weigh`); returns its index ``j``.

        It is placed in the span (basis or coordinates) at the next solve, with the others
        added meanwhile: a restart places its whole history in blocks. ``scaled_from``:
        ``(v, f)`` with ``weights = v / f``; if ``v`` (that array) was the last query solved
        alone and the basis has not grown since, placing it reuses that solve's projection
        (a batch's fresh vector is solved, then added, then placed before the next solve).
        """
        j = self.size
        if j == self._weight2.size:
            self._weight2 = np.concatenate([self._weight2, np.zeros(j)])
        self._queue.append((cells, weights))
        if scaled_from is not None:
            self._scaled[j] = scaled_from
        self.size += 1
        return j

    def _place(self) -> None:
        """Give the queued vectors coordinates, extending the basis by the new directions.

        A block is measured against the basis as it stood before it (one sparse product and
        one solve for the block): a vector in that span is placed at once (later basis vectors
        give it zero coordinates). The others are taken in order against the block's own new
        directions, orthonormalised over the cells from their residuals (twice, as
        Gram-Schmidt needs): a vector whose remainder is below ``_INDEPENDENT`` of its norm is
        placed in their span, the others join the basis, one border each of ``G``, ``L`` and
        ``L^{-1}``.
        """
        queue, self._queue = self._queue, []
        scaled, self._scaled = self._scaled, {}
        if queue:
            self._claim()
        for start in range(0, len(queue), _BLOCK):
            if self.overflowed:
                return
            block = queue[start : start + _BLOCK]
            r = self._rank
            first = self._placed
            self._coords_room(r + len(block), first + len(block))
            # a dropped copy may have written there: cleared up to the rows any solver wrote
            # (not the buffer's every row: a pass over its room, which no memory backs yet)
            self._coords[r : self._coords_written[0], first : first + len(block)] = 0.0
            reused = self._projection_of(scaled.get(first)) if len(block) == 1 else None
            if reused is None:
                inner = self._inner(block)
                target, distances, fitted = self._project(block, inner, residuals=True)
            else:
                inner, target, distances, fitted = reused
            self._coords[:r, first : first + len(block)] = target
            self._placed = first + len(block)
            bound = [_INDEPENDENT * float(np.linalg.norm(w)) for _, w in block]
            candidates = [k for k in range(len(block)) if distances[k] > bound[k]]
            if not candidates:
                continue
            vectors = _row_index([block[k] for k in candidates], self.n_cells)
            block_gram = (vectors.T @ vectors).toarray()
            residuals = fitted[:, candidates]
            residuals = np.negative(residuals[np.any(residuals != 0.0, axis=1)])  # cells weighed
            directions = np.zeros_like(residuals)  # orthonormal, over those cells
            joined: list[int] = []  # positions in candidates of the block's basis vectors
            for position, k in enumerate(candidates):
                n = len(joined)
                remainder = residuals[:, position]
                along = directions[:, :n].T @ remainder
                remainder = remainder - directions[:, :n] @ along
                again = directions[:, :n].T @ remainder
                remainder -= directions[:, :n] @ again
                along += again
                j = first + k
                self._coords[r : r + n, j] = along
                d = math.sqrt(float(remainder @ remainder))
                if d <= bound[k]:
                    continue
                rank = r + n
                if self._max_rank is not None and (
                    rank == self._max_rank
                    or (rank >= _SPARSE_FROM and rank * rank > _SPARSE * self._basis_nnz)
                ):
                    self.overflowed = True
                    return
                directions[:, n] = remainder / d
                cells, weights = block[k]
                self._join(
                    j, d, np.concatenate([inner[:, k], block_gram[position, joined]]), weights
                )
                self._basis_nnz += cells.size
                self._vectors.append((cells, weights))
                self._rank += 1
                self._coords_written[0] = max(self._coords_written[0], self._rank)
                joined.append(position)

    def _projection_of(
        self, scaled: tuple[FloatArray, float] | None
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray] | None:
        """``_inner`` and ``_project(residuals=True)`` of ``v / f``, if the last solve was of ``v``.

        The projection is linear in the vector: that of ``v`` divided by ``f`` (to rounding).
        """
        projected = self._projected
        if scaled is None or projected is None:
            return None
        vector, f = scaled
        rank, weights, inner, target, line, distance = projected
        if weights is not vector or rank != self._rank or line.size != self.n_cells:
            return None
        return (
            (inner / f)[:, None],
            (target / f)[:, None],
            np.array([distance / abs(f)]),
            (line / f)[:, None],
        )

    def place_all(self) -> None:
        """Place every queued vector now, as :meth:`_place` does, at a restart's scale.

        The same blocks, taken in the same order, give the same basis and coordinates (to
        rounding), but a block is placed through inner products alone: a vector's coordinates
        ``z = L^{-1} H_B^T v`` (one triangular solve for the block: backward stable, so no
        refinement) and its distance from the span, ``||v||^2 - ||z||^2``, then the same along
        the block's own new directions, from the block's Gram matrix less its part in the span
        (``V^T V - Z^T Z``, factored by rows, passing over the vectors in the span). That
        route's rounding is about ``eps cond(L)`` of ``||v||^2`` (measured: 1e-14 on the demo
        cube's 10,000-answer history), so while ``cond(L)`` stays within ``_SCREEN_COND`` a
        relative distance within ``_SCREEN`` is a vector in the span and one past ``_JOINS`` a
        new direction, its border of ``L`` at rounding. A block with a distance between the
        two (or a worse conditioned ``L``) is placed by :meth:`_place`, over the cells. Every
        inner product a block may read (the basis and the queue against the queue) is formed
        once, before the first block, by :func:`_inner_products` (at most ``_GRAM_BYTES``,
        else :meth:`_place` places it all): SQL's vectors weigh most of the cells a block
        touches, so products per block cost a dense pass over the basis each.
        """
        queue, self._queue = self._queue, []
        self._scaled = {}
        r0 = self._rank
        most = r0 + len(queue)  # room for every vector joining, made once
        if self._max_rank is not None or most * most * 8 > _GRAM_BYTES:
            self._queue = queue  # it may overflow, or its inner products are too many to hold
            self._place()
            return
        if queue:  # it borders the matrices and writes K: never those a copy still reads
            self._claim()
            self._private()
        for name in ("_gram", "_lower", "_lower_inv", "_k", "_k_inv"):
            setattr(self, name, _grown(getattr(self, name), most, most, (r0, r0)))
        self._coords_room(most, self._placed + len(queue))
        # the basis, then the queue; each basis vector's place in it, in the basis's order
        inner = _inner_products([*self._vectors, *queue], self.n_cells)
        basis = list(range(r0))
        # column sums of |L| and |L^{-1}| (their 1-norms), bordered as they are
        sums, sums_inv = np.zeros(most), np.zeros(most)
        fresh = True
        for start in range(0, len(queue), _BLOCK):
            block = queue[start : start + _BLOCK]
            r = self._rank
            if fresh:
                sums[:r] = np.abs(self._lower[:r, :r]).sum(axis=0)
                sums_inv[:r] = np.abs(self._lower_inv[:r, :r]).sum(axis=0)
            conditioned = r == 0 or sums[:r].max() * sums_inv[:r].max() <= _SCREEN_COND
            fresh = not (
                conditioned and self._place_by_inner_products(block, inner, basis, r0 + start)
            )
            if fresh:  # over the cells
                first = self._placed
                self._queue = block
                self._place()
                # the block's vectors it made basis vectors: each is the first of the block
                # with a coordinate along its own direction (its distance; earlier ones have 0)
                own = self._coords[r : self._rank, first : first + len(block)] != 0.0
                basis.extend((r0 + start + np.argmax(own, axis=1)).tolist())
            else:
                end = self._rank
                sums[:end] += np.abs(self._lower[r:end, :end]).sum(axis=0)
                sums_inv[:end] += np.abs(self._lower_inv[r:end, :end]).sum(axis=0)
        if self._rank:  # built now: the first solve after a restart costs what later ones do
            self._basis_index()

    def _place_by_inner_products(
        self,
        block: list[tuple[IntArray, FloatArray]],
        inner_products: FloatArray,
        basis: list[int],
        offset: int,
    ) -> bool:
        """Place ``block`` as :meth:`place_all` says; False (nothing changed) if it cannot.

        ``inner_products``: those of the vectors :meth:`place_all` numbered, among them the
        block's from ``offset`` on and the basis vectors', at the places ``basis`` lists (in
        the basis's order); the block's new basis vectors are added to it.
        """
        r, first, size = self._rank, self._placed, len(block)
        inner = inner_products[basis, offset : offset + size]  # H_B^T v
        z = (
            scipy.linalg.solve_triangular(
                self._lower[:r, :r], inner, lower=True, check_finite=False
            )
            if r
            else inner
        )
        # the block's inner products less their parts in the span: what its own new directions
        # see of each other
        gram = inner_products[offset : offset + size, offset : offset + size]
        schur = gram - z.T @ z
        squares = np.array([float(weights @ weights) for _, weights in block])
        gaps = squares - np.einsum("ij,ij->j", z, z)
        # the block's new directions, in order: rows of L's border (coordinates along the
        # earlier ones, then the distance), and each candidate's coordinates along them, found
        # as each direction joins (a Cholesky factorization of the Schur complement, by rows)
        candidates = np.flatnonzero(gaps > _SCREEN**2 * squares)
        border = np.zeros((size, size))
        coordinates = np.zeros((size, size))
        joined: list[int] = []
        along: dict[int, FloatArray] = {}
        for position, k in enumerate(candidates.tolist()):
            if gaps[k] < _JOINS**2 * squares[k]:
                return False  # near the basis before the block: measured over the cells
            n = len(joined)
            a = coordinates[k, :n].copy()
            along[k] = a
            d2 = float(gaps[k] - a @ a)
            if d2 <= _SCREEN**2 * squares[k]:
                continue
            if d2 < _JOINS**2 * squares[k]:
                return False  # near the span: measured over the cells
            d = math.sqrt(d2)
            border[n, :n] = a
            border[n, n] = d
            later = candidates[position + 1 :]
            coordinates[later, n] = (schur[k, later] - coordinates[later, :n] @ a) / d
            joined.append(k)
        self._coords_room(r + len(joined), first + size)
        self._coords[:r, first : first + size] = z
        for k, a in along.items():
            self._coords[r : r + a.size, first + k] = a
        self._placed = first + size
        n = len(joined)
        if n:
            self._border(r, first, joined, z, inner, gram, border[:n, :n], squares[joined])
            basis.extend(offset + k for k in joined)
            for k in joined:
                cells, weights = block[k]
                self._basis_nnz += cells.size
                self._vectors.append((cells, weights))
        return True

    def _border(
        self,
        r: int,
        first: int,
        joined: list[int],
        z: FloatArray,
        inner: FloatArray,
        gram: FloatArray,
        border: FloatArray,
        squares: FloatArray,
    ) -> None:
        """Make the block's vectors ``joined`` basis vectors at once, as :meth:`_join` does.

        ``z``: the block's coordinates along the basis (the new rows' first ``r`` columns of
        ``L``); ``border``: their rows of ``L`` past the first ``r`` columns (coordinates along
        each other, distances on the diagonal); ``inner``, ``gram``: the block's inner products
        with the basis and with itself; ``squares``: the joined vectors' squared norms. ``L^{-1}``
        is bordered by ``[-D^{-1} C L^{-1}, D^{-1}]`` for the new rows ``[C, D]`` of ``L``: one
        matrix product for the block.
        """
        n = len(joined)
        end = r + n
        self._coords[r + np.arange(n), first + np.array(joined)] = np.diag(border)
        for name in ("_gram", "_lower", "_lower_inv", "_k", "_k_inv"):
            setattr(self, name, _grown(getattr(self, name), end, end, (r, r)))
        self._gram[r:end, :r] = inner[:, joined].T
        self._gram[:r, r:end] = inner[:, joined]
        self._gram[r:end, r:end] = gram[np.ix_(joined, joined)]
        self._gram[r + np.arange(n), r + np.arange(n)] = squares
        lines = z[:, joined].T  # C
        self._lower[r:end, :r] = lines
        self._lower[r:end, r:end] = border
        border_inv = scipy.linalg.solve_triangular(border, np.eye(n), lower=True)
        self._lower_inv[r:end, :r] = -border_inv @ (lines @ self._lower_inv[:r, :r])
        self._lower_inv[r:end, r:end] = border_inv
        self._k[r:end, :end] = 0.0
        self._k[:end, r:end] = 0.0
        self._rank = end
        self._coords_written[0] = max(self._coords_written[0], end)

    def _join(self, j: int, d: float, inner: FloatArray, weights: FloatArray) -> None:
        """Make vector ``j`` (distance ``d`` from the span, coordinates placed) a basis vector.

        ``inner`` holds its inner products with the basis vectors.
        """
        r = self._rank
        self._coords[r, j] = d
        self._private()
        for name in ("_gram", "_lower", "_lower_inv", "_k", "_k_inv"):
            setattr(self, name, _grown(getattr(self, name), r + 1, r + 1, (r, r)))
        gram, lower, lower_inv = self._gram, self._lower, self._lower_inv
        gram[r, :r] = gram[:r, r] = inner
        gram[r, r] = float(weights @ weights)
        line = self._coords[:r, j]
        lower[r, :r] = line
        lower[r, r] = d
        # the row x with x L = e_r: x = [-(line^T L^{-1}) / d, 1 / d]
        lower_inv[r, :r] = -lower_product(lower_inv[:r, :r], line, transpose=True) / d
        lower_inv[r, r] = 1.0 / d
        self._k[r, : r + 1] = self._k[: r + 1, r] = 0.0

    def weigh(self, j: int, weight2: float) -> None:
        """Add ``weight2`` to ``c_j^2`` (a row of vector ``j`` measured with that precision)."""
        self._weight2[j] += weight2
        self._k_pending.append((j, weight2))

    def prepare(self) -> None:
        """Bring ``K`` and ``K^{-1}`` up to date now rather than at the next solve.

        ``K^{-1}`` is kept explicitly, so that a solve is a matrix product rather than
        triangular solves (which run far below the memory's speed at these orders). A few new
        terms are added to it as updates (a rank-one term by Sherman-Morrison, a new basis
        vector by bordering), each at the cost of one product; with many terms at once (a
        restart) ``K`` is inverted anew. Every ``_MAX_UPDATES`` updates the inverse's error is
        estimated (two products) and it is inverted anew only past ``_INVERSE_ERROR``: a GROUP
        BY planned on a copy adds hundreds of groups one at a time, and an inversion, of order
        ``r^3``, every few dozen of them cost seconds at a rank in the thousands. Each solve is
        refined once against ``K`` itself, so the updates' rounding does not reach it. From rank
        ``_HELD_FROM`` the rank-one terms (``K``'s new terms, ``K^{-1}``'s Sherman-Morrison
        ones) are held apart and added ``_LOW_RANK`` at a time: a pass over the triangle per
        term was most of a single value's solve on the wide cube.
        """
        self._place()
        if not self._k_pending or not self._rank:
            return
        self._private()
        r, z = self._rank, self._coords
        pending, self._k_pending = self._k_pending, []
        updating = (
            self._k_dim > 0
            and len(pending) <= _MAX_UPDATES
            and (self._k_updates + len(pending) <= _MAX_UPDATES or self._inverse_holds())
        )
        k = self._k[:r, :r]
        if _REWEIGH * len(pending) > r:  # formed anew, in blocks of the vectors (no r x size)
            k[...] = 0.0
            self._k_terms = _Terms()
            for start in range(0, self.size, _SCALED_COLUMNS):
                stop = min(start + _SCALED_COLUMNS, self.size)
                add_gram(k, z[:r, start:stop] * np.sqrt(self._weight2[start:stop]))
        else:
            for j, weight2 in pending:
                self._k_terms.add(z[:r, j], weight2)
            if self._k_terms.count >= _LOW_RANK or r < _HELD_FROM:
                self._k_terms.add_to(k)
        if updating:
            for j, weight2 in pending:
                if not self._update(z[:r, j], weight2):
                    break
            else:
                if self._k_dim == r:
                    return
        self._invert_k()

    def _invert_k(self) -> None:
        """``K^{-1}`` from ``K`` through its Cholesky factor."""
        r = self._rank
        self._k_terms.add_to(self._k[:r, :r])
        self._k_inv_terms = _Terms()
        # one r x r temporary, factored and inverted in place: LAPACK sees its transpose
        # (Fortran order), whose upper triangle is K's lower one; so is the inverse's
        work = np.array(self._k[:r, :r])
        _, info = scipy.linalg.lapack.dpotrf(work.T, lower=0, clean=0, overwrite_a=1)
        if info == 0:
            _, info = scipy.linalg.lapack.dpotri(work.T, lower=0, overwrite_c=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"K is not positive definite (LAPACK info {info})")
        self._k_inv[:r, :r] = work
        self._k_dim = r
        self._k_updates = 0

    def _inverse_holds(self) -> bool:
        """Whether the kept ``K^{-1}`` is within ``_INVERSE_ERROR`` of ``K``'s inverse.

        Two steps of the power method on ``E = I - K^{-1} K`` (``K`` before the pending terms,
        the matrix the inverse was kept for) from a fixed start with no structure of its own
        (a Weyl sequence: randomness is the noise module's alone); if so, updates go on and
        are counted afresh.
        """
        n = self._k_dim
        x = np.asarray((np.arange(n) * _GOLDEN) % 1.0 - 0.5, dtype=np.float64)
        for _ in range(2):
            norm = float(np.linalg.norm(x))
            if norm == 0.0:  # E vanishes on x (a small K inverted exactly)
                break
            x = x / norm
            x = x - self._k_inv_times(self._k_times(x))
        if float(np.linalg.norm(x)) > _INVERSE_ERROR:
            return False
        self._k_updates = 0
        return True

    def _update(self, z: FloatArray, weight2: float) -> bool:
        """Add ``weight2 z z^T`` to ``K^{-1}``'s matrix; False if ``z`` reaches past a border.

        A border ``K' = [[K + w l l^T, w d l], [w d l^T, w d^2]]`` is ``E diag(K, w d^2) E^T``
        with ``E = [[I, l/d], [0, 1]]``, so ``K'^{-1} = [[K^{-1}, -v], [-v^T, l^T v / d +
        1 / (w d^2)]]`` with ``v = K^{-1} l / d``; a rank-one term is Sherman-Morrison's.
        """
        (nonzero,) = np.nonzero(z)
        top = int(nonzero[-1]) if nonzero.size else -1
        n = self._k_dim
        inverse = self._k_inv
        if top < n:  # the term held apart, added with the next _LOW_RANK
            v = self._k_inv_times(z[:n])
            denominator = 1.0 + weight2 * float(z[:n] @ v)
            self._k_inv_terms.add(v, -weight2 / denominator)
            if self._k_inv_terms.count >= _LOW_RANK or n < _HELD_FROM:
                self._k_inv_terms.add_to(inverse[:n, :n])
        elif top == n:  # the terms held apart stay as they are (zero in the new row)
            line, d = z[:n], float(z[n])
            v = self._k_inv_times(line) / d
            inverse[n, :n] = -v
            inverse[n, n] = float(line @ v) / d + 1.0 / (weight2 * d * d)
            self._k_dim = n + 1
        else:
            return False
        self._k_updates += 1
        return True

    def solve_many(
        self, queries: Sequence[tuple[IntArray, FloatArray]]
    ) -> tuple[list[FloatArray | None], list[float]]:
        """Per query, ``z_j^T y`` for every vector ``j`` and ``||q - proj q|| / ||q||``.

        Queries farther than ``residual`` from the span get ``None`` (not solved).
        """
        found, residuals, _ = self._solve(queries, keep=False)
        return found, residuals

    def solve_batch(
        self, queries: Sequence[tuple[IntArray, FloatArray]]
    ) -> tuple[list[FloatArray | None], list[float], BatchUpdates]:
        """:meth:`solve_many`, keeping what corrects the batch's later solves.

        Every query is solved, the far ones too (a fresh measurement of the batch may bring
        them into the span), and its remainder from the span kept over the cells.
        """
        found, residuals, updates = self._solve(queries, keep=True)
        assert updates is not None
        return found, residuals, updates

    def _solve(
        self, queries: Sequence[tuple[IntArray, FloatArray]], *, keep: bool
    ) -> tuple[list[FloatArray | None], list[float], BatchUpdates | None]:
        self._place()
        r = self._rank
        found: list[FloatArray | None] = [None] * len(queries)
        norms = np.array([float(np.linalg.norm(w)) for _, w in queries])
        if r == 0 and not keep:
            return found, [1.0] * len(queries), None
        if keep:
            target, distances, fitted = self._project(queries, self._inner(queries), residuals=True)
        else:
            target, distances = self._project(queries, self._inner(queries))
        residuals = distances / norms
        inside = residuals <= self._residual
        if r == 0:
            residuals[:] = 1.0
            inside[:] = False
        if np.any(inside):
            y, per_vector = self._solve_in_span(target[:, inside])
            for column, i in enumerate(np.flatnonzero(inside).tolist()):
                found[i] = per_vector[:, column]
        else:
            y, per_vector = None, None
        updates = None
        if keep:
            k = len(queries)
            kept_y, values = np.zeros((r, k)), np.zeros((self.size, k), order="F")
            if y is not None and per_vector is not None:
                kept_y[:, inside], values[:, inside] = y, per_vector
            outside = None if r == 0 or np.all(inside) else (~inside, self._y_of)
            updates = BatchUpdates(
                target,
                kept_y,
                values,
                fitted,
                norms,
                residual=self._residual,
                values_of=self._values,
                outside=outside,
                max_rank=self._max_rank,
                basis_nnz=self._basis_nnz,
            )
        return found, residuals.tolist(), updates

    def _solve_in_span(self, target: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``y`` (``K y = t``, refined once) and ``z_j^T y`` for each ``j``.

        ``target``: the queries' coordinates ``t = L^T beta`` (:meth:`_project`), as columns.
        """
        y = self._y_of(target)
        return y, self._values(y)

    def _y_of(self, target: FloatArray) -> FloatArray:
        """``y`` with ``K y = t`` (refined once), for ``t`` as columns."""
        self.prepare()
        y = self._k_inv_times(target)
        y += self._k_inv_times(target - self._k_times(y))
        return y

    def _k_times(self, x: FloatArray) -> FloatArray:
        """``K x`` (``x``: a vector or columns of K's order), with the terms held apart."""
        n = x.shape[0]
        return self._k_terms.plus_times(symmetric_product(self._k[:n, :n], x), x)

    def _k_inv_times(self, x: FloatArray) -> FloatArray:
        """``K^{-1} x`` likewise (``x`` of ``K^{-1}``'s order)."""
        n = x.shape[0]
        return self._k_inv_terms.plus_times(symmetric_product(self._k_inv[:n, :n], x), x)

    def _values(self, y: FloatArray) -> FloatArray:
        """``z_j^T y`` for every vector ``j`` (rows), reading only the rows their ``z_j`` reach.

        A vector's coordinates end at the rank when it was placed (later basis vectors give it
        none): a basis vector's at its own row, so the coordinates of a history placed as it
        arrived are nearly triangular. Per block of ``_STAIR`` vectors placed, the rows any of
        them reaches are found once (their coordinates do not change after) and the product
        reads those alone: about half of the coordinates on the wide cube, a quarter on the
        demo.
        """
        r, size = self._rank, self.size
        coords, stairs = self._coords, self._stairs
        if len(stairs) < self._placed // _STAIR:
            found = list(stairs)
            for start in range(len(stairs) * _STAIR, self._placed - _STAIR + 1, _STAIR):
                reached = np.flatnonzero(np.any(coords[:r, start : start + _STAIR], axis=1))
                found.append(int(reached[-1]) + 1 if reached.size else 0)
            stairs = self._stairs = tuple(found)
        out = np.empty((size, *y.shape[1:]))
        for b, rows in enumerate(stairs):
            columns = slice(b * _STAIR, (b + 1) * _STAIR)
            out[columns] = coords[:rows, columns].T @ y[:rows]
        rest = len(stairs) * _STAIR
        out[rest:] = coords[:r, rest:size].T @ y
        return out

    @overload
    def _project(
        self, vectors: Sequence[tuple[IntArray, FloatArray]], inner: FloatArray
    ) -> tuple[FloatArray, FloatArray]: ...

    @overload
    def _project(
        self,
        vectors: Sequence[tuple[IntArray, FloatArray]],
        inner: FloatArray,
        *,
        residuals: Literal[True],
    ) -> tuple[FloatArray, FloatArray, FloatArray]: ...

    def _project(
        self,
        vectors: Sequence[tuple[IntArray, FloatArray]],
        inner: FloatArray,
        *,
        residuals: bool = False,
    ) -> tuple[FloatArray, FloatArray] | tuple[FloatArray, FloatArray, FloatArray]:
        """``t = L^T beta`` and ``||v - H_B beta||`` per vector, ``beta = G^{-1} H_B^T v``.

        ``t = L^{-1} b`` (``b = H_B^T v``, ``G = L L^T``), refined once against ``G``:
        ``t += L^{-1} (b - G L^{-T} t)``; then ``beta = L^{-T} t``. The distance is measured
        over the cells, not as ``||v||^2 - ||t||^2``: that difference cancels, and its rounding
        would reach 1e-5 of ``||v||`` on these histories. ``residuals``: also ``H_B beta - v``
        over the cells, as columns.
        """
        r = self._rank
        target = beta = np.zeros((0, len(vectors)))
        parts: list[tuple[sparse.csr_array, slice]] = []
        if r:
            lower_inv = self._lower_inv[:r, :r]
            target = lower_product(lower_inv, inner)
            beta = lower_product(lower_inv, target, transpose=True)
            change = inner - symmetric_product(self._gram[:r, :r], beta, whole=True)
            target += lower_product(lower_inv, change)
            beta = lower_product(lower_inv, target, transpose=True)
            parts = self._basis_index()
        if len(vectors) == 1 and not residuals:  # sparse matrix-vector products, a dot
            line = np.zeros(self.n_cells)
            for matrix, columns in parts:
                line += matrix @ beta[columns, 0]
            cells, weights = vectors[0]
            line[cells] -= weights
            distance = math.sqrt(float(line @ line))
            self._projected = (r, weights, inner[:, 0], target[:, 0], line, distance)
            return target, np.array([distance])
        fitted = np.zeros((self.n_cells, len(vectors)))
        for matrix, columns in parts:
            fitted += matrix @ beta[columns]
        for k, (cells, weights) in enumerate(vectors):
            fitted[cells, k] -= weights
        distances = np.sqrt(np.einsum("ij,ij->j", fitted, fitted))
        if residuals:
            return target, distances, fitted
        return target, distances

    def _basis_index(self) -> list[tuple[sparse.csr_array, slice]]:
        """The basis vectors as the columns of cells x (their count) sparse matrices, in parts.

        Stacking the index anew each time ``_PENDING`` basis vectors have joined costs its
        whole size every time (0.23 s at the wide cube's rank 2,831): quadratic in the rank.
        So the vectors are kept in up to three parts, each with the basis positions its columns
        stand for: the first ones; a middle part, which takes in the last ones once there are
        more than ``_PENDING`` of them, and joins the first once it holds more than
        ``1 / _MIDDLE`` as many (so a vector is copied a bounded number of times on average);
        and the last ones, rebuilt as they join.
        """
        r = self._rank
        if self._index is None:
            self._index = _row_index(self._vectors, self.n_cells)
            self._indexed = self._middled = r
            self._middle = self._recent = None
        if r > self._middled and (
            self._recent is None or self._recent.shape[1] != r - self._middled
        ):
            self._recent = _row_index(self._vectors[self._middled : r], self.n_cells)
        if r - self._middled > _PENDING:
            joined = self._recent
            assert joined is not None
            self._middle = (
                joined
                if self._middle is None
                else sparse.hstack([self._middle, joined], format="csr")
            )
            self._middled, self._recent = r, None
            if (r - self._indexed) * _MIDDLE > self._indexed:
                self._index = sparse.hstack([self._index, self._middle], format="csr")
                self._indexed, self._middle = r, None
        parts = [(self._index, slice(0, self._indexed))]
        if self._middle is not None:
            parts.append((self._middle, slice(self._indexed, self._middled)))
        if r > self._middled:
            assert self._recent is not None
            parts.append((self._recent, slice(self._middled, r)))
        return parts

    def _inner(self, vectors: Sequence[tuple[IntArray, FloatArray]]) -> FloatArray:
        """``H_B^T v`` for each vector ``v`` (columns), from the cells each touches."""
        r = self._rank
        out = np.zeros((r, len(vectors)))
        if r == 0:
            return out
        parts = self._basis_index()
        if len(vectors) == 1:
            cells, weights = vectors[0]
            for matrix, columns in parts:
                entries = _row_entries(matrix, cells)
                if entries is None:  # many entries: scipy's row indexing is the faster
                    out[columns, 0] = matrix[cells].T @ weights
                    continue
                positions, lengths = entries
                out[columns, 0] = np.bincount(
                    matrix.indices[positions],
                    weights=matrix.data[positions] * np.repeat(weights, lengths),
                    minlength=matrix.shape[1],
                )
        else:  # the basis on the cells the batch touches, against the batch densely there
            touched = np.unique(np.concatenate([cells for cells, _ in vectors]))
            dense = np.zeros((touched.size, len(vectors)))
            for k, (cells, weights) in enumerate(vectors):
                dense[np.searchsorted(touched, cells), k] = weights
            for matrix, columns in parts:
                out[columns] = matrix[touched].T @ dense
        return out


class BatchUpdates:
    """A batch's solves as some of its queries are measured: each later solve corrected.

    A GROUP BY whose groups buy fresh answers decides each group on the history plus the groups
    measured before it. Solving each again (placing the fresh vector, then ``r^2`` products)
    repeats what the batch's first solve already holds: per query ``q_b`` its coordinates
    ``t_b = L^{-1} H_B^T q_b``, ``y_b = K^{-1} t_b``, its values ``z_j^T y_b`` and its remainder
    ``R_b`` from the span over the cells. A fresh query ``a`` measured with precision ``p`` adds
    ``p^2 t_a t_a^T`` to ``K`` (its vector ``q_a / f`` weighed ``(p f)^2``), in coordinates
    grown by one orthonormal direction per fresh vector outside the span (its remainder off
    the earlier ones, as :meth:`SpanSolver._place` takes it). Since ``y_a`` is kept up to date
    with the others, each measurement corrects every later ``y_b`` in ``O(r)``:

    - in the span, by Sherman-Morrison: ``y_b -= y_a gamma (t_a^T y_b)``,
      ``gamma = p^2 / (1 + p^2 t_a^T y_a``);
    - outside it, along a new direction with coordinate ``x_b`` (``d`` for ``q_a``): ``K`` is
      bordered as in :meth:`SpanSolver._update`, ``y_b`` becomes
      ``[y_b - (x_b / d) y_a, -(t_a^T y'_b) / d + x_b / (p^2 d^2)]`` (``t_a`` without ``d``,
      ``y'_b`` the first part).

    The remainders are never corrected over the cells: a direction is the remainder of its
    query off the earlier directions, so the coordinates along it follow from the remainders'
    inner products, ``x_b = (R_a^T R_b - sum x_a x_b over the earlier directions) / d``, and
    a distance from the squares left, ``d_b^2 = ||R_b||^2 - sum x_b^2`` (a product of the
    batch's remainders, once: a fresh GROUP BY's hundreds of groups cost its order, not a pass
    over the cells per group and direction). That difference cancels where the directions took
    nearly all of a remainder (a query they bring into the span): there, and only there, the
    remainder left is formed over the cells (:meth:`_distance`).

    The values ``z_j^T y_b`` of the history's vectors follow from ``z_j^T y_a`` the same way
    while both are held: a query's values are found from its ``y`` once needed (values are
    linear in ``y``), so a fresh query outside the span, whose values nobody needs, corrects
    none (the later ones drop theirs instead, found again when they are solved). A fresh
    vector is placed as the plan's copy of the index would place it (joining the span past
    ``_INDEPENDENT`` of its norm, its coordinates along later directions zero), so the
    corrected solves are those of the copy to rounding. A correction that cancels (a ``y_b``
    shrunk by more than ``_GROWTH`` from the largest term it was made of) would carry that
    much of its terms' rounding: the caller then solves on the copy instead, as it does once
    a fresh vector would take the copy past its ``max_rank``, or joins the span only that
    near the batch's earlier directions.
    """

    def __init__(
        self,
        target: FloatArray,
        y: FloatArray,
        values: FloatArray,
        fitted: FloatArray,
        norms: FloatArray,
        *,
        residual: float,
        values_of: Callable[[FloatArray], FloatArray],
        outside: Outside | None = None,
        joins: tuple[float, float] = (_INDEPENDENT, _INDEPENDENT),
        max_rank: int | None = None,
        basis_nnz: int = 0,
    ) -> None:
        """The batch's solve: per query (columns) ``t``, ``y`` and the values ``z_j^T y``.

        ``fitted``: ``proj q_b - q_b`` over the cells, as columns (taken, not copied).
        ``values_of``: the values of queries from their ``y`` (columns). ``outside``: the
        queries not solved yet (their ``y`` and values zero here) and what gives their ``y``
        from their ``t`` (done at the first measurement, if any). ``joins``: a fresh vector
        farther than the first of its norm from the span joins it, one within the second is
        in it; in between, the corrections stop (the copy decides). ``max_rank``,
        ``basis_nnz``: the span's bound, and the non-zeros of its basis vectors.
        """
        r, k = target.shape
        self._rank = r
        self._dims = r  # the coordinates so far: the span's, then one per direction joined
        self._t = np.zeros((r + k, k))
        self._t[:r] = target
        # by columns (a query's are contiguous): a measurement's rank-one corrections of the
        # later queries are then a few long runs, not a short one per vector (OpenBLAS's
        # dger over rows of a few numbers: 2.6 ms per 20-group GROUP BY on the wide cube,
        # 0.9 so)
        self._y = np.zeros((r + k, k), order="F")
        self._y[:r] = y
        self._values = np.asfortranarray(values)  # z_j^T y_b: history vector j, query b
        # solved when a query is first measured (the solver is as it was until the plan ends)
        self._unsolved = outside
        # the queries whose values are not held: found from y once needed (most of a GROUP
        # BY's fresh groups never are)
        self._unknown = np.zeros(k, dtype=bool) if outside is None else outside[0].copy()
        self._values_of = values_of
        # proj q_b - q_b on the span, with the sign changed (never corrected), and its squares
        # (found at the first distance asked: a batch answered from history asks none)
        self._remainders = fitted
        self._squares: FloatArray | None = None
        # the remainders' inner products from the first query that brought a direction on
        # (the upper triangle), and that query
        self._gram: FloatArray | None = None
        self._gram_from = 0
        self._taken = np.zeros(k)  # per query, the squares of its coordinates along directions
        self._owners: list[int] = []  # the query that brought each direction
        self._distances: dict[int, tuple[int, float]] = {}  # query -> (dims, distance) found
        self._norms = norms
        self._largest = np.abs(self._y[:r]).max(axis=0, initial=0.0)
        self._residual = residual
        self._independent, self._dependent = joins
        self._max_rank = max_rank
        self._basis_nnz = basis_nnz
        # the new distinct vectors' coordinates when measured (columns; later directions give
        # them none), and their factors
        self._new = np.zeros((r + k, k))
        self._factors: list[float] = []

    def _solve_outside(self) -> None:
        """Solve the queries outside the span too (a fresh vector may bring them in)."""
        if self._unsolved is None:
            return
        (outside, y_of), self._unsolved = self._unsolved, None
        y = y_of(self._t[: self._rank, outside])
        self._y[: self._rank, outside] = y
        self._largest[outside] = np.abs(y).max(axis=0, initial=0.0)

    def _values_from(self, b: int) -> None:
        """Query ``b``'s values from its ``y``, if they are not held.

        ``z_j^T y_b`` is linear in ``y_b``'s coordinates in the span (the history's vectors
        have none along the batch's new directions), which the corrections keep: the values
        found now are those the corrections would have given, to rounding.
        """
        if self._unknown[b]:
            self._solve_outside()
            self._values[:, b] = self._values_of(self._y[: self._rank, b : b + 1])[:, 0]
            self._unknown[b] = False

    def _square(self, b: int) -> float:
        """``||R_b||^2``."""
        if self._squares is None:
            self._squares = np.einsum("ij,ij->j", self._remainders, self._remainders)
        return float(self._squares[b])

    def _distance(self, b: int) -> float:
        """``||q_b - proj q_b||`` on the span grown by the directions so far.

        From the squares the directions took of the remainder while at least ``_SETTLED`` of
        it is left (or all of it is rounding: below ``_NEGLIGIBLE`` of the query's norm),
        where that difference carries no more than its terms' rounding over ``_SETTLED``.
        Otherwise the remainder off the directions ``E = R_N U^{-1}`` (``R_N``: the remainders
        of the queries that brought them; ``U``: their coordinates along them, triangular) is
        formed over the cells, refined once (its coordinates too), as the copy measures it.
        """
        known = self._distances.get(b)
        if known is not None and known[0] == self._dims:
            return known[1]
        square = self._square(b)
        left = square - float(self._taken[b])
        if left >= _SETTLED * square or square <= (_NEGLIGIBLE * float(self._norms[b])) ** 2:
            distance = math.sqrt(max(left, 0.0))
        else:
            r, dims = self._rank, self._dims
            basis = self._remainders[:, self._owners]
            triangle = self._t[r:dims, self._owners]
            along = self._t[r:dims, b]
            remainder = self._remainders[:, b] - basis @ scipy.linalg.solve_triangular(
                triangle, along
            )
            change = scipy.linalg.solve_triangular(triangle, basis.T @ remainder, trans="T")
            remainder -= basis @ scipy.linalg.solve_triangular(triangle, change)
            along += change
            distance = math.sqrt(float(remainder @ remainder))
            self._taken[b] = square - distance * distance
        self._distances[b] = (self._dims, distance)
        return distance

    def _along(self, a: int, d: float) -> FloatArray:
        """The later queries' coordinates along the direction query ``a`` brings (``d`` off).

        ``(R_a^T R_b - x_a^T x_b) / d`` over the earlier directions' coordinates ``x``; the
        remainders' inner products are taken at the first direction, from its query on.
        """
        if self._gram is None:
            self._gram_from = a
            later = self._remainders[:, a:]
            # (the upper triangle of later^T later: dsyrk sees later.T, column-major)
            self._gram = scipy.linalg.blas.dsyrk(1.0, later.T, trans=0, lower=0)
        r, dims, first = self._rank, self._dims, self._gram_from
        products = self._gram[a - first, a - first + 1 :]
        along: FloatArray = (products - self._t[r:dims, a] @ self._t[r:dims, a + 1 :]) / d
        return along

    def measure(self, a: int, precision: float, factor: float, new_vector: bool, nnz: int) -> bool:
        """Query ``a`` measured with ``precision`` as ``factor`` times a vector (new or not).

        Queries are measured in order: only those after ``a`` are corrected (and solved) since.

        False if the correction cannot follow (the span would pass ``max_rank``, or ``y_a``
        has cancelled): later solves of the batch must be made on the copy.
        """
        self._solve_outside()
        if not self._accurate(a):
            return False
        dims = self._dims
        d = self._distance(a) if new_vector else 0.0
        t_a = self._t[:dims, a].copy()
        y_a = self._y[:dims, a]
        w = precision * precision
        later = slice(a + 1, None)  # the queries decided after this one (the others are done)
        if new_vector and d > self._dependent * self._norms[a]:
            if d <= self._independent * self._norms[a]:
                return False  # neither clearly in the span nor clearly off it
            rank = dims + 1
            if self._max_rank is not None and (
                rank - 1 == self._max_rank
                or (rank - 1 >= _SPARSE_FROM and (rank - 1) ** 2 > _SPARSE * self._basis_nnz)
            ):
                return False
            if d * d < _SETTLED * self._square(a):
                # so near the earlier directions that the later queries' coordinates along
                # it would carry the remainders' rounding over its share of them
                return False
            self._basis_nnz += nnz
            along = self._along(a, d)  # x_b
            self._t[dims, a] = d
            self._t[dims, later] = along
            self._taken[later] += along * along
            self._owners.append(a)
            coefficient = along / d
            rank_one_update(self._y[:dims, later].T, -1.0, coefficient, y_a)
            self._y[dims, later] = -(t_a @ self._y[:dims, later]) / d + along / (w * d * d)
            self._dims = rank
        else:
            gamma = w / (1.0 + w * float(t_a @ y_a))
            coefficient = gamma * (t_a @ self._y[:dims, later])
            rank_one_update(self._y[:dims, later].T, -1.0, coefficient, y_a)
        self._correct_values(a, coefficient)
        # the largest term, max_i |y_a[i] c_b|, is max_i |y_a[i]| times |c_b| (rounding is
        # monotone): no outer product of the batch's size per measurement
        largest_a = float(np.abs(y_a).max(initial=0.0))
        np.maximum(self._largest[later], largest_a * np.abs(coefficient), out=self._largest[later])
        if new_vector:  # its coordinates: later directions give it none, as the copy places it
            self._new[: self._dims, len(self._factors)] = self._t[: self._dims, a]
            self._factors.append(factor)
        return True

    def _correct_values(self, a: int, coefficient: FloatArray) -> None:
        """The later values held, corrected as their ``y`` were (``coefficient`` per query).

        With query ``a``'s values not held, the later ones are dropped rather than ``a``'s
        found: each is found again if it is solved within the span (of a fresh GROUP BY's
        groups, few or none).
        """
        unknown = self._unknown[a + 1 :]
        if self._unknown[a]:
            unknown[:] = True
            return
        (held,) = np.nonzero(~unknown)
        if held.size == unknown.size:
            rank_one_update(self._values[:, a + 1 :].T, -1.0, coefficient, self._values[:, a])
        elif held.size:
            self._values[:, held + a + 1] -= np.outer(self._values[:, a], coefficient[held])

    def _accurate(self, b: int) -> bool:
        """Whether ``y_b`` kept all but ``_GROWTH`` of the size of the terms it was made of."""
        size = float(np.abs(self._y[: self._dims, b]).max(initial=0.0))
        return bool(size * _GROWTH >= self._largest[b])

    def solve(self, b: int) -> tuple[FloatArray | None, float] | None:
        """Query ``b``'s values ``z_j^T y`` and relative distance from the span.

        The values are for every vector, the history's then the batch's new ones, as
        :meth:`SpanSolver.solve_many` would give them on the copy; None past the solver's
        ``residual`` (not estimable). None in all if the correction cancelled.
        """
        residual = self._distance(b) / float(self._norms[b])
        if residual > self._residual:
            return None, residual
        if not self._accurate(b):
            return None
        self._values_from(b)
        y = self._y[: self._dims, b]
        count = len(self._factors)
        new = self._new[: self._dims, :count].T @ y / np.array(self._factors)
        return np.concatenate([self._values[:, b], new]), residual


def _row_index(vectors: list[tuple[IntArray, FloatArray]], n_cells: int) -> sparse.csr_array:
    lengths = [cells.size for cells, _ in vectors]
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    columns = sparse.csc_array(
        (
            np.concatenate([w for _, w in vectors]),
            np.concatenate([c for c, _ in vectors]),
            indptr,
        ),
        shape=(n_cells, len(vectors)),
    )
    return columns.tocsr()


def _row_entries(matrix: sparse.csr_array, rows: IntArray) -> tuple[IntArray, IntArray] | None:
    """The positions in ``matrix.data`` of the entries of ``rows``, in order, and their counts.

    What ``matrix[rows]`` reads, without building it: scipy's fancy row indexing costs about
    0.2 ms of checks and copies whatever the rows, at the scale of a single solve's products
    on the demo cube. Past ``_GATHERED`` entries its compiled gather is the faster (a wide
    cube's rows hold hundreds of basis vectors each): None.
    """
    starts = matrix.indptr[rows]
    lengths = matrix.indptr[rows + 1] - starts
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if ends.size else 0
    if total > _GATHERED:
        return None
    return np.repeat(starts - ends + lengths, lengths) + np.arange(total), lengths


def _inner_products(vectors: list[tuple[IntArray, FloatArray]], n_cells: int) -> FloatArray:
    """Every inner product of ``vectors`` (a symmetric matrix), in dense products.

    The cells are grouped by the vectors that weigh them (equal sums of a pseudo-random key
    per vector; sums that collide only merge groups, whose products stay exact); a group's
    vectors over its cells are multiplied densely and added where they belong. Groups of few
    cells weighed by many vectors, for which that addition would cost more than the product,
    are multiplied together over every vector.
    """
    q = len(vectors)
    out = np.zeros((q, q))
    if not q:
        return out
    rows = _row_index(vectors, n_cells)
    weighed = np.flatnonzero(np.diff(rows.indptr))
    counts = np.diff(rows.indptr)[weighed]
    keys = _mixed(np.arange(q, dtype=np.uint64))
    signatures = np.add.reduceat(keys[rows.indices], rows.indptr[weighed])
    _, group, sizes = np.unique(signatures, return_inverse=True, return_counts=True)
    by_group = np.split(weighed[np.argsort(group, kind="stable")], np.cumsum(sizes)[:-1])
    # a group's vectors: those that weigh any of its cells (each cell's, but where keys collided)
    most = np.zeros(sizes.size, dtype=np.int64)
    np.maximum.at(most, group, counts)
    dense = sizes * float(q) ** 2 < _SCATTER * most.astype(np.float64) ** 2
    every = np.concatenate([by_group[g] for g in np.flatnonzero(dense)] or [weighed[:0]])
    step = max(1, _DENSE_BYTES // (8 * q))
    for start in range(0, every.size, step):
        part = rows[every[start : start + step]].toarray()
        out += part.T @ part
    flat = out.reshape(-1)
    weighs, place = np.zeros(q, dtype=bool), np.zeros(q, dtype=np.int64)
    for g in np.flatnonzero(~dense).tolist():
        cells = by_group[g]
        weighs[rows[cells].indices] = True
        (members,) = np.nonzero(weighs)
        weighs[members] = False
        place[members] = np.arange(members.size)
        where = (members[:, None] * q + members).reshape(-1)
        step = max(1, _DENSE_BYTES // (8 * members.size))
        for start in range(0, cells.size, step):  # a large group's cells a part at a time
            part = rows[cells[start : start + step]]
            values = np.zeros((part.shape[0], members.size))
            lines = np.repeat(np.arange(part.shape[0]), np.diff(part.indptr))
            values[lines, place[part.indices]] = part.data
            flat[where] += (values.T @ values).reshape(-1)
    return out


def _mixed(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finaliser of ``values + 1``: distinct 64-bit keys that look random."""
    z = (values + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _compact(matrix: FloatArray, rows: int, columns: int, room: int) -> FloatArray:
    """A copy of ``matrix``'s leading ``rows`` x ``columns`` with ``room`` more of each (zero).

    Not the whole buffer: its room past them was never written, so no memory backs it, and a
    copy of it would be.
    """
    out = np.zeros((rows + room, columns + room))
    out[:rows, :columns] = matrix[:rows, :columns]
    return out


class _Terms:
    """Rank-one terms ``a v v^T`` held apart from a symmetric matrix (``K`` or ``K^{-1}``).

    The ``v`` are kept as the columns of a buffer (zero past each one's end: the matrix's order
    may have grown since), so that a product adds them in two small matrix-vector products.
    """

    __slots__ = ("_columns", "_coefficients", "count")

    def __init__(self) -> None:
        self._columns = np.zeros((0, _LOW_RANK))
        self._coefficients = np.zeros(_LOW_RANK)
        self.count = 0

    def copy(self) -> _Terms:
        """An independent copy (a solver's copy adds its own terms)."""
        other = _Terms()
        other._columns = self._columns[:, : self.count].copy()
        other._coefficients = self._coefficients[: self.count].copy()
        other.count = self.count
        return other

    def add(self, v: FloatArray, a: float) -> None:
        """Hold ``a v v^T`` too."""
        rows, width = self._columns.shape
        if v.size > rows or self.count == width:
            wider = max(2 * width, _LOW_RANK) if self.count == width else width
            columns = np.zeros((max(rows, v.size), wider))
            columns[:rows, : self.count] = self._columns[:, : self.count]
            coefficients = np.zeros(columns.shape[1])
            coefficients[: self.count] = self._coefficients[: self.count]
            self._columns, self._coefficients = columns, coefficients
        self._columns[: v.size, self.count] = v
        self._columns[v.size :, self.count] = 0.0
        self._coefficients[self.count] = a
        self.count += 1

    def plus_times(self, product: FloatArray, x: FloatArray) -> FloatArray:
        """``product + sum a v (v^T x)`` (in place, returned; ``x``: a vector or columns)."""
        if self.count:
            rows = min(x.shape[0], self._columns.shape[0])
            columns = self._columns[:rows, : self.count]
            coefficients = self._coefficients[: self.count]
            along = columns.T @ x[:rows]
            product[:rows] += columns @ (
                (coefficients[:, None] if x.ndim == 2 else coefficients) * along
            )
        return product

    def add_to(self, matrix: FloatArray) -> None:
        """Add the terms to ``matrix``'s lower triangle (a dsyrk per sign) and hold none."""
        n = matrix.shape[0]
        rows = min(n, self._columns.shape[0])
        coefficients = self._coefficients[: self.count]
        for sign in (1.0, -1.0):
            chosen = np.flatnonzero(coefficients * sign > 0.0)
            if chosen.size:
                scaled = np.zeros((n, chosen.size))
                scaled[:rows] = self._columns[:rows, chosen] * np.sqrt(coefficients[chosen] * sign)
                add_gram(matrix, scaled, alpha=sign)
        self.count = 0


def _grown(matrix: FloatArray, rows: int, columns: int, used: tuple[int, int]) -> FloatArray:
    """``matrix`` with room for ``rows`` x ``columns`` (doubling; new entries zero).

    ``used``: the leading block written (the rank, and the rank or the vectors placed), the
    only part copied: past it the buffer holds zeros, or a dropped copy's writes that no one
    reads. A restart leaves room for every vector it placed to join the basis (the demo
    cube's coordinates: 1,936 rows at rank 614): copied, and its new column cleared down
    every row, that room made the first statement placing a vector past the restart's
    columns take 70-100 ms rather than 17.
    """
    old_rows, old_columns = matrix.shape
    if rows <= old_rows and columns <= old_columns:
        return matrix
    out = np.zeros(
        (
            max(rows, 2 * old_rows) if rows > old_rows else old_rows,
            max(columns, 2 * old_columns) if columns > old_columns else old_columns,
        )
    )
    written_rows, written_columns = used
    out[:written_rows, :written_columns] = matrix[:written_rows, :written_columns]
    return out
