"""A dense query history and the weights of its linear estimators: BLUE (GLS) and OLS.

With ``y = H x + N``, ``N_i ~ Lap(S_i / alpha_i)``, a linear estimate ``t . y`` of ``q . x`` is
unbiased iff ``t H = q``. Writing ``t_i = u_i c_i`` turns the choice of ``t`` into the
minimum-norm solution of ``(C H)^T u = q`` with ``C = diag(c)``:

* BLUE (the second paper's eqs. 15-17, Gauss-Markov): ``c_i = alpha_i / S_i`` minimizes
  ``sum_i t_i^2 (S_i / alpha_i)^2``, the variance;
* OLS: ``c_i = 1`` minimizes ``sum_i t_i^2``, as ``q (H^T H)^+ H^T`` does, blind to budgets.

The solve goes through the eigendecomposition of the column-equilibrated Gram matrix, kept
until a row is appended; ``q`` is estimable when the solution reproduces it (relative residual
at most 1e-6, as in the engine). Pure numpy: an independent check on the engine's sparse BLUE.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sqlmap.vector import LinearQuery

__all__ = ["DenseHistory", "Weights", "ESTIMABLE"]

FloatArray = npt.NDArray[np.float64]

#: Relative residual ``||t H - q|| / ||q||`` up to which ``q`` counts as estimable.
ESTIMABLE = 1e-6
_RANK_TOL = 1e-11  # eigenvalues below this times the largest are taken as zero


@dataclass(frozen=True, slots=True)
class Weights:
    """``estimate = weights . y[rows]``; its error is ``sum_k scales[k] L_k``, ``L_k`` Laplace."""

    rows: npt.NDArray[np.int64]
    weights: FloatArray
    scales: FloatArray


class DenseHistory:
    """Rows ``H_i`` with budgets ``alpha_i`` and noisy answers ``y_i``; BLUE and OLS weights.

    Rows ``x0``, ``x1`` (budget 1) and ``x0 + x1`` (budget 1/2): the BLUE of ``x0`` weighs the
    sum by 1/6 (variance ``(1 - t)^2 + t^2 + 4 t^2``), OLS by 1/3.

    >>> history = DenseHistory(2)
    >>> for row, alpha, y in (([1.0, 0.0], 1.0, 10.0), ([0.0, 1.0], 1.0, 21.0),
    ...                       ([1.0, 1.0], 0.5, 30.0)):
    ...     history.append(LinearQuery.from_dense(row), alpha, y)
    >>> x0 = LinearQuery.from_dense([1.0, 0.0])
    >>> history.solve(x0, blue=True).weights.round(6).tolist()
    [0.833333, -0.166667, 0.166667]
    >>> history.solve(x0, blue=False).scales.round(6).tolist()
    [0.666667, 0.333333, 0.666667]
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._rows = np.zeros((16, n))
        self._alpha = np.zeros(16)
        self._sens = np.zeros(16)
        self._y = np.zeros(16)
        self.size = 0
        self._covered = np.zeros(n, dtype=bool)
        self._cache: dict[bool, tuple[FloatArray, FloatArray, FloatArray]] = {}

    @property
    def rows(self) -> FloatArray:
        """``H`` (``size x n``)."""
        return self._rows[: self.size]

    @property
    def alpha(self) -> FloatArray:
        """The budgets ``alpha_i``."""
        return self._alpha[: self.size]

    @property
    def sensitivity(self) -> FloatArray:
        """The sensitivities ``S_i``."""
        return self._sens[: self.size]

    @property
    def y(self) -> FloatArray:
        """The noisy answers ``y_i``."""
        return self._y[: self.size]

    def append(self, query: LinearQuery, alpha: float, y: float) -> None:
        """Add a measured row."""
        if self.size == self._alpha.size:
            grown = 2 * self.size
            self._rows = np.resize(self._rows, (grown, self.n))
            self._rows[self.size :] = 0.0
            for name in ("_alpha", "_sens", "_y"):
                setattr(self, name, np.resize(getattr(self, name), grown))
        self._rows[self.size, query.cells] = query.weights
        self._alpha[self.size] = alpha
        self._sens[self.size] = query.sensitivity
        self._y[self.size] = y
        self.size += 1
        self._covered[query.cells] = True
        self._cache.clear()

    def solve(self, query: LinearQuery, *, blue: bool) -> Weights | None:
        """The BLUE (``blue``) or OLS weights for ``query``, or ``None`` if not estimable."""
        if self.size == 0 or not self._covered[query.cells].all():
            return None
        c = self.alpha / self.sensitivity if blue else np.ones(self.size)
        if blue not in self._cache:
            self._cache[blue] = self._factor(c)
        scale, vectors, values = self._cache[blue]
        q = query.to_dense()
        coordinates = vectors.T @ (scale * q)
        u = (self.rows * c[:, None]) @ (scale * (vectors @ (coordinates / values)))
        t = u * c
        residual = np.linalg.norm(t @ self.rows - q) / np.linalg.norm(q)
        if not residual <= ESTIMABLE:
            return None
        (rows,) = np.nonzero(np.abs(t) > 1e-12 * np.abs(t).max())
        weights = t[rows]
        return Weights(rows, weights, np.abs(weights) * self.sensitivity[rows] / self.alpha[rows])

    def _factor(self, c: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Column scaling, and the eigenpairs of the scaled Gram matrix above the rank cut."""
        a = self.rows * c[:, None]
        norms = np.sqrt(np.square(a).sum(axis=0))
        scale = np.divide(1.0, norms, out=np.zeros(self.n), where=norms > 0)
        scaled = a * scale
        values, vectors = np.linalg.eigh(scaled.T @ scaled)
        keep = values > _RANK_TOL * values.max()
        return scale, vectors[:, keep], values[keep]
