"""Estimability of a query from the history, and its best linear unbiased estimate (BLUE).

With ``y = H x + N``, ``N_i ~ Lap(S_i / alpha_i)``, an unbiased linear estimate ``t . y`` of
``q . x`` needs ``t H = q``; its error ``sum_i t_i N_i`` has variance
``2 sum_i t_i^2 (S_i/alpha_i)^2``. Gauss-Markov (the papers' eqs. 15-17) picks the ``t`` of least
variance. Substituting ``u_i = t_i S_i / alpha_i`` turns that into the minimum-norm solution of
``(D H)^T u = q`` with ``D = diag(alpha ./ S)`` (:mod:`proxy.engine.solver`, never forming a
dense matrix); ``|u_i|`` are then exactly the Laplace scales ``b_i`` of the error. ``q`` is
estimable iff that system is consistent, judged by its relative residual; a query touching a
cell no row covers is rejected without solving.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from proxy.engine.solver import MinNormSolver
from sqlmap.vector import LinearQuery

__all__ = ["Solution", "HistoryIndex", "ESTIMABLE_RESIDUAL"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Relative residual ||t H - q|| / ||q|| up to which q counts as in the row space of H. The solver
# refines to 1e-14, so consistent systems land far below this and inconsistent ones far above.
ESTIMABLE_RESIDUAL = 1e-6
_CACHE_SIZE = 128  # a solution may hold a weight for every row
# Stamps are unique across copies, so a cache shared by copies never confuses two histories.
_STAMPS = itertools.count()


@dataclass(frozen=True, slots=True)
class Solution:
    """The BLUE of an estimable query: ``estimate = sum_k weights[k] * y[rows[k]]``.

    Attributes:
        rows: history row indices with non-zero weight.
        weights: ``t_k``, so that ``t H = q`` (to ``residual``).
        scales: ``b_k = |t_k| S_k / alpha_k``, the Laplace scales of the error terms.
        shift: ``sum_k |t_k| step_k``: how far lattice noise can move the error from its
            continuous-Laplace coupling.
        residual: ``||t H - q|| / ||q||``.
    """

    rows: IntArray
    weights: FloatArray
    scales: FloatArray
    shift: float
    residual: float

    def __post_init__(self) -> None:
        if not (self.rows.shape == self.weights.shape == self.scales.shape):
            raise ValueError("rows, weights and scales must align")
        if self.shift < 0 or not 0 <= self.residual <= ESTIMABLE_RESIDUAL:
            raise ValueError("shift must be >= 0 and the residual within the estimable bound")
        for array in (self.rows, self.weights, self.scales):
            array.flags.writeable = False  # solutions are cached and shared

    @property
    def variance(self) -> float:
        """``Var(t . y) = 2 sum_k b_k^2`` (the papers' eq. 17)."""
        return 2.0 * float(np.square(self.scales).sum())

    def estimate(self, noisy_answers: FloatArray) -> float:
        """``t . y`` for the vector ``y`` of all released answers, indexed by row."""
        return float(self.weights @ noisy_answers[self.rows])

    def __repr__(self) -> str:
        return (
            f"Solution(terms={self.rows.size}, variance={self.variance:.6g}, "
            f"shift={self.shift:.3g}, residual={self.residual:.1e})"
        )


_EMPTY = Solution(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), shift=0.0, residual=0.0)


class HistoryIndex:
    """The history matrix ``H`` with budgets and noise steps, answering BLUEs.

    >>> index = HistoryIndex(2)
    >>> for row in ([1.0, 0.0], [0.0, 1.0]):
    ...     _ = index.append(LinearQuery.from_dense(row), alpha=1.0, step=0.01)
    >>> index.solve(LinearQuery.from_dense([1.0, 1.0])).weights.round(6).tolist()
    [1.0, 1.0]
    >>> index.solve(LinearQuery.from_dense([0.0, 0.0])).rows.size  # the zero query: free
    0
    """

    def __init__(self, n_cells: int) -> None:
        if n_cells <= 0:
            raise ValueError("n_cells must be positive")
        self.n_cells = n_cells
        self._solver = MinNormSolver(n_cells)
        self._precision: list[float] = []  # alpha_i / S_i
        self._steps: list[float] = []
        self._stamp = next(_STAMPS)
        self._solutions: OrderedDict[tuple[int, bytes], Solution | None] = OrderedDict()

    @property
    def size(self) -> int:
        """The number of history rows ``m``."""
        return len(self._precision)

    def copy(self) -> HistoryIndex:
        """An independent index with the same rows (the solution cache is shared)."""
        other = HistoryIndex.__new__(HistoryIndex)
        other.n_cells = self.n_cells
        other._solver = self._solver.copy()
        other._precision = list(self._precision)
        other._steps = list(self._steps)
        other._stamp = self._stamp
        other._solutions = self._solutions
        return other

    def append(self, query: LinearQuery, *, alpha: float, step: float) -> int:
        """Add row ``H_m = query``, measured with ``alpha`` on lattice ``step``; returns ``m``."""
        if query.n_cells != self.n_cells or query.cells.size == 0:
            raise ValueError("a history row is a non-zero vector over this table's cells")
        if not (alpha > 0 and step > 0):
            raise ValueError("alpha and step must be positive")
        precision = alpha / query.sensitivity
        self._solver.add_row(query.cells, query.weights * precision)
        self._precision.append(precision)
        self._steps.append(step)
        self._stamp = next(_STAMPS)
        return self.size - 1

    def solve(self, query: LinearQuery) -> Solution | None:
        """The BLUE of ``query . x`` from the history, or ``None`` if it is not estimable."""
        if query.n_cells != self.n_cells:
            raise ValueError("query is over a different number of cells")
        if query.cells.size == 0:
            return _EMPTY
        if not self._solver.covered(query.cells):
            return None
        key = (self._stamp, query.cells.tobytes() + query.weights.tobytes())
        if key in self._solutions:
            self._solutions.move_to_end(key)
            return self._solutions[key]
        solution = self._solve(query)
        self._solutions[key] = solution
        if len(self._solutions) > _CACHE_SIZE:
            self._solutions.popitem(last=False)
        return solution

    def _solve(self, query: LinearQuery) -> Solution | None:
        u, residual = self._solver.solve(query.cells, query.weights)
        if not residual <= ESTIMABLE_RESIDUAL:
            return None
        (rows,) = np.nonzero(u)
        u = u[rows]
        t = u * np.asarray(self._precision)[rows]
        return Solution(
            rows.astype(np.int64),
            t,
            np.abs(u),
            shift=float(np.abs(t) @ np.asarray(self._steps)[rows]),
            residual=residual,
        )
