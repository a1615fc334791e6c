"""Minimum-norm solutions of ``A u = q`` over cells, from a maintained sparse factorization.

The history index uses it when its span grows too large for the dense span solver
(:mod:`proxy.engine.span`): rows of a few scattered cells are independent, and a sparse LU
over them then costs far less. The cell-level reference engine of the tests uses it too.

``A`` has one column per history row (``D H`` transposed) and one equation per atom (cells every
column weighs alike: the caller says how many cells each stands for), scaled to unit norm (scaling
equations changes neither the solutions nor the minimum-norm one). Krylov methods need about as many
iterations as ``A`` has columns on these sparse, badly conditioned systems, so instead the
regularised normal equations are solved exactly through the quasi-definite saddle-point matrix
``K = [[I, A^T], [A, -mu I]]``: a sparse LU with a minimum-degree ordering has little fill-in and
needs no pivoting. Iterating ``u += A^T (A A^T + mu I)^{-1} (q - A u)`` ("iterated Tikhonov")
converges to the minimum-norm solution geometrically, fast once ``mu`` is small against ``A``'s
non-zero singular values.

Rows appended after the factorization are handled by bordering: the enlarged matrix is ``K``
bordered by the new columns ``B`` (and by ``-mu I`` for cells the factorization never saw), and
the Schur complement ``S = I - B^T K^{-1} B``, small and dense, solves it exactly at two sparse
solves per step. Each appended row costs one sparse solve; the factorization is rebuilt once
the border grows past a bound, so its cost is spread over many appends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.linalg
from scipy import sparse
from scipy.sparse import linalg as sparse_linalg

__all__ = ["MinNormSolver"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_MU = 1e-8  # regularisation, relative to the unit-norm equations
_MAX_BORDER = 256  # appended rows kept outside the factorization before it is rebuilt
_MAX_REFINEMENTS = 12
_TARGET_RESIDUAL = 1e-14


@dataclass(frozen=True, slots=True)
class _Base:
    """The factorization of ``K`` over the first ``rows`` columns and the ``cells`` they touch."""

    rows: int
    cells: IntArray
    lu: sparse_linalg.SuperLU


class _Columns:
    """``A`` in compressed columns, in buffers that double when full (appends stay O(1))."""

    def __init__(self) -> None:
        self.rows = 0
        self.nnz = 0
        self._indptr = np.zeros(16, dtype=np.int64)
        self._indices = np.zeros(64, dtype=np.int64)
        self._raw = np.zeros(64)  # unscaled entries, for re-equilibration
        self._data = np.zeros(64)  # entries times their equation's scale

    @property
    def indptr(self) -> IntArray:
        return self._indptr[: self.rows + 1]

    @property
    def indices(self) -> IntArray:
        return self._indices[: self.nnz]

    @property
    def raw(self) -> FloatArray:
        return self._raw[: self.nnz]

    @property
    def data(self) -> FloatArray:
        return self._data[: self.nnz]

    def rescale(self, scale: FloatArray) -> None:
        self._data[: self.nnz] = self.raw * scale[self.indices]

    def append(self, cells: IntArray, raw: FloatArray, scaled: FloatArray) -> None:
        end = self.nnz + cells.size
        if end > self._indices.size:
            grown = max(end, 2 * self._indices.size)
            self._indices = np.resize(self._indices, grown)
            self._raw = np.resize(self._raw, grown)
            self._data = np.resize(self._data, grown)
        if self.rows + 2 > self._indptr.size:
            self._indptr = np.resize(self._indptr, 2 * self._indptr.size)
        self._indices[self.nnz : end] = cells
        self._raw[self.nnz : end] = raw
        self._data[self.nnz : end] = scaled
        self.rows += 1
        self.nnz = end
        self._indptr[self.rows] = end

    def copy(self) -> _Columns:
        other = _Columns.__new__(_Columns)
        other.rows, other.nnz = self.rows, self.nnz
        other._indptr = self._indptr.copy()
        other._indices = self._indices.copy()
        other._raw = self._raw.copy()
        other._data = self._data.copy()
        return other


class MinNormSolver:
    """Minimum-norm ``u`` with ``A u = q``, where column ``i`` of ``A`` is appended row ``i``.

    >>> solver = MinNormSolver(3)
    >>> solver.add_row(np.array([0, 1]), np.array([1.0, 1.0]))
    >>> solver.add_row(np.array([1]), np.array([1.0]))
    >>> u, residual = solver.solve(np.array([0]), np.array([1.0]))
    >>> u.round(9).tolist(), residual < 1e-12
    ([1.0, -1.0], True)
    """

    def __init__(self, n_cells: int, multiplicity: FloatArray | None = None) -> None:
        """Equations over ``n_cells`` cells or atoms; ``multiplicity`` says how many cells each.

        An atom's size (1 each if omitted) weighs only the residual, reported over cells.
        """
        self.n_cells = n_cells
        self._root_multiplicity = None if multiplicity is None else np.sqrt(multiplicity)
        self._columns = _Columns()
        self._scale = np.zeros(n_cells)  # equation scaling per cell; 0 until a row touches it
        self._matrix: sparse.csc_array | None = None
        self._base: _Base | None = None
        self._schur = np.zeros((0, 0))  # S = I - B^T K^{-1} B over the border rows
        self._schur_lu: tuple[FloatArray, npt.NDArray[np.int32]] | None = None

    @property
    def rows(self) -> int:
        """The number of columns of ``A``."""
        return self._columns.rows

    def covered(self, cells: IntArray) -> bool:
        """Whether some row touches every one of ``cells`` (else nothing non-zero is solvable)."""
        return bool(np.all(self._scale[cells] > 0))

    def touched(self, cells: IntArray) -> npt.NDArray[np.bool_]:
        """For each of ``cells``, whether some row touches it."""
        return self._scale[cells] > 0

    def reweigh(self, multiplicity: FloatArray) -> None:
        """How many cells each equation now stands for (equations no row touches may change)."""
        self._root_multiplicity = np.sqrt(multiplicity)

    def copy(self) -> MinNormSolver:
        """An independent solver with the same rows (sharing the immutable factorization)."""
        other = MinNormSolver.__new__(MinNormSolver)
        other.n_cells = self.n_cells
        other._root_multiplicity = self._root_multiplicity
        other._columns = self._columns.copy()
        other._scale = self._scale.copy()
        other._matrix = None  # a view of this solver's buffers: the copy builds its own
        other._base = self._base
        other._schur = self._schur.copy()
        other._schur_lu = self._schur_lu
        return other

    def prepare(self) -> None:
        """Factor now (a solve would otherwise do it), e.g. right after loading a history."""
        if self._base is None and self.rows:
            self._refactor()

    def add_row(self, cells: IntArray, values: FloatArray) -> None:
        """Append a column of ``A`` (a history row ``alpha/S * H_i``, sparse over cells)."""
        fresh = self._scale[cells] == 0
        # A new cell's equation is scaled by its first entry: no earlier row touches it.
        self._scale[cells[fresh]] = 1.0 / np.abs(values[fresh])
        scaled = values * self._scale[cells]
        self._columns.append(cells, values, scaled)
        self._matrix = None
        if self._base is None:
            return
        if self.rows - self._base.rows > _border_limit(self._base.rows):
            self._base = None  # rebuilt at the next solve
            return
        self._extend_border(cells, scaled)

    def solve(self, cells: IntArray, values: FloatArray) -> tuple[FloatArray, float]:
        """Minimum-norm ``u`` for ``q`` given sparsely, and ``||A u - q|| / ||q||`` unscaled."""
        (u,), (residual,) = self.solve_many([(cells, values)])
        return u, residual

    def solve_many(
        self, queries: Sequence[tuple[IntArray, FloatArray]]
    ) -> tuple[list[FloatArray], list[float]]:
        """:meth:`solve` for several ``q`` at once: each sparse solve takes them all as columns.

        ``u`` is kept as ``-A^T lambda``: the solves' rounding errors then cannot leave a
        null-space component in ``u`` that no residual would reveal. Each ``q`` stops refining
        on its own test, as if solved alone.
        """
        for cells, _ in queries:
            if not self.covered(cells):
                raise ValueError("q has a cell no row touches")
        if self._base is None:
            self._refactor()
        matrix = self._scaled_matrix()
        k = len(queries)
        target = np.zeros((self.n_cells, k))
        for j, (cells, values) in enumerate(queries):
            target[cells, j] = values * self._scale[cells]
        target_norm = np.linalg.norm(target, axis=0)
        multipliers = np.zeros((self.n_cells, k))
        u = np.zeros((self.rows, k))
        residual, norm = target.copy(), target_norm.copy()
        active = np.arange(k)
        for _ in range(_MAX_REFINEMENTS):
            multipliers[:, active] += self._correction(residual[:, active], matrix)
            u[:, active] = -(matrix.T @ multipliers[:, active])
            residual[:, active] = target[:, active] - matrix @ u[:, active]
            previous = norm[active]
            norm[active] = np.linalg.norm(residual[:, active], axis=0)
            done = (norm[active] <= _TARGET_RESIDUAL * target_norm[active]) | (
                norm[active] > previous / 2
            )
            active = active[~done]
            if active.size == 0:
                break
        touched = self._scale > 0  # A u and q both vanish on the other cells
        error = residual[touched] / self._scale[touched, None]
        if self._root_multiplicity is not None:
            error *= self._root_multiplicity[touched, None]
        errors = np.linalg.norm(error, axis=0)
        residuals = []
        for j, (cells, values) in enumerate(queries):
            norm_q = values
            if self._root_multiplicity is not None:
                norm_q = values * self._root_multiplicity[cells]
            residuals.append(float(errors[j]) / float(np.linalg.norm(norm_q)))
        return [u[:, j] for j in range(k)], residuals

    def _scaled_matrix(self) -> sparse.csc_array:
        if self._matrix is None:
            columns = self._columns
            self._matrix = sparse.csc_array(
                (columns.data, columns.indices, columns.indptr), shape=(self.n_cells, self.rows)
            )
        return self._matrix

    def _refactor(self) -> None:
        """Factor ``K`` over all rows so far, with equations rescaled to unit norm."""
        columns = self._columns
        sums = np.bincount(columns.indices, weights=np.square(columns.raw), minlength=self.n_cells)
        (cells,) = np.nonzero(sums)
        self._scale = np.zeros(self.n_cells)
        self._scale[cells] = 1.0 / np.sqrt(sums[cells])
        columns.rescale(self._scale)
        self._matrix = None
        m = self.rows
        local = sparse.csc_array(
            (columns.data, np.searchsorted(cells, columns.indices), columns.indptr),
            shape=(cells.size, m),
        )
        saddle = sparse.block_array(
            [[sparse.eye_array(m), local.T], [local, -_MU * sparse.eye_array(cells.size)]],
            format="csc",
        )
        lu = sparse_linalg.splu(
            saddle,
            permc_spec="MMD_AT_PLUS_A",
            diag_pivot_thresh=0.0,
            options={"SymmetricMode": True},
        )
        self._base = _Base(m, cells, lu)
        self._schur = np.zeros((0, 0))
        self._schur_lu = None

    def _base_solve(self, residual: FloatArray) -> FloatArray:
        """The ``lambda`` part of ``K'^{-1} [0; r]`` (``K'``: ``K`` plus ``-mu`` on new cells).

        ``r`` may hold several right-hand sides as columns.
        """
        assert self._base is not None
        base = self._base
        out = residual / -_MU
        rhs = np.concatenate([np.zeros((base.rows, *residual.shape[1:])), residual[base.cells]])
        out[base.cells] = base.lu.solve(rhs)[base.rows :]
        return out

    def _extend_border(self, cells: IntArray, scaled: FloatArray) -> None:
        """Border the factorization with the just-appended column ``b`` of ``A``."""
        column = np.zeros(self.n_cells)
        column[cells] = scaled
        w = self._base_solve(column)
        k = self._schur.shape[0]
        # B^T K'^{-1} b for every border column, the new one last: S gains it, negated.
        coupling = (self._scaled_matrix().T @ w)[self.rows - k - 1 :]
        s = np.zeros((k + 1, k + 1))
        s[:k, :k] = self._schur
        s[:k, k] = s[k, :k] = -coupling[:k]
        s[k, k] = 1.0 - coupling[k]
        self._schur = s
        self._schur_lu = scipy.linalg.lu_factor(s)

    def _correction(self, residual: FloatArray, matrix: sparse.csc_array) -> FloatArray:
        """The ``lambda`` with ``-A^T lambda = A^T (A A^T + mu I)^{-1} r``, base and border.

        With ``z0 = K'^{-1} [0; r]`` the border unknowns are ``v = -S^{-1} B^T z0`` and the
        rest is ``z0 - K'^{-1} B v``.
        """
        z0 = self._base_solve(residual)
        k = self._schur.shape[0]
        if k == 0:
            return z0
        assert self._schur_lu is not None
        first = self.rows - k
        v = -scipy.linalg.lu_solve(self._schur_lu, (matrix.T @ z0)[first:])
        return z0 - self._base_solve(matrix @ np.concatenate([np.zeros((first, *v.shape[1:])), v]))


def _border_limit(base_rows: int) -> int:
    """Border rows allowed before refactoring: small systems refactor cheaply, so sooner."""
    return min(_MAX_BORDER, max(16, base_rows // 2))
