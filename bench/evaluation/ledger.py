"""Per-cell privacy cost for the baselines: the papers' Thm 3.8 in floating point.

Measuring ``H_i`` with budget ``alpha_i`` costs cell ``j`` ``alpha_i |H_ij| / S_i``; costs add up
per cell and the system has spent ``alpha_bar = max_j B_j``. dpproxy keeps the same ledger in
exact fractions (:mod:`proxy.engine.budget`); the baselines use this float version, with a
relative slack of 1e-12 so that a budget spent to the last digit still fits.
"""

from __future__ import annotations

import numpy as np

from sqlmap.vector import LinearQuery

__all__ = ["CellLedger"]

_SLACK = 1e-12


class CellLedger:
    """``B_j`` per cell against a total (``None``: unbounded, only measured).

    >>> ledger = CellLedger(3, total=1.0)
    >>> q = LinearQuery.from_dense([2.0, 1.0, 0.0])
    >>> ledger.charge(q, 0.5)
    >>> ledger.spent, ledger.fits(q, 0.5), ledger.fits(q, 0.6)
    (0.5, True, False)
    """

    def __init__(self, n: int, total: float | None) -> None:
        self.total = total
        self._spent = np.zeros(n)

    @property
    def spent(self) -> float:
        """``alpha_bar = max_j B_j``."""
        return float(self._spent.max(initial=0.0))

    def fits(self, query: LinearQuery, alpha: float) -> bool:
        """Whether measuring ``query`` with ``alpha`` keeps every cell within the total."""
        if self.total is None:
            return True
        after = self._spent[query.cells] + alpha * np.abs(query.weights) / query.sensitivity
        return bool(after.max(initial=0.0) <= self.total * (1 + _SLACK))

    def charge(self, query: LinearQuery, alpha: float) -> None:
        """Add the cost of measuring ``query`` with ``alpha`` (check :meth:`fits` first)."""
        self._spent[query.cells] += alpha * np.abs(query.weights) / query.sensitivity
