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
  Their Gram matrix ``G = H_B^T H_B`` over cells is kept with its Cholesky factor, bordered by
  one row per new basis vector (inner products of lattice weights are exact in floating point);
- *coordinates*: ``h_j = H_B beta_j``, with ``beta_j = e_j`` for a basis vector and
  ``G^{-1} H_B^T h_j`` for the others;
- a query is in the span iff its squared distance ``||q||^2 - b^T G^{-1} b`` (``b = H_B^T q``)
  vanishes, and then ``q = H_B beta_q`` with ``beta_q = G^{-1} b``;
- the constraint reads ``sum_j u_j c_j beta_j = beta_q``, whose minimum-norm solution is
  ``u_j = c_j beta_j^T y`` with ``K y = beta_q``, ``K = sum_j c_j^2 beta_j beta_j^T``. ``K`` is
  positive definite (each basis vector puts ``c_j^2`` on its diagonal alone), changes by one
  rank-one term per measurement, is kept densely and factored again at the next solve after a
  change (``r^3 / 3`` flops).

A solve costs the basis vectors' weights on the query's cells (a sparse row slice) and a few
triangular solves of order ``r``; each solve with ``G`` or ``K`` is refined once against the
matrix itself, so distances and weights are accurate to rounding, not to the conditioning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.linalg
from scipy import sparse

