"""The first paper's inference: greedy linear representations and a Bayesian posterior.

Alg. 2 (greedy representations). Scan the history's rows in order, ``k = 1 .. m``; as soon as
``T H(1:k) = Q`` has a solution over the rows not yet used, record the observation
``theta_i = T y`` and zero the rows ``T`` involves; keep scanning from ``k + 1``. The paper
takes ``T = Q / H(1:k)`` (MATLAB); here ``T`` is the solution over the *pivot* rows: the
first rows of the prefix, in order, that add rank (a Gram-Schmidt basis). It is unique given
them, and it is a basic solution, as MATLAB's is. The first scan over all rows uses a basis of
the whole history kept up to date as rows are appended; after rows are zeroed, the basis is
rebuilt from the first zeroed row on.

Alg. 3-6 (posterior). Observation ``i`` is ``theta + N_i`` with ``N_i = sum_k t_k Ntilde_k``,
independent across observations (they share no row). Each ``N_i``'s probability function comes
from the binned convolution of Alg. 6 (unit bins, truncation ``gamma = 0.01`` as the second
paper's Alg. 2; :meth:`proxy.engine.tails.ConvolutionTail.pmf`). With the flat prior the
posterior is ``prod_i f_{N_i}(theta_i - theta)`` (Thm 3.3-3.5), evaluated on a unit grid
(linear interpolation between bin centres); the estimate is its mean (MMSE, eq. 38), and the
credible interval grows bin by bin from the estimate towards the more probable side until it
holds ``1 - delta`` (Alg. 4), and runs from its first to its last bin centre (``L <- a``,
``U <- b``), as the paper's does.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import linalg

from proxy.engine.tails import ConvolutionTail
from sqlmap.vector import LinearQuery

__all__ = ["Observation", "GreedyHistory", "posterior"]

FloatArray = npt.NDArray[np.float64]

_DEPENDENT = 1e-10  # squared distance to the span, relative to the squared norm
_SPANNED = 1e-8  # residual of Q against the span, relative to its norm
_NEGLIGIBLE = 1e-9  # coefficients of T below this times the largest are rounding


@dataclass(frozen=True, slots=True)
class Observation:
    """``theta_i = weights . y[rows]``; its noise is ``sum_k scales[k] L_k``."""

    rows: npt.NDArray[np.int64]
    weights: FloatArray
    value: float
    scales: FloatArray


class _Basis:
    """An orthonormal basis ``E`` of some rows, built in row order: ``H_P = L E``.

    ``owners[r]`` is the row whose turn added ``E[r]`` (a *pivot* row); ``L`` is lower
    triangular (Gram-Schmidt's coefficients), so the first ``p`` vectors depend only on the
    first ``p`` pivots, and ``Q = a E`` is ``(a L^-1) H_P``.
    """

    def __init__(self, n: int) -> None:
        self.E = np.zeros((n, n))
        self.L = np.zeros((n, n))
        self.owners: list[int] = []

    @property
    def rank(self) -> int:
        return len(self.owners)

    def prefix(self, count: int) -> _Basis:
        """A copy holding the first ``count`` vectors."""
        other = _Basis.__new__(_Basis)
        other.E = self.E.copy()
        other.L = self.L.copy()
        other.owners = self.owners[:count]
        return other

    def add(self, j: int, query: LinearQuery, dense: FloatArray) -> bool:
        """Fold in row ``j``; whether it added rank."""
        r = self.rank
        if r == self.E.shape[0]:
            return False
        norm2 = float(query.weights @ query.weights)
        c = self.E[:r, query.cells] @ query.weights
        if norm2 - float(c @ c) <= _DEPENDENT * norm2:
            return False
        v = dense - c @ self.E[:r]
        norm = float(np.linalg.norm(v))
        if norm * norm < 0.5 * norm2:  # cancellation: re-orthogonalize once (twice is enough)
            again = self.E[:r] @ v
            v -= again @ self.E[:r]
            c += again
            norm = float(np.linalg.norm(v))
        if norm * norm <= _DEPENDENT * norm2:
            return False
        self.E[r] = v / norm
        self.L[r, :r] = c
        self.L[r, r:] = 0.0
        self.L[r, r] = norm
        self.owners.append(j)
        return True

    def spans(self, q: FloatArray, q_norm: float) -> bool:
        r = self.rank
        residual = q - (self.E[:r] @ q) @ self.E[:r]
        return bool(np.linalg.norm(residual) <= _SPANNED * q_norm)

    def representation(self, q: FloatArray, rows: int, count: int | None = None) -> FloatArray:
        """``T`` with ``T H = q`` over the pivot rows of the first ``count`` vectors."""
        r = self.rank if count is None else count
        on_pivots = linalg.solve_triangular(self.L[:r, :r], self.E[:r] @ q, trans="T", lower=True)
        t = np.zeros(rows)
        t[self.owners[:r]] = on_pivots
        t[np.abs(t) <= _NEGLIGIBLE * np.abs(t).max(initial=0.0)] = 0.0
        return t


class GreedyHistory:
    """The history ``H, y, alpha, S`` and the paper's Alg. 2 over it.

    The running example of the online paper (eqs. 10-30): ``Q = x5 + x6`` has the
    representations ``(y3 - y4)/2``, ``y2 + y5`` and ``y1 - y6 + y7/2``.

    >>> h = GreedyHistory(9)
    >>> rows = [[0, 1, 0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1, 1],
    ...         [0, 0, 0, 0, 4, 2, 0, 0, 0], [0, 0, 0, 0, 2, 0, 0, 0, 0],
    ...         [0, 0, 0, 0, 1, 1, 0, -1, -1], [0, 1, 0, 0, 0, 0, 0, 0, 0],
    ...         [0, 0, 0, 0, 0, 2, 0, 0, 0]]
    >>> for row, a in zip(rows, [0.05, 0.1, 0.05, 0.1, 0.1, 0.05, 0.05]):
    ...     h.append(LinearQuery.from_dense(row), a, 0.0)
    >>> q = LinearQuery.from_dense([0, 0, 0, 0, 1, 1, 0, 0, 0])
    >>> [(o.rows.tolist(), o.weights.round(9).tolist()) for o in h.find(q)]
    [([2, 3], [0.5, -0.5]), ([1, 4], [1.0, 1.0]), ([0, 5, 6], [1.0, -1.0, 0.5])]
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._queries: list[LinearQuery] = []
        self._dense = np.zeros((16, n))
        self._alpha: list[float] = []
        self._y: list[float] = []
        self._all = _Basis(n)  # every row, in order: the first scan of every query
        self._found: dict[bytes, list[Observation]] = {}  # by query, until a row is appended

    @property
    def size(self) -> int:
        """The number of rows ``m``."""
        return len(self._queries)

    def append(self, query: LinearQuery, alpha: float, y: float) -> None:
        """Add a measured row."""
        m = self.size
        if m == self._dense.shape[0]:
            self._dense = np.concatenate([self._dense, np.zeros_like(self._dense)])
        self._dense[m, query.cells] = query.weights
        self._queries.append(query)
        self._alpha.append(alpha)
        self._y.append(y)
        self._all.add(m, query, self._dense[m])
        self._found.clear()

    def find(self, query: LinearQuery) -> list[Observation]:
        """Alg. 2: the greedy linear representations of ``query``, in the order found."""
        key = query.cells.tobytes() + query.weights.tobytes()
        if key not in self._found:
            self._found[key] = self._find(query)
        return self._found[key]

    def _find(self, query: LinearQuery) -> list[Observation]:
        m = self.size
        q = query.to_dense()
        q_norm = float(np.linalg.norm(q))
        first = self._first_prefix(q, q_norm)
        if first is None:
            return []
        observations: list[Observation] = []
        zeroed: set[int] = set()
        basis = self._all
        k: int = first[0]
        count: int | None = first[1]  # the first scan uses a prefix of the whole basis
        while True:
            t = basis.representation(q, m, count)
            (rows,) = np.nonzero(t)
            if rows.size == 0 or np.linalg.norm(t[rows] @ self._dense[rows] - q) > 1e-7 * q_norm:
                break  # rounding defeated the representation: stop here
            observations.append(self._observation(rows, t[rows]))
            zeroed.update(rows.tolist())
            basis = self._without(basis, int(rows.min()), zeroed, k)
            found = self._next_prefix(basis, q, q_norm, k + 1)
            if found is None:
                break
            k, count = found, None
        return observations

    def _first_prefix(self, q: FloatArray, q_norm: float) -> tuple[int, int] | None:
        """The least ``k`` with ``Q`` in the span of ``H(1:k)`` (no row zeroed yet).

        Returns ``k`` and the number of basis vectors of that prefix.
        """
        basis = self._all
        r = basis.rank
        if r == 0:
            return None
        coefficients = basis.E[:r] @ q
        residuals = q - np.cumsum(coefficients[:, None] * basis.E[:r], axis=0)
        spanned = np.nonzero(np.linalg.norm(residuals, axis=1) <= _SPANNED * q_norm)[0]
        if spanned.size == 0:
            return None
        return basis.owners[int(spanned[0])], int(spanned[0]) + 1

    def _without(self, basis: _Basis, first: int, zeroed: set[int], k: int) -> _Basis:
        """The basis of the rows up to ``k`` that are not ``zeroed`` (``first``: the least
        row zeroed just now; the basis before it stands)."""
        keep = bisect.bisect_left(basis.owners, first)
        rebuilt = basis.prefix(keep)
        for j in range(first + 1, k + 1):
            if j not in zeroed:
                rebuilt.add(j, self._queries[j], self._dense[j])
        return rebuilt

    def _next_prefix(self, basis: _Basis, q: FloatArray, q_norm: float, start: int) -> int | None:
        """Continue the scan at ``start``: the next ``k`` whose prefix spans ``Q`` again."""
        for k in range(start, self.size):
            grew = basis.add(k, self._queries[k], self._dense[k])
            if (grew or k == start) and basis.spans(q, q_norm):
                return k
        return None

    def _observation(self, rows: npt.NDArray[np.int64], weights: FloatArray) -> Observation:
        alpha = np.asarray(self._alpha)[rows]
        sensitivity = np.array([self._queries[j].sensitivity for j in rows])
        value = float(weights @ np.asarray(self._y)[rows])
        return Observation(
            rows.astype(np.int64), weights, value, np.abs(weights) * sensitivity / alpha
        )


def posterior(
    observations: Sequence[Observation],
    delta: float,
    *,
    step: float = 1.0,
    gamma: float = 0.01,
) -> tuple[float, float, float] | None:
    """Posterior mean and ``1 - delta`` credible interval of ``theta`` (Alg. 3, 4 and 6).

    Returns ``None`` when the truncated likelihoods share no support.

    >>> obs = Observation(np.array([0]), np.array([1.0]), 100.0, np.array([10.0]))
    >>> estimate, low, high = posterior([obs], 0.2)
    >>> round(estimate, 9), low, high  # one Laplace observation: 10 ln 5 = 16.1 a side
    (100.0, 84.0, 115.0)
    """
    pmfs = [_pmf(o.scales.tobytes(), gamma, step) for o in observations]
    halves = [(p.size - 1) // 2 for p in pmfs]
    low_end = max(o.value - (h + 0.5) * step for o, h in zip(observations, halves))
    high_end = min(o.value + (h + 0.5) * step for o, h in zip(observations, halves))
    if low_end >= high_end:
        return None
    anchor = min(range(len(pmfs)), key=lambda i: pmfs[i].size)  # grid on its bin centres
    offset = observations[anchor].value
    first = math.ceil((low_end - offset) / step)
    last = math.floor((high_end - offset) / step)
    grid = offset + step * np.arange(first, last + 1)
    log_density = np.zeros(grid.size)
    for o, pmf, half in zip(observations, pmfs, halves):
        position = (o.value - grid) / step + half
        mass = np.interp(position, np.arange(pmf.size), pmf, left=0.0, right=0.0)
        log_density += np.log(np.maximum(mass, 1e-300))
    weights = np.exp(log_density - log_density.max())
    weights /= weights.sum()
    estimate = float(weights @ grid)
    lo, hi = _credible_bins(weights, int(np.argmin(np.abs(grid - estimate))), 1.0 - delta)
    return estimate, float(grid[lo]), float(grid[hi])


@functools.lru_cache(maxsize=256)
def _pmf(scales: bytes, gamma: float, step: float) -> FloatArray:
    """Alg. 6 for one observation (cached: a repeated query brings the same observations)."""
    pmf = ConvolutionTail(gamma=gamma, step=step).pmf(np.frombuffer(scales))
    pmf.flags.writeable = False
    return pmf


def _credible_bins(mass: FloatArray, start: int, level: float) -> tuple[int, int]:
    """Alg. 4: grow ``[lo, hi]`` from ``start``, each time by the more probable neighbour."""
    values = mass.tolist()
    lo = hi = start
    held = values[start]
    last = len(values) - 1
    while held < level and (lo > 0 or hi < last):
        left = values[lo - 1] if lo > 0 else -1.0
        right = values[hi + 1] if hi < last else -1.0
        if left >= right:
            lo -= 1
            held += left
        else:
            hi += 1
            held += right
    return lo, hi