__all__ = ["SpanSolver"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

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
_PENDING = 32  # basis vectors kept outside the sparse row index before it is rebuilt
_MAX_UPDATES = 48  # terms added to K's factorization as updates before it is factored anew
_REWEIGH = 8  # pending rank-one terms of K, as a fraction of r, past which K is formed anew


@dataclass(frozen=True, slots=True)
class _Update:
    """A term ``weight z z^T`` added to a factored ``K``.

    A rank-one term, or a border: ``border`` is then the new diagonal entry ``d`` of ``z``,
    and ``z`` the part above it.
    """

    weight: float
    z: FloatArray
    border: float
    v: FloatArray  # K^{-1} z before this term (rank-one terms)
    denominator: float  # 1 + weight z^T v


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
        self._gram = np.zeros((0, 0))  # G over the basis
        self._lower = np.zeros((0, 0), order="F")  # its Cholesky factor L (LAPACK's order)
        self._coords = np.zeros((16, 16))  # z_j = L^T beta_j of every vector, as columns
        self._weight2 = np.zeros(16)  # c_j^2
        self._k = np.zeros((0, 0))  # K = sum_j c_j^2 z_j z_j^T, up to the pending terms
        self._k_pending: list[tuple[int, float]] = []
        self._k_base: tuple[FloatArray, bool] | None = None  # Cholesky of K at some point
        self._k_updates: list[_Update] = []  # the terms added to K since
        self._k_dim = 0  # the order of K the updates reach
        self._index: sparse.csr_array | None = None  # cells x (indexed basis vectors)
        self._indexed = 0

    def copy(self) -> SpanSolver:
        """An independent solver with the same vectors (sharing the immutable row index)."""
        other = SpanSolver.__new__(SpanSolver)
        other.__dict__.update(self.__dict__)
        other._vectors = list(self._vectors)
        other._queue = list(self._queue)
        other._k_pending = list(self._k_pending)
        other._k_updates = list(self._k_updates)
        for name in ("_gram", "_lower", "_coords", "_weight2", "_k"):
            setattr(other, name, getattr(self, name).copy(order="K"))
        return other

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

    def add(self, cells: IntArray, weights: FloatArray) -> int:
        """A new distinct vector (weight 0 until :meth:`weigh`); returns its index ``j``.

        It is placed in the span (basis or coordinates) at the next solve, with the others
        added meanwhile: a restart places its whole history in blocks.
        """
        j = self.size
        if j == self._weight2.size:
            self._weight2 = np.concatenate([self._weight2, np.zeros(j)])
        self._queue.append((cells, weights))
        self.size += 1
        return j

    def _place(self) -> None:
        """Give the queued vectors coordinates, extending the basis by the new directions.

        A block is measured against the basis as it stood before it; a vector found in that
        span is placed at once (later basis vectors give it zero coordinates), the others one
        by one against the basis as it grows.
        """
        queue, self._queue = self._queue, []
        for start in range(0, len(queue), _BLOCK):
            if self.overflowed:
                return
            block = queue[start : start + _BLOCK]
            r = self._rank
            first = self._placed
            self._coords = _grown(self._coords, r + len(block), first + len(block))
            inner = self._inner(block)
            beta, distances = self._project(block, inner)
            for k, (cells, weights) in enumerate(block):
                if distances[k] <= _INDEPENDENT * float(np.linalg.norm(weights)):
                    self._coords[:r, first + k] = self._lower[:r, :r].T @ beta[:, k]
                else:
                    self._place_one(first + k, cells, weights, inner[:, k])
            self._placed = first + len(block)

    def _place_one(self, j: int, cells: IntArray, weights: FloatArray, known: FloatArray) -> None:
        """Place vector ``j`` against the current basis.

        ``known`` holds its inner products with the basis vectors before its block.
        """
        r = self._rank
        inner = np.empty((r, 1))
        inner[: known.size, 0] = known
        if known.size < r:
            dense = np.zeros(self.n_cells)
            dense[cells] = weights
            for i in range(known.size, r):
                basis_cells, basis_weights = self._vectors[i]
                inner[i, 0] = dense[basis_cells] @ basis_weights
        beta, distance = self._project([(cells, weights)], inner)
        if r:
            self._coords[:r, j] = self._lower.T @ beta[:, 0]
        if distance[0] > _INDEPENDENT * float(np.linalg.norm(weights)):
            if self._max_rank is not None and (
                r == self._max_rank or (r >= _SPARSE_FROM and r * r > _SPARSE * self._basis_nnz)
            ):
                self.overflowed = True
                return
            self._basis_nnz += cells.size
            self._coords[r, j] = distance[0]
            self._gram = _bordered(self._gram, inner[:, 0], float(weights @ weights))
            lower = np.zeros((r + 1, r + 1), order="F")
            lower[:r, :r] = self._lower
            lower[r] = self._coords[: r + 1, j]
            self._lower = lower
            self._k = _bordered(self._k, np.zeros(r), 0.0)
            self._vectors.append((cells, weights))
            self._rank += 1

    def weigh(self, j: int, weight2: float) -> None:
        """Add ``weight2`` to ``c_j^2`` (a row of vector ``j`` measured with that precision)."""
        self._weight2[j] += weight2
        self._k_pending.append((j, weight2))

    def prepare(self) -> None:
        """Bring ``K`` and its solver up to date now rather than at the next solve.

        A few new terms are added to the factorization as updates (a rank-one term by
        Sherman-Morrison, a new basis vector by bordering), each at the cost of one solve;
        past ``_MAX_UPDATES`` of them, or with many terms at once (a restart), ``K`` is formed
        and factored anew.
        """
        self._place()
        if not self._k_pending or not self._rank:
            return
        r, z = self._rank, self._coords
        pending, self._k_pending = self._k_pending, []
        if _REWEIGH * len(pending) > r:
            coords = z[:r, : self.size]
            self._k = (coords * self._weight2[: self.size]) @ coords.T
        else:  # one rank-k product (BLAS 3), not k outer products
            columns = z[:r, [j for j, _ in pending]]
            self._k += (columns * np.array([w for _, w in pending])) @ columns.T
        if self._k_base is not None and len(self._k_updates) + len(pending) <= _MAX_UPDATES:
            for j, weight2 in pending:
                if not self._update(z[:r, j], weight2):
                    break
            else:
                return
        self._k_base = scipy.linalg.cho_factor(self._k, check_finite=False)
        self._k_updates = []
        self._k_dim = r

    def _update(self, z: FloatArray, weight2: float) -> bool:
        """Add ``weight2 z z^T`` to the factored ``K``; False if ``z`` reaches past a border."""
        (nonzero,) = np.nonzero(z)
        top = int(nonzero[-1]) if nonzero.size else -1
        n = self._k_dim
        if top < n:
            v = self._k_solve(z[:n, None])[:, 0]
            self._k_updates.append(
                _Update(weight2, z[:n].copy(), 0.0, v, 1.0 + weight2 * float(z[:n] @ v))
            )
        elif top == n:
            self._k_updates.append(_Update(weight2, z[:n].copy(), float(z[n]), z[:0], 1.0))
            self._k_dim = n + 1
        else:
            return False
        return True

    def _k_solve(self, target: FloatArray) -> FloatArray:
        """``K^{-1} target`` (columns) through the factorization and its updates.

        A border ``K' = [[K + w l l^T, w d l], [w d l^T, w d^2]]`` is ``E diag(K, w d^2) E^T``
        with ``E = [[I, l/d], [0, 1]]``; a rank-one term is Sherman-Morrison's.
        """
        assert self._k_base is not None
        lasts = []
        for update in reversed(self._k_updates):
            if update.border:
                lasts.append(target[-1])
                target = target[:-1] - np.outer(update.z, target[-1] / update.border)
        x: FloatArray = scipy.linalg.cho_solve(self._k_base, target, check_finite=False)
        for update in self._k_updates:
            if update.border:
                last = (
                    lasts.pop() / (update.weight * update.border**2)
                    - (update.z @ x) / update.border
                )
                x = np.vstack([x, last[None]])
            else:
                x -= np.outer(update.v, update.weight * (update.z @ x) / update.denominator)
        return x

    def solve_many(
        self, queries: Sequence[tuple[IntArray, FloatArray]]
    ) -> tuple[list[FloatArray | None], list[float]]:
        """Per query, ``z_j^T y`` for every vector ``j`` and ``||q - proj q|| / ||q||``.

        Queries farther than ``residual`` from the span get ``None`` (not solved).
        """
        self._place()
        r = self._rank
        found: list[FloatArray | None] = [None] * len(queries)
        if r == 0:
            return found, [1.0] * len(queries)
        beta, distances = self._project(queries, self._inner(queries))
        residuals = distances / np.array([float(np.linalg.norm(w)) for _, w in queries])
        inside = residuals <= self._residual
        if np.any(inside):
            self.prepare()
            target = self._lower.T @ beta[:, inside]
            y = self._k_solve(target)
            y += self._k_solve(target - self._k @ y)
            per_vector = self._coords[:r, : self.size].T @ y
            for column, i in enumerate(np.flatnonzero(inside).tolist()):
                found[i] = per_vector[:, column]
        return found, residuals.tolist()

    def _project(
        self, vectors: Sequence[tuple[IntArray, FloatArray]], inner: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """``beta = G^{-1} H_B^T v`` (refined once) and ``||v - H_B beta||``, per vector.

        The distance is measured over the cells, not as ``||v||^2 - b^T beta``: that
        difference cancels, and its rounding would reach 1e-5 of ``||v||`` on these histories.
        """
        r = self._rank
        if r == 0:
            return np.zeros((0, len(vectors))), np.array(
                [float(np.linalg.norm(w)) for _, w in vectors]
            )
        factor = (self._lower, True)
        beta = scipy.linalg.cho_solve(factor, inner, check_finite=False)
        beta += scipy.linalg.cho_solve(factor, inner - self._gram @ beta, check_finite=False)
        index, indexed = self._basis_index()
        fitted = index @ beta[:indexed]
        for i in range(indexed, r):  # basis vectors not indexed yet
            cells, weights = self._vectors[i]
            fitted[cells] += np.outer(weights, beta[i])
        for k, (cells, weights) in enumerate(vectors):
            fitted[cells, k] -= weights
        return beta, np.linalg.norm(fitted, axis=0)

    def _basis_index(self) -> tuple[sparse.csr_array, int]:
        """The first basis vectors as the columns of a cells x (their count) sparse matrix.

        Rebuilt once more than ``_PENDING`` basis vectors have joined since; those are used
        from their own cells meanwhile.
        """
        r = self._rank
        if self._index is None or r - self._indexed > _PENDING:
            self._index = _row_index(self._vectors, self.n_cells)
            self._indexed = r
        return self._index, self._indexed

    def _inner(self, vectors: Sequence[tuple[IntArray, FloatArray]]) -> FloatArray:
        """``H_B^T v`` for each vector ``v`` (columns), from the cells each touches."""
        r = self._rank
        out = np.zeros((r, len(vectors)))
        if r == 0:
            return out
        index, indexed = self._basis_index()
        if len(vectors) == 1:
            cells, weights = vectors[0]
            out[:indexed, 0] = index[cells].T @ weights
        else:  # one sparse product for the batch
            out[:indexed] = (index.T @ _row_index(list(vectors), self.n_cells).tocsc()).toarray()
        dense = np.zeros(self.n_cells)
        for k, (cells, weights) in enumerate(vectors):
            if indexed < r:
                dense[cells] = weights
                for i in range(indexed, r):
                    basis_cells, basis_weights = self._vectors[i]
                    out[i, k] = dense[basis_cells] @ basis_weights
                dense[cells] = 0.0
        return out


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


def _grown(matrix: FloatArray, rows: int, columns: int) -> FloatArray:
    """``matrix`` with room for ``rows`` x ``columns`` (doubling; new entries zero)."""
    old_rows, old_columns = matrix.shape
    if rows <= old_rows and columns <= old_columns:
        return matrix
    out = np.zeros(
        (
            max(rows, 2 * old_rows) if rows > old_rows else old_rows,
            max(columns, 2 * old_columns) if columns > old_columns else old_columns,
        )
    )
    out[:old_rows, :old_columns] = matrix
    return out


def _bordered(matrix: FloatArray, border: FloatArray, corner: float) -> FloatArray:
    """The symmetric ``[[matrix, border], [border^T, corner]]``."""
    r = matrix.shape[0]
    out = np.empty((r + 1, r + 1))
    out[:r, :r] = matrix
    out[r, :r] = out[:r, r] = border
    out[r, r] = corner
    return out
